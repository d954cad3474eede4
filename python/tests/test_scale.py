"""Calls in numbers: a queued call is a record and a running one a few descriptors of the process's
watcher, so thousands in flight cost no thread each; maps take their inputs lazily; a failure, a
closed iterator or Ctrl-C cancels what was queued and leaves nothing behind."""

from __future__ import annotations

import gc
import itertools
import os
import subprocess
import sys
import textwrap

import pytest

import isorun


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def wait_for(path):
    """Runs until the FIFO `path` is opened for writing (a call that lasts as long as the test wants)."""
    with open(path) as f:
        return f.read()


def square(x):
    return x * x


def test_thousands_of_queued_calls_cost_no_thread_each_and_are_cancelled_at_once(tmp_path):
    go = str(tmp_path / "go")
    os.mkfifo(go)
    before = _threads()
    with isorun.Executor(cpu_slots=1) as ex:
        running = ex.submit(wait_for, go)
        queued = [ex.submit(square, i) for i in range(2000)]
        assert ex.waiting >= 1999
        # The watcher's thread and the completer's: not one (or two) per call.
        assert _threads() <= before + 4
        ex.shutdown(wait=False, cancel_futures=True)
        assert ex.waiting == 0
        assert all(f.cancelled() for f in queued)
        with open(go, "w") as f:
            f.write("done")
        assert running.result() == "done"


def test_a_queued_call_s_future_is_small_and_cancelled_as_concurrent_futures_cancels(tmp_path):
    import concurrent.futures
    import threading
    import tracemalloc

    # An isolated future has every field a concurrent.futures.Future has (it makes its condition
    # on first use): Python's own wait() and as_completed() read them.
    assert set(vars(concurrent.futures.Future())) - {"_condition"} <= set(vars(isorun.isolated(square).submit(2)))
    go = str(tmp_path / "go")
    os.mkfifo(go)
    ex = isorun.Executor(cpu_slots=1)
    running = ex.submit(wait_for, go)
    try:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        plain = [ex.submit(square, i) for i in range(1000)]
        per_call = (tracemalloc.get_traced_memory()[0] - before) / len(plain)
        tracemalloc.stop()
        # (A concurrent.futures.Future alone is 1.7 KiB, most of it its Condition.)
        assert per_call < 1024
        called = []
        with_callback = [ex.submit(square, i) for i in range(10)]
        for f in with_callback:
            f.add_done_callback(called.append)
        waited = [ex.submit(square, i) for i in range(10)]
        waiter = threading.Thread(target=concurrent.futures.wait, args=(waited,))
        waiter.start()
        ex.shutdown(wait=False, cancel_futures=True)
        everything = plain + with_callback + waited
        assert all(f.cancelled() for f in everything)
        assert sorted(map(id, called)) == sorted(map(id, with_callback))
        waiter.join()
        done, not_done = concurrent.futures.wait(everything)
        assert len(done) == len(everything) and not not_done
        assert len(list(concurrent.futures.as_completed(everything))) == len(everything)
    finally:
        with open(go, "w") as f:
            f.write("done")
        ex.shutdown()
    assert running.result() == "done"


def test_imap_takes_its_inputs_as_results_are_taken():
    given = 0

    def inputs():
        nonlocal given
        for i in itertools.count():
            given += 1
            yield i

    results = isorun.imap(square, inputs(), cpu_slots=2)
    ahead = []
    for i, r in zip(range(40), results):
        assert r.value == i * i
        ahead.append(given - i)
    results.close()  # the calls in flight are stopped and waited for
    assert max(ahead) <= 16  # the window: a few calls per slot, not the whole (endless) input


def test_imap_unordered_yields_every_result():
    assert sorted(r.value for r in isorun.imap(square, range(30), cpu_slots=2, ordered=False)) == [
        i * i for i in range(30)]


def test_executor_map_is_lazy_and_in_order():
    with isorun.Executor(cpu_slots=2) as ex:
        out = ex.map(square, (i for i in range(25)))
        assert list(out) == [i * i for i in range(25)]
        assert sorted(ex.map(square, range(10), ordered=False)) == [i * i for i in range(10)]


def test_a_map_whose_inputs_fail_cancels_what_it_queued(tmp_path):
    go = str(tmp_path / "go")
    os.mkfifo(go)

    def inputs():
        yield go  # runs until the test (never) opens the FIFO: only the cancel ends it
        yield go
        raise ValueError("the inputs ran out badly")

    with pytest.raises(ValueError, match="ran out badly"):
        isorun.map(wait_for, inputs(), cpu_slots=1)
    # (conftest: no worker of it is left)


def test_ctrl_c_during_a_10000_call_map_leaves_nothing_behind():
    script = textwrap.dedent("""
        import os, select, signal, isorun
        def children_of(me, zombies=True):
            found = []
            for p in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{p}/stat") as f:
                        state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
                        if ppid == str(me) and (zombies or state != "Z"):
                            found.append(int(p))
                except FileNotFoundError:  # (gone meanwhile)
                    pass
            return found
        def square(x):
            return x * x
        def on_result(i, r):
            if i == 20:
                os.kill(os.getpid(), signal.SIGINT)
        try:
            isorun.map(square, range(10000), cpu_slots=2, on_result=on_result)
        except KeyboardInterrupt:
            me = os.getpid()
            # (The pool kept for the next call goes first, with a worker or zygote it may be
            # starting right now, which its listed pids do not show yet.)
            isorun.stop_standby()
            # A call that ended just before may have handed its small result over ahead of its
            # worker's exit, which the watcher reaps: each such worker ends on its own.
            for pid in children_of(me):
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                select.select([fd], [], [])
                os.close(fd)
            print("interrupted", len(children_of(me, zombies=False)), flush=True)  # (one ended, being reaped)
    """)
    shm = {e for e in os.listdir("/dev/shm") if e.startswith("isorun")}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["interrupted", "0"]  # every call in flight stopped and reaped first
    assert {e for e in os.listdir("/dev/shm") if e.startswith("isorun")} == shm


def test_a_future_completes_from_a_thread_that_ended():
    # The worker belongs to the watcher's thread, not to the thread that submitted it: a worker
    # dies with the thread that started it (PR_SET_PDEATHSIG).
    import threading

    f = isorun.isolated(square)
    futures = []
    t = threading.Thread(target=lambda: futures.append(f.submit(7)))
    t.start()
    t.join()
    assert futures[0].result() == 49


def test_an_ordered_imap_holds_only_its_window_of_futures():
    # A finished call's future (and its descriptors) goes once its result is taken: a long map
    # must not keep every future it made until it ends.
    from isorun._api import IsolatedFuture

    gc.collect()  # (earlier tests' garbage: their futures in cycles)
    gc.disable()  # what stays alive stays by reference, not for want of a collection
    try:
        results = isorun.imap(square, range(200), cpu_slots=2)
        for _ in zip(range(120), results):
            pass
        alive = sum(1 for o in gc.get_objects() if isinstance(o, IsolatedFuture))
        results.close()
    finally:
        gc.enable()
    assert alive <= 16  # the window (a few calls per slot), not the 120 taken
