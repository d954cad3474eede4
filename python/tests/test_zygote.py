"""start="zygote": each worker forked from one interpreter that imported the preloads and never
initialized CUDA, then made this process's child in a cgroup of its own, with its GPU, its cap and
its environment; each still serves exactly one call."""

from __future__ import annotations

import concurrent.futures
import os
import sys

import pytest

import isorun

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
sys.path.insert(0, HELPERS)
from driver_alloc import allocate_until_refused  # noqa: E402 - the helpers folder first

FAKE_CUDA_DIR = os.environ.get("ISORUN_TEST_FAKE_CUDA_DIR", "")
needs_fake_cuda = pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")),
                                     reason="the stand-in libcuda.so.1 (ISORUN_TEST_FAKE_CUDA_DIR) is not built")
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_PERMITTED = 800


@pytest.fixture(autouse=True)
def helpers_on_path(monkeypatch):
    """zygote_probe is importable here, from this process's sys.path."""
    monkeypatch.syspath_prepend(HELPERS)


def state():
    import zygote_probe

    import isorun._worker as worker

    zygote_probe.counter += 1  # a module-level global, changed by every call
    return {"pid": os.getpid(), "ppid": os.getppid(), "imported_by": zygote_probe.imported_by,
            "counter": zygote_probe.counter, "at_entry": "zygote_probe" in worker.modules_at_entry,
            "pgid": os.getpgid(0), "threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "zygote_var": os.environ.get("ISORUN_CAP_ZYGOTE"), "preload": os.environ.get("LD_PRELOAD", "")}


def test_start_takes_auto_exec_or_zygote():
    with pytest.raises(isorun.UsageError, match="start takes 'auto'.*'exec'.*'zygote'.*'fork'"):
        isorun.isolated(state, start="fork")
    with pytest.raises(isorun.UsageError, match="start takes"):
        isorun.Executor(cpu_slots=1, start=None)
    with pytest.raises(isorun.UsageError, match="warm_context"):
        isorun.isolated(state, gpu=0, start="zygote", warm_context=True)


def test_each_call_is_forked_from_one_zygote_and_sees_none_of_the_calls_before_it():
    f = isorun.isolated(state, start="zygote", standby=1, preload=["zygote_probe"])
    f.warm_up()
    runs = [f() for _ in range(3)]
    zygotes = {r["imported_by"] for r in runs}
    assert len(zygotes) == 1  # one zygote imported the preload, once
    assert all(r["at_entry"] for r in runs)
    assert len({r["pid"] for r in runs}) == 3  # each call a process of its own...
    for r in runs:
        assert r["pid"] not in zygotes  # ...forked, not the zygote itself
        assert r["ppid"] == os.getpid()  # this process's child, reaped by it
        assert r["pgid"] == r["pid"]  # leading its own process group
        assert r["counter"] == 1  # forked from the pristine zygote, not from a used worker
        assert r["zygote_var"] is None
        assert "libisorun_cuda_cap" not in r["preload"]  # no cap: the library was the zygote's alone


def random_draws():
    import random

    import numpy as np

    return np.random.randint(1 << 62), random.getrandbits(62)


def collected() -> dict:
    """What a full garbage collection in this worker looks at: the objects it traverses, and the
    ones it leaves alone (frozen)."""
    import gc

    gc.collect()
    return {"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}


def test_a_forked_worker_s_collections_leave_the_zygote_s_objects_alone():
    # A full collection writes each object it traverses: in a forked child, that copies every page
    # holding one of the zygote's objects. The zygote freezes them before it forks.
    f = isorun.isolated(collected, start="zygote", standby=1, preload=["json"])
    f.warm_up()
    forked = f()
    assert forked["frozen"] > 10_000 and forked["tracked"] < forked["frozen"] / 2
    execd = isorun.isolated(collected, start="exec")()
    assert execd["frozen"] == 0


def test_siblings_do_not_share_random_state():
    f = isorun.isolated(random_draws, start="zygote", standby=2, preload=["numpy"])
    f.warm_up()
    a, b = f(), f()
    assert a[0] != b[0] and a[1] != b[1]


def wait_for_the_test(ready_path, go_path):
    """Says its pid through one FIFO and waits on another: the test looks at it while it runs."""
    import zygote_probe

    with open(ready_path, "w") as ready:
        ready.write(str(os.getpid()))
    with open(go_path) as go:
        go.read()
    return os.getpid(), zygote_probe.imported_by != os.getpid()


def _cgroup_of(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return [line for line in f.read().splitlines() if line.startswith("0::")][0][3:]


def test_each_worker_is_born_in_a_cgroup_of_its_own(tmp_path):
    mine = _cgroup_of(os.getpid())
    options = dict(start="zygote", preload=["zygote_probe"], cpus_per_call=1)
    isorun.isolated(wait_for_the_test, **options).warm_up()  # the executor's zygote, ready
    with isorun.Executor(cpu_slots=2, **options) as ex:
        fifos = []
        for i in range(2):
            ready, go = tmp_path / f"ready{i}", tmp_path / f"go{i}"
            os.mkfifo(ready)
            os.mkfifo(go)
            fifos.append((ready, go))
        futures = [ex.submit(wait_for_the_test, str(r), str(g)) for r, g in fifos]
        seen = []
        for ready, go in fifos:
            with open(ready) as f:
                pid = int(f.read())
            seen.append((pid, _cgroup_of(pid)))
            with open(go, "w"):
                pass
        results = [f.result() for f in futures]
        assert sorted(pid for pid, _ in results) == sorted(pid for pid, _ in seen)
        assert all(forked for _, forked in results)
    cgroups = [c for _, c in seen]
    if not any(c != mine for c in cgroups):
        pytest.skip("no cgroup containment here (workers share this process's cgroup)")
    assert len(set(cgroups)) == 2 and mine not in cgroups  # one each, neither the caller's
    for c in cgroups:
        assert c.startswith(os.path.dirname(mine))  # under isorun's own


def exit_with(code):
    os._exit(code)


def test_a_forked_worker_s_end_is_reaped_and_reported_as_an_exec_d_one_s():
    f = isorun.isolated(exit_with, start="zygote")
    f.warm_up()
    with pytest.raises(isorun.WorkerExited) as info:
        f(7)
    assert info.value.exit_code == 7


def cuda_after_the_zygote():
    import ctypes

    import zygote_probe

    return zygote_probe.cuda_init_rc, zygote_probe.imported_by, ctypes.CDLL("libcuda.so.1").cuInit(0), os.getpid()


@needs_fake_cuda
@pytest.mark.parametrize("mem_limit", [None, "1G"])
def test_the_zygote_never_initializes_cuda_and_its_child_does(mem_limit):
    f = isorun.isolated(cuda_after_the_zygote, gpu=0, mem_limit=mem_limit, start="zygote", preload=["zygote_probe"],
                        env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR, "ISORUN_TEST_CUDA_IN_ZYGOTE": "1"},
                        capture_output=True)
    f.warm_up()  # the zygote is ready: the call is forked (before, it would get an exec'd worker)
    res = f.try_call()
    assert res.ok, res.outcome.describe()
    in_zygote, zygote, in_child, child = res.value
    assert zygote != child
    assert in_zygote == CUDA_ERROR_NOT_PERMITTED  # refused by the cap library in the zygote
    assert in_child == 0  # the child, given its GPU, may


def raise_memory_error_when_refused(block_mib):
    blocks, rc = allocate_until_refused(block_mib)
    raise MemoryError(f"CUDA out of memory after {blocks} blocks (error {rc})")


@needs_fake_cuda
def test_each_forked_worker_has_its_own_cap():
    opts = dict(gpu=0, mem_limit="1G", env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR}, start="zygote")
    over = isorun.isolated(raise_memory_error_when_refused, **opts)
    within = isorun.isolated(allocate_until_refused, **opts)
    over.warm_up()
    within.warm_up()
    with pytest.raises(isorun.OutOfMemory):
        over(128)
    for _ in range(2):  # a sibling after it has the whole cap, each time
        res = within.try_call(256)
        assert res.ok, res.outcome.describe()
        blocks, rc = res.value
        assert rc == CUDA_ERROR_OUT_OF_MEMORY and 1 <= blocks <= 4
        assert res.outcome.driver_cap["limit"] == 1 << 30 and res.outcome.driver_cap["refusals"] == 1


@needs_fake_cuda
def test_a_forked_worker_without_a_cap_has_the_whole_device():
    f = isorun.isolated(allocate_until_refused, gpu=0, env={"LD_LIBRARY_PATH": FAKE_CUDA_DIR}, start="zygote")
    f.warm_up()
    res = f.try_call(1024)
    assert res.ok, res.outcome.describe()
    assert res.outcome.driver_cap is None
    blocks, _rc = res.value
    assert blocks > 1  # past 1 GiB: the cap library steps aside in an uncapped child


def square(x):
    return x * x


def test_an_executor_of_forked_workers_runs_back_to_back_calls():
    with isorun.Executor(cpu_slots=2, standby=2, preload=["numpy"], start="zygote") as ex:
        futures = [ex.submit(square, i) for i in range(40)]
        assert [f.result() for f in futures] == [i * i for i in range(40)]
        assert sorted(ex.map(square, range(5))) == [0, 1, 4, 9, 16]
    done, _ = concurrent.futures.wait(futures)
    assert len(done) == 40


def importer():
    import thread_starter

    return os.getpid(), thread_starter.imported_by


def test_a_zygote_whose_preload_started_a_thread_does_not_fork_and_workers_are_exec_d(capfd):
    f = isorun.isolated(importer, start="zygote", preload=["thread_starter"])
    f.warm_up()  # the zygote says it is ready, with 2 threads: it is not used
    for _ in range(2):
        pid, imported_by = f()
        assert imported_by == pid  # an exec'd worker, which imported the preload itself
    err = capfd.readouterr().err
    assert "the zygote cannot fork workers (it runs 2 threads" in err and "exec'd instead" in err
    assert err.count("cannot fork") == 1  # said once


def _wait_gone(pid_fd: int) -> None:
    """Blocks until the process of `pid_fd` has ended (its pidfd turns readable)."""
    import select

    try:
        select.select([pid_fd], [], [])
    finally:
        os.close(pid_fd)


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


BLOCKING_CALLER = """
import os, sys, threading, isorun
def block(fifo):
    with open(fifo, "w") as f:
        f.write(str(os.getpid()))
    threading.Event().wait()
f = isorun.isolated(block, start="zygote", standby=1)
f.warm_up()
f.submit(sys.argv[1])
with open(sys.argv[1]) as fifo:
    running = fifo.read()  # the call took the waiting worker and runs in it
f.warm_up()  # returns once the pool's replacement is forked
os.write(1, running.encode() + b"\\n")
threading.Event().wait()
"""


def test_kill_9_of_the_caller_ends_the_zygote_and_every_forked_worker(tmp_path):
    import signal
    import subprocess

    fifo = tmp_path / "running"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c", BLOCKING_CALLER, str(fifo)], stdout=subprocess.PIPE, text=True,
                         env=os.environ.copy())
    try:
        running = int(p.stdout.readline())  # the zygote, this worker and a waiting one exist
        kids = _children_of(p.pid)
        assert running in kids and len(kids) >= 3
    except BaseException:
        p.kill()
        p.communicate()
        raise
    fds = []
    for pid in kids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    for fd in fds:
        _wait_gone(fd)  # each died with its supervisor (watchdog, parent-death signal, hang-up)


