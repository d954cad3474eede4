"""Forwarded output at scale: one thread of the caller reads every pipe, and the calls that forward
into the same stream share one pipe for it, so queued calls cost no thread and no descriptor each;
still, a call's output is in the stream when the call returns, and capture_output=True keeps each
call's own text."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap

import isorun


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_for(path, ready=None):
    """Runs until the FIFO `path` is opened for writing (a call that lasts as long as the test
    wants); first says "ready" into the FIFO `ready`, where given (the call has started)."""
    if ready is not None:
        with open(ready, "w") as f:
            f.write("ready")
    with open(path) as f:
        return f.read()


def square(x):
    return x * x


def say(text, end="\n", err=False):
    print(text, end=end, file=sys.stderr if err else sys.stdout)
    return len(text)


def lines(tag, n):
    # A line in one write: print() writes the text and its line end apart, and where the worker's
    # stdout is unbuffered (PYTHONUNBUFFERED=1, write_through) they are two writes to the pipe.
    for i in range(n):
        sys.stdout.write(f"{tag}:{i}:" + "x" * 200 + "\n")
    return n


def _lines_of(tag, n):
    return [f"{tag}:{i}:" + "x" * 200 + "\n" for i in range(n)]


def test_queued_calls_under_a_redirected_stdout_cost_no_thread_or_descriptor_each(tmp_path):
    go, ready = str(tmp_path / "go"), str(tmp_path / "ready")
    os.mkfifo(go)
    os.mkfifo(ready)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        # Exec'd workers: the default's pool (a thread and a zygote's descriptors, once) would come
        # and go while the descriptors are counted.
        with isorun.Executor(cpu_slots=1, start="exec") as ex:  # (the reader thread and the rest started once)
            assert ex.submit(say, "warm").result() == 4
        threads, fds = _threads(), _fds()
        with isorun.Executor(cpu_slots=1, start="exec") as ex:
            running = ex.submit(wait_for, go, ready)
            try:
                with open(ready) as f:  # its worker runs it: every descriptor of its start settled
                    assert f.read() == "ready"
                first = [ex.submit(square, i) for i in range(10)]
                queued_threads, queued_fds = _threads(), _fds()
                queued = first + [ex.submit(square, i) for i in range(10, 2000)]
                assert ex.waiting >= 1999
                # Not a thread, nor a pipe, per call: 1,990 more calls queued cost nothing more.
                # (Fewer may be open: a descriptor of an earlier call's, closed meanwhile by the
                # thread that reaps it.)
                counts = (_threads(), _fds())
                assert counts[0] <= queued_threads and counts[1] <= queued_fds, (counts, queued_threads, queued_fds)
                assert counts[0] <= threads + 2
                assert counts[1] <= fds + 16  # the running worker's descriptors, the shared pipes
            finally:
                ex.shutdown(wait=False, cancel_futures=True)
                with open(go, "w") as f:
                    f.write("done")
            assert all(f.cancelled() for f in queued)
            assert running.result() == "done"
        # Every pipe closed once its last call ended (the cancelled ones too): nothing left over.
        assert _fds() <= fds
        assert _threads() <= threads
    assert out.getvalue() == "warm\n"


def test_a_call_s_output_is_in_the_stream_when_it_returns():
    out, err = io.StringIO(), io.StringIO()
    f = isorun.isolated(say)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert f("hello") == 5
        assert out.getvalue() == "hello\n"
        assert f("partial", end="") == 7  # no line end: the worker's flush at its exit sends it
        assert out.getvalue() == "hello\npartial"
        assert f("oops", end="", err=True) == 4
        assert err.getvalue() == "oops"
    assert out.getvalue() == "hello\npartial"


def test_a_partial_line_comes_while_another_call_holds_the_shared_pipe(tmp_path):
    # The pipe stays open (the running call uses it): the call that ends waits for what it wrote,
    # and its partial last line is not held back for a line end that may never come.
    go = str(tmp_path / "go")
    os.mkfifo(go)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with isorun.Executor(cpu_slots=2) as ex:
            running = ex.submit(wait_for, go)
            try:
                assert ex.submit(say, "partial", end="").result() == 7
                assert out.getvalue() == "partial"
                assert ex.submit(say, "!").result() == 1
                assert out.getvalue() == "partial!\n"
                assert ex.submit(say, "to stderr", end="", err=True).result() == 9
                assert err.getvalue() == "to stderr"
            finally:
                with open(go, "w") as f:
                    f.write("done")
            assert running.result() == "done"


def test_the_lines_of_concurrent_calls_all_arrive_whole():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        with isorun.Executor(cpu_slots=4) as ex:
            futures = [ex.submit(lines, tag, 300) for tag in range(8)]
            for tag, fut in enumerate(futures):
                assert fut.result() == 300
                text = out.getvalue()
                assert all(line in text for line in _lines_of(tag, 300))  # there when the call returns
    expected = [line for tag in range(8) for line in _lines_of(tag, 300)]
    got = out.getvalue().splitlines(keepends=True)
    assert sorted(got) == sorted(expected)
    for tag in range(8):  # each call's own lines in the order it printed them
        assert [line for line in got if line.startswith(f"{tag}:")] == _lines_of(tag, 300)


def test_capture_output_keeps_each_call_s_own_text_among_forwarded_calls():
    out = io.StringIO()
    captured = isorun.isolated(lines, capture_output=True)
    with contextlib.redirect_stdout(out):
        with isorun.Executor(cpu_slots=4) as ex:
            forwarded = [ex.submit(lines, "fwd", 50) for _ in range(3)]
            futures = [captured.submit(tag, 100 + tag) for tag in range(6)]
            for tag, fut in enumerate(futures):
                assert fut.result() == 100 + tag
                assert fut.outcome.stdout == "".join(_lines_of(tag, 100 + tag))
            assert [f.result() for f in forwarded] == [50, 50, 50]
    assert sorted(out.getvalue().splitlines(keepends=True)) == sorted(_lines_of("fwd", 50) * 3)
    res = isorun.isolated(say, capture_output=True).try_call("partial", end="")
    assert res.value == 7
    assert res.outcome.stdout == "partial"
    assert res.outcome.stderr == ""


def test_a_forked_child_forwards_through_its_own_reader():
    # The child of a fork (multiprocessing's) has no reader thread: its first pipe starts one,
    # and the parent's pipes still end (the child's copies of them are closed).
    script = textwrap.dedent("""
        import contextlib, io, os, sys, types
        import isorun
        from isorun import _output

        def say(text):
            print(text)

        def through(stream, text):
            # A call's pipe, written to as a worker would: no worker needed in the child.
            with contextlib.redirect_stdout(stream):
                output = _output.for_call(False, True, False)
            options = output.apply(types.SimpleNamespace(stdout_fd=-1, stderr_fd=-1))
            os.write(options.stdout_fd, text.encode())
            output.close()

        parent = io.StringIO()
        with contextlib.redirect_stdout(parent):
            isorun.isolated(say)("before")
            holder = _output.for_call(False, True, False)  # a shared pipe open across the fork
        shared = holder._pipes["stdout"]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            child = io.StringIO()
            through(child, "in the child\\n")
            ok = child.getvalue() == "in the child\\n" and _output._forwarder.thread.is_alive()
            os.read(r, 1)  # alive until the parent has closed its pipe
            os._exit(0 if ok else 1)
        os.close(r)
        holder.close()  # its last call: waits for its end, which the child's copy does not hold off
        assert shared.eof
        os.write(w, b"x")
        os.close(w)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with contextlib.redirect_stdout(parent):
            isorun.isolated(say)("after")
        through(parent, "direct\\n")
        assert parent.getvalue() == "before\\nafter\\ndirect\\n", parent.getvalue()
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "ok\n"
