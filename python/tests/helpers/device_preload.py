"""A module whose import allocates on the device through the driver, as a framework warming up
would (its context and a first block of 256 MiB), and keeps it: preloaded into a standby
interpreter under a cap, before the call's region exists."""

import ctypes

_cuda = ctypes.CDLL("libcuda.so.1")
assert _cuda.cuInit(0) == 0
_ctx = ctypes.c_void_p()
assert _cuda.cuDevicePrimaryCtxRetain(ctypes.byref(_ctx), 0) == 0
assert _cuda.cuCtxSetCurrent(_ctx) == 0
held = ctypes.c_ulonglong()
rc = _cuda.cuMemAlloc_v2(ctypes.byref(held), ctypes.c_size_t(256 << 20))
