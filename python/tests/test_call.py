"""Isolated calls of plain functions: each runs in a fresh interpreter and returns its value."""

from __future__ import annotations

import copy
import os
import pickle
import select
import sys

import cloudpickle
import pytest

import isorun


def add(a, b):
    return a + b


def test_a_module_registered_to_travel_by_value_does_so_with_plain_arguments_too(tmp_path, monkeypatch):
    # The worker cannot import the module (its file is gone by the call): only the code sent by
    # value can run there.
    (tmp_path / "unimportable_task.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import unimportable_task

    cloudpickle.register_pickle_by_value(unimportable_task)
    try:
        (tmp_path / "unimportable_task.py").unlink()
        assert isorun.isolated(unimportable_task.triple)(7) == 21
    finally:
        cloudpickle.unregister_pickle_by_value(unimportable_task)
        sys.modules.pop("unimportable_task", None)


def whoami():
    return os.getpid(), os.getppid()


VALUES = [1, 2]
MODULE = os


def test_a_function_sent_by_value_is_pickled_once_until_what_its_pickle_holds_changes(monkeypatch):
    from isorun import _payload

    pickled = []
    dumps = _payload._dumps_call
    monkeypatch.setattr(_payload, "_dumps_call", lambda obj: pickled.append(obj) or dumps(obj))

    def shift(x, k=1):  # (nested: sent by value, as a function of __main__ is)
        import math

        return [math.floor(v + k) for v in x] if isinstance(x, list) else math.floor(x + k)

    f = isorun.isolated(shift)
    assert [f(1), f(2.5), f(x=3), f([1, 2])] == [2, 3, 4, [2, 3]]  # a list: cloudpickle's arguments
    assert [p for p in pickled if callable(p)] == [shift]  # code, defaults, modules named: the same
    shift.__defaults__ = (10,)
    assert f(1) == 11
    shift.__code__ = (lambda x, k=1: x - k).__code__
    assert f(1) == -9
    assert [p for p in pickled if callable(p)] == [shift] * 3


def test_what_a_function_sent_by_value_names_is_read_at_each_call(monkeypatch):
    def total():
        return sum(VALUES)

    def module_name():
        return MODULE.__name__

    f, g = isorun.isolated(total), isorun.isolated(module_name)
    assert (f(), g()) == (3, "os")
    VALUES.append(4)  # changed in place: a global list is never pickled ahead
    monkeypatch.setattr(sys.modules[__name__], "MODULE", pickle)  # another module by the same name
    try:
        assert (f(), g()) == (7, "pickle")
    finally:
        VALUES.pop()


def test_a_plain_function_returns_its_value():
    assert isorun.isolated(add)(2, 3) == 5


def test_each_call_runs_in_a_fresh_process_started_by_this_one():
    f = isorun.isolated(whoami)
    first, second = f(), f()
    assert first[0] != os.getpid() and second[0] != os.getpid()
    assert first[0] != second[0]
    assert first[1] == second[1] == os.getpid()


def test_the_decorator_takes_options_and_keyword_arguments():
    @isorun.isolated(cpu=True, timeout="1m")
    def scale(x, *, by):
        return [v * by for v in x]

    assert scale([1, 2], by=3) == [3, 6]


def read_env(name):
    return os.environ.get(name)


def test_env_is_given_to_the_worker_and_overrides_what_it_inherits(monkeypatch):
    monkeypatch.setenv("ISORUN_TEST_VARIABLE", "inherited")
    assert isorun.isolated(read_env)("ISORUN_TEST_VARIABLE") == "inherited"
    given = isorun.isolated(read_env, env={"ISORUN_TEST_VARIABLE": "given"})
    assert given("ISORUN_TEST_VARIABLE") == "given"


def test_an_isolated_function_pickles_and_copies_after_it_has_been_called():
    # What a call keeps for the next (its launch, its C++ options) does not travel or copy.
    f = isorun.isolated(add)
    assert f(1, 2) == 3
    assert pickle.loads(cloudpickle.dumps(f))(2, 3) == 5
    assert copy.deepcopy(f)(3, 4) == 7


def gpu_env():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER")


def test_os_environ_shows_the_gpu_the_call_was_assigned():
    # Assigned after the interpreter started: os.environ is brought up to date before the call.
    assert isorun.isolated(gpu_env, gpu=0, mem_limit="1G")() == ("GPU-sim-0", "PCI_BUS_ID")
    assert isorun.isolated(gpu_env)()[0] == ""


def worker_env_seen():
    return os.environ.get("ISORUN_MEM_LIMIT"), "ISORUN_WORKER" in os.environ, os.getenv("ISORUN_WORKER")


@pytest.mark.parametrize("standby", [0, 1])
def test_os_environ_agrees_with_the_process_environment_on_what_the_worker_set_and_removed(standby):
    # The worker sets the assignment's variables and removes its own (ISORUN_WORKER) in C after
    # the interpreter started, on a standby interpreter after it has waited: os.environ sees both.
    got = isorun.isolated(worker_env_seen, gpu=0, mem_limit="1G", standby=standby)()
    assert got == (str(1 << 30), False, None)


def test_early_result_hands_the_value_over_before_the_worker_has_exited():
    res = isorun.isolated(add, early_result=True).try_call(20, 22)
    assert res.value == 42
    assert res.outcome.ok
    try:  # the worker exits behind the result, on its own
        fd = os.pidfd_open(res.outcome.pid)
    except ProcessLookupError:
        return
    select.select([fd], [], [])
    os.close(fd)
