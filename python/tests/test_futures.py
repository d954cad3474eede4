"""submit, cancel and map: concurrent.futures semantics over isolated calls."""

from __future__ import annotations

import concurrent.futures
import os
import threading

import pytest

import isorun


def square(x):
    return x * x


def wait_forever():
    threading.Event().wait()


def test_submit_returns_a_future_with_the_value():
    fut = isorun.isolated(square).submit(7)
    assert isinstance(fut, concurrent.futures.Future)
    assert fut.result() == 49
    assert fut.done() and not fut.cancelled()
    assert fut.outcome.ok


def test_futures_work_with_as_completed_and_wait():
    f = isorun.isolated(square)
    futures = [f.submit(i) for i in range(4)]
    assert sorted(fut.result() for fut in concurrent.futures.as_completed(futures)) == [0, 1, 4, 9]
    pids = {fut.outcome.pid for fut in futures}
    assert len(pids) == 4 and os.getpid() not in pids


def test_a_future_raises_the_function_s_exception():
    fut = isorun.isolated(int).submit("not a number")
    with pytest.raises(ValueError, match="not a number"):
        fut.result()
    assert isinstance(fut.exception(), ValueError)


def test_cancel_stops_a_running_worker():
    fut = isorun.isolated(wait_forever, grace=0.2).submit()
    assert fut.running()
    assert fut.cancel()
    assert fut.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result()
    # the worker is gone: the autouse fixture checks that no process is left


def test_cancel_after_the_end_does_nothing():
    fut = isorun.isolated(square).submit(3)
    assert fut.result() == 9
    assert not fut.cancel()
    assert fut.result() == 9


def test_map_returns_results_in_input_order():
    rs = isorun.map(square, list(range(10)), cpu_slots=3)
    assert [r.value for r in rs] == [i * i for i in range(10)]
    assert all(r.outcome.ok for r in rs)


def test_map_takes_dicts_as_keyword_arguments_and_keeps_failures_as_results():
    def divide(a, b):
        return a / b

    rs = isorun.map(divide, [dict(a=1, b=2), dict(a=1, b=0), (9, 3)], cpu_slots=2)
    assert rs[0].value == 0.5
    assert not rs[1].ok and isinstance(rs[1].exception, ZeroDivisionError)
    assert rs[2].value == 3


def test_map_with_an_impossible_plan_raises_usage_error():
    with pytest.raises(isorun.UsageError):
        isorun.map(square, [1], gpus=[63])


def where():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("ISORUN_MEM_LIMIT")


def test_map_packs_calls_on_the_gpus_under_their_cap():
    # The simulated inventory (conftest): one GPU of 16 GiB.
    rs = isorun.map(where, [()] * 4, gpus="all", mem_limit="1G", per_gpu=2)
    assert [r.value for r in rs] == [("GPU-sim-0", str(1 << 30))] * 4
    assert {r.outcome.device for r in rs} == {"GPU-sim-0"}


def test_map_of_a_function_isolated_on_every_gpu_maps_over_every_gpu():
    f = isorun.isolated(where, gpus="all", mem_limit="1G")
    assert [r.value for r in isorun.map(f, [()] * 2)] == [("GPU-sim-0", str(1 << 30))] * 2
    assert [r.value for r in isorun.map(f, [()], gpus="all")] == [("GPU-sim-0", str(1 << 30))]
    with pytest.raises(isorun.UsageError, match="every GPU"):
        isorun.map(f, [()], gpus=[0])


def test_options_gives_the_function_with_some_options_changed():
    f = isorun.isolated(where, cpu=True)
    on_gpu = f.options(gpu=0, cpu=False, mem_limit="512M")
    assert f() == ("", "0")  # no GPU visible, no cap
    assert on_gpu() == ("GPU-sim-0", str(512 << 20))
    with pytest.raises(isorun.UsageError, match="unknown"):
        f.options(colour="blue")


def test_map_of_an_isolated_function_keeps_its_options():
    f = isorun.isolated(read_env, env={"ISORUN_TEST_MAPPED": "kept"}, mem_limit="1G")
    rs = isorun.map(f, ["ISORUN_TEST_MAPPED", "ISORUN_MEM_LIMIT"], gpus="all")
    assert [r.value for r in rs] == ["kept", str(1 << 30)]


def read_env(name):
    return os.environ.get(name)


def test_options_move_a_function_elsewhere_as_a_whole():
    f = isorun.isolated(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"), gpu=0)
    assert f.options(cpu=True)() == ""
    assert f.options(gpu_count=1)() is not None


def test_map_places_calls_itself():
    with pytest.raises(isorun.UsageError, match="map places each call on its slots"):
        isorun.map(lambda x: x, [1, 2], gpu=0)
