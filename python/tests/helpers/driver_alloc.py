"""Allocating through the CUDA driver API as a framework does, for the cap tests (the stand-in
libcuda.so.1 of the C++ tests where there is no GPU)."""

import ctypes


def allocate_until_refused(block_mib):
    """Allocates blocks of `block_mib` MiB on device 0 until one is refused; (blocks, error)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    held = []
    while True:
        ptr = ctypes.c_ulonglong()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(block_mib << 20))
        if rc != 0:
            return len(held), rc
        held.append(ptr.value)
