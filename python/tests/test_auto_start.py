"""start="auto", the default: from the end of a first call, workers forked from a zygote that
imported the function's module and the packages it names, one kept waiting; each call still in a
process no call ran in before, seeing nothing of the calls before it; the pool stopped after idle
seconds and gone with the caller however it ends."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading

import pytest

import isorun

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
sys.path.insert(0, HELPERS)
import zygote_probe  # noqa: E402,F401 - imported by this module, which the default preloads for state()

FAKE_CUDA_DIR = os.environ.get("ISORUN_TEST_FAKE_CUDA_DIR", "")
CUDA_ERROR_NOT_PERMITTED = 800
_left_open = None  # a file a call opened and kept


@pytest.fixture(autouse=True)
def fresh_pools(monkeypatch):
    """Each test meets no pool of an earlier one, and its own idle seconds."""
    monkeypatch.syspath_prepend(HELPERS)
    isorun.stop_standby()
    yield
    isorun.stop_standby()


def state():
    global _left_open
    import zygote_probe

    seen = {"env": os.environ.get("ISORUN_TEST_LEFT_BY_A_CALL"),
            "threads": [t.name for t in threading.enumerate() if t.name == "left-by-a-call"],
            "file": _left_open is not None, "counter": zygote_probe.counter + 1}
    zygote_probe.counter += 1
    os.environ["ISORUN_TEST_LEFT_BY_A_CALL"] = "1"
    threading.Thread(target=threading.Event().wait, name="left-by-a-call", daemon=True).start()
    _left_open = open(os.devnull)
    return {**seen, "pid": os.getpid(), "ppid": os.getppid(), "imported_by": zygote_probe.imported_by}


def _wait_gone(pids: list[int]) -> None:
    """Blocks until each of `pids` has ended (its pidfd turns readable)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)


def _pool_of(preload: str) -> isorun.PoolStats:
    (pool,) = [p for p in isorun.pool_stats() if preload in p.preload]
    return pool


def test_from_the_second_call_on_each_is_forked_and_sees_nothing_of_the_calls_before_it():
    f = isorun.isolated(state)  # no start option: the default
    first = f()
    assert first["imported_by"] == first["pid"]  # exec'd: it imported the module itself
    f.warm_up()  # (the pool started once the first call ended; this waits for its worker)
    runs = [f() for _ in range(3)]
    for r in [first] + runs:
        assert r == {**r, "env": None, "threads": [], "file": False, "counter": 1}, r
        assert r["ppid"] == os.getpid()  # this process's child, reaped by it
    zygotes = {r["imported_by"] for r in runs}
    assert len(zygotes) == 1 and first["pid"] not in zygotes  # one zygote imported the module, once
    assert len({r["pid"] for r in [first] + runs}) == 4 and not zygotes & {r["pid"] for r in runs}
    f.warm_up()  # (the last call's replacement is forked once its worker has exited)
    pool = _pool_of(state.__module__)
    assert pool.start == "zygote" and pool.adaptive and not pool.dormant
    # The first call missed; the one after warm_up() found its worker waiting; a call right behind
    # another may find the next one still forking (a miss, forked from the zygote all the same).
    assert pool.hits + pool.misses == 4 and pool.hits >= 1
    assert pool.pids[0] in zygotes and len(pool.pids) == 2  # the zygote and one waiting worker
    assert pool.rss_bytes > 0


def test_an_idle_pool_stops_its_zygote_and_its_waiting_worker_and_the_next_call_starts_it_again(monkeypatch):
    monkeypatch.setenv(isorun._api.IDLE_ENV, "2")
    f = isorun.isolated(state)
    f()
    f.warm_up()
    held = _pool_of(state.__module__).pids
    assert len(held) == 2
    _wait_gone(list(held))  # stopped after 2 s without a call
    pool = _pool_of(state.__module__)
    assert pool.dormant and pool.pids == ()
    again = f()  # exec'd, as a first call
    assert again["imported_by"] == again["pid"] and again["counter"] == 1
    f.warm_up()
    assert _pool_of(state.__module__).pids[0] not in held  # a new zygote


def held_until_told(fifo: str | None = None) -> int:
    if fifo is None:
        return 0
    with open(fifo) as told:  # (the caller's open for writing returns once this one has opened)
        return int(told.read())


