"""The worker's output where the caller looks: forwarded into sys.stdout/sys.stderr objects that
are not fds 1 and 2 (Jupyter, redirect_stdout, pytest's capture) line by line as it comes, or
kept in the outcome with capture_output=True."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading

import pytest

import isorun


def talk(n):
    for i in range(n):
        print("out", i)
        print("err", i, file=sys.stderr)
    return n


def test_output_goes_into_a_redirected_stdout_and_stderr():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert isorun.isolated(talk)(2) == 2
    assert out.getvalue() == "out 0\nout 1\n"
    assert err.getvalue() == "err 0\nerr 1\n"


def test_output_reaches_pytest_s_capsys(capsys):
    isorun.isolated(talk)(1)
    captured = capsys.readouterr()
    assert captured.out == "out 0\n"
    assert captured.err == "err 0\n"


class _Lines(io.TextIOBase):
    """A stdout that, when the worker's "ready" line arrives, lets the worker go on (through a
    FIFO the worker waits on): the line must come while the function still runs."""

    def __init__(self, fifo):
        self.fifo = fifo
        self.lines = []

    def writable(self):
        return True

    def write(self, text):
        self.lines.append(text)
        if text == "ready\n":
            with open(self.fifo, "w") as f:
                f.write("go")
        return len(text)


def announce_then_wait(fifo):
    import stat

    print("ready")  # no flush: a pipe the caller reads is line-buffered in the worker
    if not stat.S_ISFIFO(os.fstat(1).st_mode):
        return "stdout is not forwarded"  # (would otherwise wait for a line no one sees)
    with open(fifo) as f:
        return f.read()


def test_output_is_forwarded_line_by_line_while_the_function_runs(tmp_path):
    fifo = str(tmp_path / "go")
    os.mkfifo(fifo)
    stream = _Lines(fifo)
    with contextlib.redirect_stdout(stream):
        fut = isorun.isolated(announce_then_wait).submit(fifo)
    assert fut.result() == "go"
    assert stream.lines == ["ready\n"]


def test_capture_output_keeps_stdout_and_stderr_in_the_outcome(capsys):
    res = isorun.isolated(talk, capture_output=True).try_call(2)
    assert res.value == 2
    assert res.outcome.stdout == "out 0\nout 1\n"
    assert res.outcome.stderr == "err 0\nerr 1\n"
    assert "err 1" in res.outcome.stderr_tail
    assert capsys.readouterr() == ("", "")


def talk_then_fail():
    print("partial work")
    raise RuntimeError("then failed")


def test_captured_output_is_in_a_failed_call_s_outcome_too():
    with pytest.raises(RuntimeError) as info:
        isorun.isolated(talk_then_fail, capture_output=True)()
    assert info.value.isorun_outcome.stdout == "partial work\n"


def test_capture_output_of_many_concurrent_calls_keeps_each_call_s_own():
    f = isorun.isolated(talk, capture_output=True)
    futs = [f.submit(n) for n in (1, 2, 3)]
    assert [fut.result() for fut in futs] == [1, 2, 3]
    assert [fut.outcome.stdout.count("\n") for fut in futs] == [1, 2, 3]


def test_capture_output_excludes_early_result():
    with pytest.raises(isorun.UsageError, match="capture_output"):
        isorun.isolated(talk, capture_output=True, early_result=True)


def test_without_capture_outcome_has_no_output():
    assert isorun.isolated(talk).try_call(0).outcome.stdout is None


def test_a_standby_interpreter_s_output_is_forwarded_too():
    # Launched before the call, with this process's stdout: its stdout is replaced at the call.
    f = isorun.isolated(talk, standby=1)
    f.warm_up()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        f(1)
    assert out.getvalue() == "out 0\n"
