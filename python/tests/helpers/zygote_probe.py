"""Preloaded into a zygote in test_zygote.py: what it records at import is the zygote's, and what
a call changes here is that call's alone. With ISORUN_TEST_CUDA_IN_ZYGOTE set it also calls the
driver at import (through the stand-in libcuda.so.1), as a framework that initializes CUDA when
imported would: the zygote's cap library must refuse it."""

import os

imported_by = os.getpid()
counter = 0
cuda_init_rc = None
if os.environ.get("ISORUN_TEST_PRINT_IN_ZYGOTE"):
    print("printed by the zygote's preload")  # buffered: stdout is a pipe or a file
if os.environ.get("ISORUN_TEST_CUDA_IN_ZYGOTE"):
    import ctypes

    cuda_init_rc = ctypes.CDLL("libcuda.so.1").cuInit(0)