def leave_a_grandchild_and_block(path):
    import subprocess
    import threading

    child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"],
                             start_new_session=True)  # out of the worker's process group: its cgroup holds it
    with open(path, "w") as f:
        f.write(str(child.pid))
    threading.Event().wait()


def test_a_forked_worker_past_its_timeout_is_stopped_with_what_it_started(tmp_path):
    path = tmp_path / "grandchild"
    f = isorun.isolated(leave_a_grandchild_and_block, start="zygote", timeout=0.5, grace=0.1)
    f.warm_up()
    with pytest.raises(isorun.Timeout):
        f(str(path))
    grandchild = int(path.read_text())
    try:
        with open(f"/proc/{grandchild}/stat") as s:
            state = s.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return  # gone and reaped
    if state == "Z":
        return  # killed, not yet reaped by its new parent
    contained = _cgroup_of(grandchild) != _cgroup_of(os.getpid())
    os.kill(grandchild, 9)  # (left behind either way: not by this test)
    if not contained:
        pytest.skip("no cgroup containment here: a process that left the group outlives the worker")
    pytest.fail(f"the grandchild outlived its worker's cgroup (state {state})")


def thread_vars():
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS")
    return [os.environ.get(n) for n in names]


def test_a_forked_worker_gets_its_share_of_the_cores_back_in_its_thread_limits():
    # (The zygote imported its preloads with one thread; each worker has its own share again.)
    share = min(2, len(os.sched_getaffinity(0)))
    f = isorun.isolated(thread_vars, start="zygote", preload=["zygote_probe"], cpus_per_call=share)
    f.warm_up()
    assert f() == [str(share)] * 5
    f = isorun.isolated(thread_vars, start="zygote", env={"OMP_NUM_THREADS": "3"})
    f.warm_up()
    assert f() == ["3"] * 5


