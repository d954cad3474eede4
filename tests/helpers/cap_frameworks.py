"""A framework allocating on GPU 0 until refused, run as `isorun --gpu 0 --mem-limit SIZE -- python3
cap_frameworks.py FRAMEWORK` by tools/gpu-check.sh: PyTorch with expandable segments (the
virtual-memory API), CuPy with its stream-ordered MemoryAsyncPool, or JAX (which sizes its
preallocation from the device's total). Prints one JSON line: what the framework got before its
own out-of-memory error, what NVML and nvidia-smi say of the device and of this process."""

import ctypes
import json
import os
import subprocess
import sys

BLOCK = 256 << 20


def torch_expandable():
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    held = []
    try:
        while True:
            held.append(torch.empty(BLOCK, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    return len(held) * BLOCK, torch.cuda.mem_get_info()[1]


def cupy_async():
    import cupy

    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    held = []
    try:
        while True:
            held.append(cupy.empty(BLOCK, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError:
        pass
    return len(held) * BLOCK, cupy.cuda.runtime.memGetInfo()[1]


def jax_prealloc():
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1024, 1024)) @ jnp.ones((1024, 1024))  # runs in what it preallocated
    x.block_until_ready()
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit", 0), stats.get("bytes_limit", 0)


def nvml_total():
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlInit_v2()
    device = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(int(os.environ.get("ISORUN_GPU", "0").split(",")[0]), ctypes.byref(device))
    memory = (ctypes.c_ulonglong * 3)()  # total, free, used
    nvml.nvmlDeviceGetMemoryInfo(device, memory)
    return memory[0], memory[2]


def smi():
    def query(what):
        return subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout
    total = int(query("gpu=memory.total").split()[0]) << 20
    mine = next((int(u) << 20 for p, u in (l.split(",") for l in query("compute-apps=pid,used_memory").splitlines()
                                            if l.strip()) if int(p) == os.getpid()), -1)
    return total, mine


if __name__ == "__main__":
    got, framework_total = {"torch-expandable": torch_expandable, "cupy-async": cupy_async,
                            "jax": jax_prealloc}[sys.argv[1]]()
    total, used = nvml_total()
    smi_total, smi_mine = smi()
    print(json.dumps({"framework": sys.argv[1], "got": got, "framework_total": framework_total, "nvml_total": total,
                      "nvml_used": used, "smi_total": smi_total, "smi_mine": smi_mine}))
