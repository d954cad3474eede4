"""The caller's memory: result segments go back to the pool once the result is dropped, and the
pool keeps at most max_idle_bytes of them (256 MiB unless set_segment_pool says otherwise, and
by default up to 2 GiB more for the idle seconds after their release)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

import isorun


def make_bytes(n):
    import pickle

    return pickle.PickleBuffer(bytearray(n))  # out of band: in the result segment itself


@pytest.fixture
def default_pool():
    yield
    isorun.set_segment_pool(max_idle_bytes=isorun._pool.DEFAULT_MAX_IDLE_BYTES)


def test_a_caller_keeps_at_most_256_mib_of_idle_segments_by_default():
    p = subprocess.run([sys.executable, "-c", "import isorun; print(isorun.segment_pool_stats()['max_idle_bytes'])"],
                       capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) == 256 << 20


def test_a_dropped_result_s_segment_goes_back_to_the_os_past_the_pool_s_limit(default_pool):
    size = 32 << 20
    isorun.set_segment_pool(max_idle_bytes="1G")
    result = isorun.isolated(make_bytes)(size)
    assert len(memoryview(result)) == size
    del result
    gc.collect()
    assert isorun.segment_pool_stats()["idle_bytes"] >= size  # kept for the next call
    isorun.set_segment_pool(max_idle_bytes="8M")
    assert isorun.segment_pool_stats() == {"idle_bytes": isorun.segment_pool_stats()["idle_bytes"],
                                           "max_idle_bytes": 8 << 20}
    assert isorun.segment_pool_stats()["idle_bytes"] <= 8 << 20  # closed at once
    result = isorun.isolated(make_bytes)(size)
    del result
    gc.collect()
    assert isorun.segment_pool_stats()["idle_bytes"] <= 8 << 20  # closed once dropped


LINGER = """
import gc, pickle, sys, time, isorun
def make_bytes(n):
    return pickle.PickleBuffer(bytearray(n))
size = 300 << 20  # past the 256 MiB kept for good
f = isorun.isolated(make_bytes)
for _ in range(2):
    r = f(size)
    assert len(memoryview(r)) == size
    del r
    gc.collect()
    print(isorun.segment_pool_stats()["idle_bytes"] >= size, flush=True)  # lingers for the next call
while isorun.segment_pool_stats()["idle_bytes"] > isorun._pool.DEFAULT_MAX_IDLE_BYTES:
    time.sleep(0.05)  # (the pool's thread closes it ISORUN_IDLE seconds after its release)
print("trimmed", flush=True)
"""


def test_a_large_result_s_segment_lingers_for_the_idle_seconds_then_goes_back_to_the_os():
    p = subprocess.run([sys.executable, "-c", LINGER], capture_output=True, text=True,
                       env={**os.environ, "ISORUN_IDLE": "1"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True", "trimmed"]


@pytest.mark.parametrize("bad", [-1, "lots", 1.5, None])
def test_set_segment_pool_refuses_what_is_not_a_size(bad):
    with pytest.raises(isorun.UsageError, match="max_idle_bytes|lots"):
        isorun.set_segment_pool(max_idle_bytes=bad)
