"""The caller's side of a worker's life: functions of __main__, Ctrl-C, and kill -9 of the caller
(no worker and no shared memory left behind). Each runs a real caller script in a subprocess."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap


def _caller(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def _wait_gone(pid: int) -> None:
    """Blocks until process `pid` has ended (a pidfd turns readable), however long it takes."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def test_what_the_function_prints_reaches_the_caller_s_stdout():
    p = _caller("""
        import isorun
        def talk(n):
            print("line", n)     # not flushed: the worker flushes before it exits
            return n
        print(isorun.isolated(talk)(1), flush=True)
    """)
    out, err = p.communicate()
    assert p.returncode == 0, err
    assert out.split("\n")[:2] == ["line 1", "1"]


def test_lambdas_and_closures_of_main_travel_by_value():
    p = _caller("""
        import isorun
        base = 10
        def add_base(x):
            return x + base
        class Point:
            def __init__(self, x): self.x = x
        print(isorun.isolated(add_base)(5), isorun.isolated(lambda: base * 2)(),
              isorun.isolated(lambda p: p.x + 1)(Point(41)))
    """)
    out, err = p.communicate()
    assert p.returncode == 0, err
    assert out.split() == ["15", "20", "42"]


BLOCKING_CALLER = """
    import os, sys, threading, isorun
    def block():
        print(os.getpid(), flush=True)
        threading.Event().wait()
    isorun.isolated(block, grace=0.5)()
"""


def _interrupt(script: str, second_after: str = "") -> None:
    """Runs `script`, whose function prints its worker's pid first, sends Ctrl-C (and a second
    one once the function has printed `second_after`), and checks that the caller raised
    KeyboardInterrupt only once the worker was gone."""
    p = _caller(script)
    worker = int(p.stdout.readline())  # the function runs: its worker printed its pid
    fd = os.pidfd_open(worker)
    p.send_signal(signal.SIGINT)
    if second_after:
        assert p.stdout.readline() == second_after
        p.send_signal(signal.SIGINT)
    out, err = p.communicate()
    assert p.returncode != 0 and "KeyboardInterrupt" in err
    # The caller waited for the worker before the exception went on: it is gone already.
    assert select.select([fd], [], [], 0)[0] == [fd]
    os.close(fd)


def test_ctrl_c_stops_the_worker_and_raises_keyboard_interrupt():
    _interrupt(BLOCKING_CALLER)


def test_ctrl_c_stops_a_worker_that_keeps_writing_to_stderr():
    # The caller's thread watching the call is kept busy reading the worker's stderr: Ctrl-C is
    # still seen.
    _interrupt("""
        import os, isorun
        def flood():
            print(os.getpid(), flush=True)
            line = b"x" * 4096
            while True:
                os.write(2, line)
        isorun.isolated(flood, grace=0.5, echo_stderr=False)()
    """)


def test_a_second_ctrl_c_kills_a_worker_that_ignores_the_first():
    # The function ignores SIGTERM and the grace is an hour: the first Ctrl-C's stop would wait
    # that long; the second (once the first's SIGTERM reached the function) takes the stop's next
    # step, SIGKILL, at once.
    _interrupt("""
        import os, signal, threading, isorun
        def stubborn():
            signal.signal(signal.SIGTERM, lambda *_: print("term", flush=True))
            print(os.getpid(), flush=True)
            threading.Event().wait()
        isorun.isolated(stubborn, grace=3600)()
    """, second_after="term\n")


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie no one reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_kill_9_of_the_caller_leaves_no_worker_and_no_shared_memory():
    before = _shm()
    p = _caller(BLOCKING_CALLER)
    worker = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    _wait_gone(worker)  # its watchdog saw the control socket hang up and killed its group
    assert not _running(worker)
    assert _shm() == before


MAP_CALLER = """
    import os, sys, threading, isorun
    def block(i):
        os.write(1, b"%d\\n" % os.getpid())  # one write: two workers share the caller's stdout
        threading.Event().wait()
    isorun.map(block, range(8), cpu_slots=2, grace=0.5)
"""


def test_ctrl_c_during_map_stops_its_calls_and_starts_no_more():
    p = _caller(MAP_CALLER)
    try:
        workers = [int(p.stdout.readline()), int(p.stdout.readline())]  # both slots' calls run
    except BaseException:
        p.kill()  # the caller would wait for its calls forever
        raise
    p.send_signal(signal.SIGINT)
    out, err = p.communicate()
    # KeyboardInterrupt, not an abort at the interpreter's exit; no third call was started.
    assert p.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err  # Python's way to end by it
    assert out == ""
    assert not any(_running(w) for w in workers)


def test_a_script_that_ends_while_a_submitted_call_runs_stops_it_and_exits_cleanly():
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, threading, isorun
        def block():
            print(os.getpid(), flush=True)
            threading.Event().wait()
        isorun.isolated(block, grace=0.5).submit()
        sys.stdin.readline()   # until the test has seen the call start
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        worker = int(p.stdout.readline())
    except BaseException:
        p.kill()  # the caller would wait for the test's line forever
        raise
    out, err = p.communicate("\n")
    assert p.returncode == 0, err
    assert "terminate called" not in err
    _wait_gone(worker)
