"""Every way a call can fail, as the exception a Python user expects, and try_call's outcome."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

import isorun


class Unpicklable(Exception):
    """An exception whose type the caller cannot import: defined in the function's closure."""


def raise_value_error(x):
    raise ValueError(f"bad value {x}")


def test_the_function_s_own_exception_is_raised_with_its_type_and_the_worker_s_traceback():
    with pytest.raises(ValueError, match="bad value 3") as info:
        isorun.isolated(raise_value_error)(3)
    exc = info.value
    assert isinstance(exc.__cause__, isorun.RemoteTraceback)
    assert "raise_value_error" in exc.remote_traceback
    assert 'raise ValueError(f"bad value {x}")' in exc.remote_traceback
    assert exc.isorun_outcome.kind == "task_error"


def test_an_exception_whose_type_does_not_unpickle_becomes_a_task_error():
    def make():
        import sys
        import types

        # A type the worker finds by reference (in its sys.modules) and the caller cannot.
        module = types.ModuleType("isorun_tests_only_in_the_worker")
        sys.modules[module.__name__] = module
        exec("class LocalError(Exception):\n    pass", module.__dict__)
        raise module.LocalError("from a local class")

    res = isorun.isolated(make).try_call()
    assert not res.ok
    assert res.outcome.kind == "task_error"
    assert "LocalError" in res.outcome.error_type
    with pytest.raises(isorun.TaskError, match="from a local class") as info:
        res.value
    assert "make" in info.value.remote_traceback
    assert "did not unpickle in the caller" in info.value.reason


def test_try_call_returns_the_outcome_without_raising():
    res = isorun.isolated(raise_value_error).try_call(7)
    assert not res.ok
    assert res.outcome.kind == "task_error"
    assert res.outcome.error_type == "builtins.ValueError"
    assert res.outcome.message == "bad value 7"
    assert "raise_value_error" in res.outcome.traceback
    assert isinstance(res.exception, ValueError)

    ok = isorun.isolated(abs).try_call(-4)
    assert ok.ok and ok.value == 4
    assert ok.outcome.kind == "success" and ok.outcome.exit_code == 0
    assert ok.outcome.wall > 0 and ok.outcome.run >= 0 and ok.outcome.device == "cpu"


def kill_myself():
    sys.stderr.write("about to die\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_by_a_signal_is_worker_crashed_with_its_signal_and_stderr():
    with pytest.raises(isorun.WorkerCrashed) as info:
        isorun.isolated(kill_myself, echo_stderr=False)()
    e = info.value
    assert e.signal == signal.SIGKILL
    assert e.exit_code == -1
    assert "about to die" in e.stderr_tail
    assert e.outcome.kind == "crashed"


def latin1_on_stderr(value, fail):
    # Bytes that are not UTF-8 (Latin-1, a cut sequence), as a C library may print them.
    os.write(2, b"r\xe9sum\xe9 \xc3\n")
    if fail:
        raise ValueError("caf\xe9")
    return value


def test_bytes_on_stderr_that_are_not_utf8_leave_the_call_s_value_and_exception_alone():
    f = isorun.isolated(latin1_on_stderr, echo_stderr=False)
    assert f(42, False) == 42
    res = f.try_call(0, True)
    assert isinstance(res.exception, ValueError) and str(res.exception) == "caf\xe9"
    assert any("sum" in line for line in res.outcome.stderr_tail)


def exit_hard(code):
    os._exit(code)


def test_a_worker_that_exits_without_a_result_crashed():
    res = isorun.isolated(exit_hard).try_call(3)
    assert res.outcome.kind == "crashed"
    assert res.outcome.exit_code == 3 and res.outcome.signal == 0
    assert isinstance(res.exception, isorun.WorkerCrashed)


def wait_forever():
    threading.Event().wait()


def test_a_call_past_its_timeout_is_stopped_and_raises_timeout():
    f = isorun.isolated(wait_forever, timeout=0.3, grace=0.2)
    with pytest.raises(isorun.Timeout) as info:
        f()
    assert isinstance(info.value, TimeoutError)
    assert info.value.outcome.kind == "timeout"


def test_a_result_that_does_not_pickle_is_a_task_error():
    res = isorun.isolated(lambda: threading.Lock()).try_call()
    assert res.outcome.kind == "task_error"
    assert isinstance(res.exception, isorun.InvalidResult)
    assert "returned a lock" in str(res.exception)


@pytest.mark.parametrize("options, words", [
    (dict(mem_limit="lots"), "lots"),
    (dict(timeout="soon"), "soon"),
    (dict(gpu=0, cpu=True), "cpu=True"),
    (dict(standby=-1), "standby"),
    (dict(env=["NOEQUALS"]), "KEY=VALUE"),
    (dict(python="/nonexistent/python3"), "interpreter"),
])
def test_impossible_options_raise_usage_error_before_anything_starts(options, words):
    with pytest.raises(isorun.UsageError, match=words) as info:
        isorun.isolated(abs, **options)
    assert isinstance(info.value, ValueError)


def test_a_gpu_that_does_not_exist_is_a_usage_error(monkeypatch):
    with pytest.raises(isorun.UsageError, match="GPU"):
        isorun.isolated(abs, gpu=57)(1)


class DoesNotPickle:
    def __reduce__(self):
        raise TypeError("no pickling here")


def test_arguments_that_do_not_pickle_are_a_usage_error():
    with pytest.raises(isorun.UsageError, match="pickled.*no pickling here"):
        isorun.isolated(len)(DoesNotPickle())
