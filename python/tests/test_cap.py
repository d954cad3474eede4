"""The cap inside Python workers: under mem_limit on a GPU, libisorun_cuda_cap.so is preloaded
into the worker, so what the function allocates through the CUDA driver is refused past the cap.
Without a GPU this runs on the simulated inventory with the stand-in libcuda.so.1 of the C++
tests (tests/helpers/fake_cuda.cpp)."""

from __future__ import annotations

import os
import sys

import pytest

import isorun

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from driver_alloc import allocate_until_refused  # noqa: E402 - the helpers folder first

FAKE_CUDA_DIR = os.environ.get("ISORUN_TEST_FAKE_CUDA_DIR", "")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")),
                                reason="the stand-in libcuda.so.1 (ISORUN_TEST_FAKE_CUDA_DIR) is not built")
MiB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2


def raise_memory_error_when_refused(block_mib):
    blocks, rc = allocate_until_refused(block_mib)
    raise MemoryError(f"CUDA out of memory after {blocks} blocks (error {rc})")


def capped(fn, **options):
    return isorun.isolated(fn, gpu=0, mem_limit="1G", env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR}, **options)


def test_driver_allocations_past_the_cap_get_out_of_memory():
    res = capped(allocate_until_refused).try_call(256)
    assert res.ok, res.outcome.describe()
    blocks, rc = res.value
    assert rc == CUDA_ERROR_OUT_OF_MEMORY
    assert 1 <= blocks <= 4  # 1 GiB of 256 MiB blocks, less what the context is charged
    cap = res.outcome.driver_cap
    assert cap["limit"] == 1 << 30 and cap["refusals"] == 1 and cap["largest_refused"] == 256 * MiB
    assert blocks * 256 * MiB <= cap["peak"] <= 1 << 30


def test_the_framework_s_own_error_after_a_refusal_is_out_of_memory():
    with pytest.raises(isorun.OutOfMemory, match="mem_limit") as info:
        capped(raise_memory_error_when_refused)(128)
    assert isinstance(info.value, MemoryError)
    assert info.value.outcome.kind == "out_of_memory"
    assert isinstance(info.value.__cause__, MemoryError)


def test_without_the_cap_the_whole_device_is_there():
    res = isorun.isolated(allocate_until_refused, gpu=0, env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR}).try_call(1024)
    assert res.outcome.driver_cap is None
    blocks, rc = res.value
    assert blocks > 1  # past 1 GiB: the stand-in's own memory ends it


def test_a_standby_interpreter_is_capped_for_its_call():
    f = capped(allocate_until_refused, standby=1)
    f.warm_up()
    for _ in range(2):  # each call its own cap: the first call's memory is not the second's
        res = f.try_call(256)
        blocks, rc = res.value
        assert rc == CUDA_ERROR_OUT_OF_MEMORY and 1 <= blocks <= 4
        assert res.outcome.driver_cap["refusals"] == 1


def preloaded_then_allocate(block_mib):
    import device_preload

    return device_preload.rc, allocate_until_refused(block_mib)


def test_what_a_preload_allocates_before_the_call_is_charged_to_the_call_s_cap():
    # A framework preloaded into a standby interpreter allocates before the call's region exists:
    # within the cap it was launched with, and then counted against the call's.
    f = capped(preloaded_then_allocate, standby=1, preload=["device_preload"])
    f.warm_up()
    res = f.try_call(256)
    assert res.ok, res.outcome.describe()
    preload_rc, (blocks, rc) = res.value
    assert preload_rc == 0
    assert rc == CUDA_ERROR_OUT_OF_MEMORY and blocks == 3  # 1 GiB, less the preload's 256 MiB
    cap = res.outcome.driver_cap
    assert cap["refusals"] == 1 and cap["peak"] == 1 << 30


# A child that allocates 64 MiB blocks through the driver until one is refused, says how many, and
# holds them until its stdin closes: children alive together show whether they share one cap.
HOLDER = ("import sys, driver_alloc; n, rc = driver_alloc.allocate_until_refused(64); print(n, flush=True); "
          "sys.stdin.read()")


def children_with_a_clean_environment(count, fake_cuda_dir):
    import subprocess

    import driver_alloc

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": fake_cuda_dir,
           "PYTHONPATH": os.path.dirname(driver_alloc.__file__), "PYTHONDONTWRITEBYTECODE": "1"}
    kids = [subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True) for _ in range(count)]
    blocks = [int(k.stdout.readline() or -1) for k in kids]
    for k in kids:
        k.stdin.close()
        k.wait()
    return blocks


@pytest.mark.parametrize("standby", [0, 1])
def test_children_started_with_a_clean_environment_before_any_cuda_call_share_the_call_s_cap(standby):
    # The region comes with the call; it is pinned before the function runs, so a child the
    # function starts with an environment of its own (as a launcher does) gets it too.
    f = isorun.isolated(children_with_a_clean_environment, gpu=0, mem_limit="256M",
                        env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR}, standby=standby)
    if standby:
        f.warm_up()
    res = f.try_call(3, FAKE_CUDA_DIR)
    assert res.ok, res.outcome.describe()
    assert min(res.value) >= 0 and sum(res.value) <= 4, res.value  # 256 MiB among the three, not each
    assert res.outcome.driver_cap["peak"] >= sum(res.value) * 64 * MiB > 0


def forge_terms_then_allocate(block_mib):
    # The function names sealed terms of its own (a limit of 2^62) before its first CUDA call.
    import fcntl
    import struct

    def memfd(data, size, seals):
        fd = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        os.pwrite(fd, data, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return f"/proc/{os.getpid()}/fd/{fd}"

    terms = struct.pack("<QQQQ", 0x345441434E555249, 1 << 62, 16, 0)
    os.environ["ISORUN_CAP_TERMS"] = memfd(terms, 32, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK)
    os.environ["ISORUN_CAP_REGION"] = memfd(struct.pack("<Q", 0x344C41434E555249), 1 << 20, fcntl.F_SEAL_SHRINK)
    return allocate_until_refused(block_mib)


def test_the_function_cannot_swap_in_terms_of_its_own():
    res = isorun.isolated(forge_terms_then_allocate, gpu=0, mem_limit="256M",
                          env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR}).try_call(64)
    assert res.ok, res.outcome.describe()
    blocks, rc = res.value
    assert rc == CUDA_ERROR_OUT_OF_MEMORY and blocks <= 4
    assert res.outcome.driver_cap["refusals"] == 1 and res.outcome.driver_cap["peak"] > 0
