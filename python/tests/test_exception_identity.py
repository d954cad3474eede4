"""The function's exception arrives as itself, also when its __init__ takes other arguments than
its args hold; where even its type and attributes cannot be rebuilt, TaskError says what it was
and why."""

from __future__ import annotations

import threading

import pytest

import isorun


class TwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"a is {a}")
        self.a = a
        self.b = b


class HoldsALock(Exception):
    def __init__(self, a, b):
        super().__init__(f"a is {a}")
        self.a = a
        self.lock = threading.Lock()  # pickles neither way


def raise_two_args():
    raise TwoArgs(1, {"b": [2]})


def raise_holds_a_lock():
    raise HoldsALock(7, 8)


def test_an_exception_whose_init_takes_other_arguments_arrives_with_its_type_and_attributes():
    with pytest.raises(TwoArgs, match="a is 1") as info:
        isorun.isolated(raise_two_args)()
    e = info.value
    assert (e.a, e.b, e.args) == (1, {"b": [2]}, ("a is 1",))
    assert "raise_two_args" in e.remote_traceback


def test_an_exception_of_a_function_of_main_keeps_its_type_by_value():
    ns = {"__name__": "__main__"}
    exec("class Custom(Exception):\n"
         "    def __init__(self, code, detail):\n"
         "        super().__init__(detail)\n"
         "        self.code = code\n"
         "def fail():\n"
         "    raise Custom(404, 'not found')\n", ns)
    with pytest.raises(ns["Custom"]) as info:
        isorun.isolated(ns["fail"])()
    assert info.value.code == 404 and str(info.value) == "not found"


def test_an_exception_that_cannot_be_rebuilt_is_a_task_error_with_its_attributes_and_why():
    with pytest.raises(isorun.TaskError) as info:
        isorun.isolated(raise_holds_a_lock)()
    e = info.value
    assert e.type_name.endswith("HoldsALock")
    assert e.attributes["a"] == "7"
    assert "lock" in e.attributes["lock"]
    assert "could not be rebuilt in the worker" in e.reason and "lock" in e.reason
    assert "a is 7" in str(e) and "a=7" in str(e)
