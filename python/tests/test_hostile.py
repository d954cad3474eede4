"""A function that turns on the shared memory its result travels in: what it does there costs the
caller nothing and can no longer crash it."""

from __future__ import annotations

import os

import pytest

import isorun

GiB = 1 << 30


def _segments() -> list[int]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "isorun-segment" in os.readlink(f"/proc/self/fd/{fd}"):
                out.append(int(fd))
        except OSError:
            pass
    return out


def grow_segments(size):
    """Grows every segment the worker holds (sparse: it costs the worker nothing), then returns a
    result too large to travel in the worker's report: it goes through the result segment."""
    for fd in _segments():
        os.ftruncate(fd, size)
    return list(range(100000))


def _peak_resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def _reset_peak_resident() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@pytest.mark.parametrize("early_result", [False, True])
def test_a_result_segment_grown_past_the_machine_s_memory_is_invalid_result(early_result):
    # Past this machine's memory whatever the machine: the default largest result.
    size = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") + 64 * GiB
    _reset_peak_resident()
    before = _peak_resident_kib()
    res = isorun.isolated(grow_segments, early_result=early_result).try_call(size)
    assert res.outcome.kind == "invalid_result"
    assert isinstance(res.exception, isorun.InvalidResult)
    assert f"segment grew to {size} bytes" in res.outcome.message
    assert _peak_resident_kib() < before + 64 * 1024  # mapped whole, it would have been all of it


def test_a_result_segment_grown_within_the_limit_costs_the_caller_only_its_result():
    _reset_peak_resident()
    before = _peak_resident_kib()
    assert isorun.isolated(grow_segments)(512 << 20) == list(range(100000))
    assert _peak_resident_kib() < before + 64 * 1024  # not the 512 MiB the worker left


def shrink_later(folder: str):
    """A NumPy result handed back as a view of its segment, and a child that leaves the worker's
    group, maps the segments writable (so the worker cannot seal its result) and, once the FIFO
    `folder`/go is opened, tries to shrink them all to nothing; it writes how many it shrank to
    the FIFO `folder`/report."""
    import mmap

    import numpy as np

    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        maps = [mmap.mmap(fd, 4096) for fd in _segments() if os.fstat(fd).st_size >= 4096]
        os.close(w)  # the worker's read returns
        with open(os.path.join(folder, "go")):  # blocks until the test opens it
            pass
        for m in maps:
            m.close()
        shrunk = 0
        for fd in _segments():
            try:
                os.ftruncate(fd, 0)
                shrunk += 1
            except OSError:
                pass
        with open(os.path.join(folder, "report"), "w") as f:
            f.write(str(shrunk))
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    return np.ones(64 << 20 >> 3)


def test_a_process_left_behind_cannot_shrink_the_numpy_result_the_caller_holds(monkeypatch, tmp_path):
    pytest.importorskip("numpy")
    monkeypatch.setenv("ISORUN_CONTAINMENT", "process-group")  # no cgroup kill: the child outlives the worker
    os.mkfifo(tmp_path / "go")
    os.mkfifo(tmp_path / "report")
    a = isorun.isolated(shrink_later)(str(tmp_path))
    assert a.sum() == 64 << 20 >> 3
    with open(tmp_path / "go", "w"):  # the child now tries to shrink every segment
        pass
    with open(tmp_path / "report") as f:
        assert f.read() == "0"
    assert a.sum() == 64 << 20 >> 3  # shrunk under it, this read would have killed the caller (SIGBUS)