def eat(mib):
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return len(block) >> 20


def test_a_forked_worker_past_its_host_memory_cap_ends_out_of_memory_and_its_sibling_does_not():
    f = isorun.isolated(eat, host_mem_limit="64M", start="zygote", preload=["numpy"])
    try:
        f.warm_up()
        res = f.try_call(512)
    except isorun.UsageError as e:
        pytest.skip(f"no cgroup can enforce a host memory cap here: {e}")
    assert res.outcome.kind == "out_of_memory" and "host_mem_limit" in res.outcome.message
    assert f(16) == 16  # a sibling, under the same cap, from the same zygote


def nothing():
    return None


def test_what_a_preload_printed_in_the_zygote_is_not_printed_again_by_each_worker():
    f = isorun.isolated(nothing, start="zygote", preload=["zygote_probe"], capture_output=True,
                        env={"ISORUN_TEST_PRINT_IN_ZYGOTE": "1"})
    f.warm_up()
    for _ in range(2):
        res = f.try_call()
        assert res.ok and "printed by the zygote" not in res.outcome.stdout


def test_a_zygote_stuck_in_an_import_holds_up_no_call_and_stops_with_its_pool():
    # The calls get exec'd workers while the zygote is not ready: they meet the same import, and
    # their timeout holds. The pool's filler waits for the zygote; stopping the pool ends that wait.
    f = isorun.isolated(nothing, start="zygote", standby=1, preload=["hangs_at_import"], timeout=0.5, grace=0.1)
    with pytest.raises(isorun.Timeout):
        f()
    isorun.stop_standby()
