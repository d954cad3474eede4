"""Nothing the function does ends the caller: sys.exit and os._exit in the worker are the call's
failure (isorun.WorkerExited), and an exception that would end the caller is not raised in it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import isorun


def leave(code):
    sys.exit(code)


def exit_hard(code):
    os._exit(code)


def test_sys_exit_in_the_function_is_worker_exited_with_its_code():
    with pytest.raises(isorun.WorkerExited) as info:
        isorun.isolated(leave)(3)
    assert isinstance(info.value, isorun.WorkerCrashed)
    assert info.value.exit_code == 3 and info.value.signal == 0
    assert info.value.outcome.kind == "crashed"


def test_sys_exit_with_a_message_exits_1_and_says_it_on_stderr_as_a_script_does():
    res = isorun.isolated(leave, capture_output=True).try_call("giving up")
    assert isinstance(res.exception, isorun.WorkerExited)
    assert res.exception.exit_code == 1
    assert "giving up" in res.outcome.stderr


def test_sys_exit_runs_the_worker_s_atexit_handlers_as_a_script_s_exit_does():
    def register_then_leave():
        import atexit

        atexit.register(print, "atexit ran")
        sys.exit(0)

    res = isorun.isolated(register_then_leave, capture_output=True).try_call()
    assert isinstance(res.exception, isorun.WorkerExited) and res.exception.exit_code == 0
    assert res.outcome.stdout == "atexit ran\n"


def test_os_exit_of_the_worker_is_worker_exited_with_its_code():
    with pytest.raises(isorun.WorkerExited) as info:
        isorun.isolated(exit_hard)(5)
    assert info.value.exit_code == 5


def test_a_keyboard_interrupt_raised_by_the_function_is_a_task_error_not_the_caller_s():
    def interrupt():
        raise KeyboardInterrupt("inside")

    with pytest.raises(isorun.TaskError) as info:
        isorun.isolated(interrupt)()
    assert info.value.type_name == "builtins.KeyboardInterrupt"
    assert "would end it" in info.value.reason


def test_sys_exit_in_the_function_does_not_end_the_calling_script():
    script = textwrap.dedent("""
        import sys
        import isorun

        def leave():
            sys.exit(3)

        try:
            isorun.isolated(leave)()
        except isorun.WorkerExited as e:
            print("caught", e.exit_code)
        print("still here")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["caught 3", "still here"]