def test_a_call_s_replacement_is_forked_after_its_exit_unless_warm_up_asks_for_it_now(tmp_path):
    go = str(tmp_path / "go")
    os.mkfifo(go)
    f = isorun.isolated(held_until_told)
    f()
    f.warm_up()
    zygote, waiting = _pool_of(held_until_told.__module__).pids
    future = f.submit(go)
    with open(go, "w") as tell:  # the call runs now
        assert future.pid == waiting
        # A fork is ready long before the next spaced call: none competes with this one for a core.
        assert _pool_of(held_until_told.__module__).pids == (zygote,)
        f.warm_up()  # does not wait for the call's end
        assert _pool_of(held_until_told.__module__).pids[0] == zygote
        replacement = _pool_of(held_until_told.__module__).pids[1]
        assert replacement != waiting
        tell.write("7")
    assert future.result() == 7


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_a_bad_idle_time_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(isorun._api.IDLE_ENV, value)
    with pytest.raises(isorun.UsageError, match="ISORUN_IDLE"):
        isorun.isolated(state)()


def test_start_exec_keeps_an_exec_per_call_and_no_pool():
    f = isorun.isolated(state, start="exec")
    runs = [f() for _ in range(2)]
    assert all(r["imported_by"] == r["pid"] for r in runs)
    assert isorun.pool_stats() == []


EARLY = """
import sys, isorun
sys.path.insert(0, sys.argv[1])
import zygote_probe
def probe(i, size):
    print("printed by call", i, flush=False)  # flushed by the worker before it reports
    zygote_probe.counter += 1
    return zygote_probe.counter, b"x" * size
f = isorun.isolated(probe)
for i, size in enumerate([10, 10, 10, 1 << 20, 10]):
    r = f.try_call(i, size)
    counter, data = r.value
    print("returned", i, counter, len(data), r.outcome.exit_pending, flush=True)
"""


def test_a_small_result_comes_back_before_the_exit_and_the_output_before_it():
    # Output straight to fds 1 and 2 (not pytest's capture, which the forwarding path serves).
    out = subprocess.run([sys.executable, "-c", EARLY, HELPERS], stdout=subprocess.PIPE, text=True, check=True,
                         env={**os.environ, isorun._api.IDLE_ENV: "3600"}).stdout.splitlines()
    expected = []
    for i, size in enumerate([10, 10, 10, 1 << 20, 10]):
        # Handed over as the worker reports, unless too large for its report: that one waits for
        # the exit, its segment pooled unsealed. Every call fresh all the same.
        expected += [f"printed by call {i}", f"returned {i} 1 {size} {size < 16 << 10}"]
    assert out == expected


CALLER = """
import os, sys, threading, isorun
sys.path.insert(0, sys.argv[1])
import zygote_probe
def probe():
    return zygote_probe.imported_by
f = isorun.isolated(probe)
f()
f.warm_up()
(pool,) = isorun.pool_stats()
print(" ".join(map(str, pool.pids)), flush=True)
how = sys.stdin.readline().strip()
if how == "block":
    threading.Event().wait()
"""


@pytest.mark.parametrize("end", ["exit", "ctrl-c", "kill -9"])
def test_the_pool_is_gone_when_its_caller_ends(end):
    p = subprocess.Popen([sys.executable, "-c", CALLER, HELPERS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, isorun._api.IDLE_ENV: "3600"})
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 2  # the zygote and a waiting worker
        fds = [os.pidfd_open(pid) for pid in pids]
        if end == "exit":
            p.stdin.write("exit\n")
            p.stdin.flush()
        else:
            p.stdin.write("block\n")
            p.stdin.flush()
            p.send_signal(signal.SIGINT if end == "ctrl-c" else signal.SIGKILL)
        p.communicate()
    except BaseException:
        p.kill()
        p.communicate()
        raise
    for fd in fds:
        try:
            select.select([fd], [], [])  # each died with its supervisor
        finally:
            os.close(fd)


def cuda_after_the_zygote():
    import ctypes

    import zygote_probe

    return zygote_probe.cuda_init_rc, zygote_probe.imported_by, ctypes.CDLL("libcuda.so.1").cuInit(0), os.getpid()


@pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")),
                    reason="the stand-in libcuda.so.1 (ISORUN_TEST_FAKE_CUDA_DIR) is not built")
@pytest.mark.parametrize("mem_limit", [None, "1G"])
def test_a_module_that_initializes_cuda_at_import_does_not_in_the_default_s_zygote(mem_limit):
    f = isorun.isolated(cuda_after_the_zygote, gpu=0, mem_limit=mem_limit, capture_output=True,
                        env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR, "ISORUN_TEST_CUDA_IN_ZYGOTE": "1"})
    first = f.try_call()
    assert first.ok, first.outcome.describe()
    f.warm_up()
    res = f.try_call()
    assert res.ok, res.outcome.describe()
    in_zygote, zygote, in_child, child = res.value
    assert zygote != child  # forked
    assert in_zygote == CUDA_ERROR_NOT_PERMITTED  # the import's cuInit, refused in the zygote
    assert in_child == 0  # the call, given its GPU, may
