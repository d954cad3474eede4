"""Admission of every call, isorun.Executor, the host memory cap, thread limits, asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import isorun
from isorun import _core

GIB = 1 << 30


def square(x):
    return x * x


def where():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("ISORUN_MEM_LIMIT")


def wait_forever():
    threading.Event().wait()


def thread_vars():
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS")
    return [os.environ.get(n) for n in names]


def eat(mib):
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return len(block) >> 20


def test_calls_never_hold_more_caps_than_the_gpu_has_and_all_succeed():
    # The simulated inventory (conftest): one GPU of 16 GiB; caps of 6 GiB, two at a time.
    f = isorun.isolated(wait_forever, gpu=0, mem_limit="6G")
    futures = [f.submit() for _ in range(6)]
    started = [fut.running() for fut in futures]
    assert sum(started) <= 2
    assert started[2:] == [False] * 4  # admitted in order: the later ones wait
    assert all(fut.pid == 0 for fut in futures[2:])
    for fut in futures:
        fut.cancel()
    concurrent.futures.wait(futures)
    assert all(fut.cancelled() for fut in futures)
    # The same from six threads, with calls that end: all succeed.
    g = isorun.isolated(where, gpu=0, mem_limit="6G")
    with concurrent.futures.ThreadPoolExecutor(6) as threads:
        got = list(threads.map(lambda _: g(), range(6)))
    assert got == [("GPU-sim-0", str(6 * GIB))] * 6


def test_a_call_larger_than_any_gpu_fails_at_once():
    with pytest.raises(isorun.UsageError, match="exceeds GPU 0"):
        isorun.isolated(square, gpu=0, mem_limit="20G")(3)
    with pytest.raises(isorun.UsageError, match="exceeds GPU 0"):
        isorun.Executor("all", mem_limit="20G")


def test_a_waiting_call_can_be_cancelled_and_never_starts():
    with isorun.Executor(cpu_slots=1) as ex:
        running = ex.submit(wait_forever)
        waiting = ex.submit(square, 3)
        assert running.running() and not waiting.running()
        assert (ex.running, ex.waiting) == (1, 1)
        assert waiting.cancel()
        assert waiting.cancelled() and waiting.pid == 0
        assert ex.waiting == 0
        running.cancel()
    assert running.cancelled()


def test_ctrl_c_stops_a_call_that_waits_for_admission(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, threading, isorun
        from isorun import _core

        def hold():
            threading.Event().wait()

        busy = isorun.isolated(hold, gpu=0, mem_limit="10G").submit()
        def interrupt():
            while _core.admission_counts()[0] == 0:  # until the call below waits
                threading.Event().wait(0.01)
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt, daemon=True).start()
        try:
            isorun.isolated(hold, gpu=0, mem_limit="10G")()
        except KeyboardInterrupt:
            print("interrupted", _core.admission_counts())
        busy.cancel()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=None,
                         env={**os.environ, "ISORUN_SIMULATE_GPUS": "1x16G"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("interrupted (0, 1)")  # it left the queue; the other still runs


def test_executor_is_a_concurrent_futures_executor():
    with isorun.Executor(cpu_slots=2) as ex:
        assert isinstance(ex, concurrent.futures.Executor)
        assert ex.plan == "2 CPU slots (cpu_slots)"
        futures = [ex.submit(square, i) for i in range(6)]
        assert sorted(f.result() for f in concurrent.futures.as_completed(futures)) == [0, 1, 4, 9, 16, 25]
        it = ex.map(square, range(5))  # lazy, ordered
        assert list(it) == [0, 1, 4, 9, 16]
        with pytest.raises(ValueError):
            list(ex.map(int, ["1", "x"]))
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(square, 1)


def test_shutdown_with_and_without_cancel_futures():
    ex = isorun.Executor(cpu_slots=1)
    first = ex.submit(square, 2)
    second = ex.submit(square, 3)
    ex.shutdown(wait=True)
    assert (first.result(), second.result()) == (4, 9)

    ex = isorun.Executor(cpu_slots=1)
    blocker = ex.submit(wait_forever)
    queued = [ex.submit(square, i) for i in range(3)]
    ex.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    assert not blocker.cancelled()
    blocker.cancel()
    concurrent.futures.wait([blocker])


def test_executor_places_calls_on_its_gpus_under_the_cap():
    with isorun.Executor("all", mem_limit="4G") as ex:
        got = [f.result() for f in [ex.submit(where) for _ in range(4)]]
    assert got == [("GPU-sim-0", str(4 * GIB))] * 4


def test_map_keeps_an_isolated_function_s_own_gpu_and_cap():
    f = isorun.isolated(where, gpu=0, mem_limit="2G")
    assert [r.value for r in isorun.map(f, [(), ()])] == [("GPU-sim-0", str(2 * GIB))] * 2
    with pytest.raises(isorun.UsageError, match="give one of them"):
        isorun.map(f, [()], mem_limit="1G")
    seen = []
    isorun.map(square, [1, 2, 3], on_result=lambda i, r: seen.append((i, r.value)))
    assert sorted(seen) == [(0, 1), (1, 4), (2, 9)]


def test_each_worker_gets_its_share_of_the_cores_as_thread_limits():
    assert isorun.isolated(thread_vars)() == ["1"] * 5  # one CPU slot of one per core
    assert isorun.isolated(thread_vars, env={"OMP_NUM_THREADS": "3"})() == ["3"] * 5  # yours reaches all five
    if len(os.sched_getaffinity(0)) >= 2:
        assert isorun.isolated(thread_vars, cpus_per_call=2)() == ["2"] * 5
    with isorun.Executor(cpu_slots=1) as ex:
        cores = str(len(os.sched_getaffinity(0)))
        assert ex.submit(thread_vars).result() == [cores] * 5


def test_a_call_past_its_host_memory_cap_ends_out_of_memory():
    f = isorun.isolated(eat, host_mem_limit="64M")
    try:
        res = f.try_call(512)
    except isorun.UsageError as e:
        pytest.skip(f"no cgroup can enforce a host memory cap here: {e}")
    assert res.outcome.kind == "out_of_memory"
    assert "host_mem_limit" in res.outcome.message
    assert 32 << 20 <= res.outcome.host_memory_peak <= 68 << 20
    with pytest.raises(isorun.OutOfMemory):
        f(512)
    assert f(16) == 16  # under the cap
    assert isorun.isolated(eat).try_call(48).outcome.host_memory_peak >= 48 << 20


def test_asyncio_calls_share_the_admission_and_cancel_stops_the_worker():
    f = isorun.isolated(square)

    async def main():
        values = await asyncio.gather(*(f.acall(i) for i in range(20)))
        slow = asyncio.ensure_future(isorun.isolated(wait_forever).acall())
        await asyncio.sleep(0)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        return values

    assert asyncio.run(main()) == [i * i for i in range(20)]


@pytest.mark.parametrize("options, match", [
    (dict(host_mem_limit="lots"), "host_mem_limit|size"),
    (dict(host_mem_limit="1M"), "below the smallest"),
    (dict(cpus_per_call=0), "cpus_per_call"),
])
def test_bad_options_are_usage_errors_naming_them(options, match):
    with pytest.raises(isorun.UsageError, match=match):
        isorun.isolated(square, **options)


@pytest.mark.parametrize("options, match", [
    (dict(cpu_slots=0), "cpu_slots"),
    (dict(per_gpu=0, gpus="all", mem_limit="1G"), "per_gpu"),
    (dict(gpus=3), "gpus takes"),
    (dict(mem_limit="1G"), "host_mem_limit"),
    (dict(gpu=0), "places its calls itself"),
])
def test_bad_executor_options_are_usage_errors(options, match):
    with pytest.raises(isorun.UsageError, match=match):
        isorun.Executor(**options)


def test_mem_limit_without_a_gpu_names_host_mem_limit():
    with pytest.raises(isorun.UsageError, match="host_mem_limit"):
        isorun.isolated(square, mem_limit="1G")(2)


def test_host_mem_limit_is_refused_under_process_group_containment(tmp_path):
    code = ("import isorun\n"
            "try:\n    isorun.isolated(abs, host_mem_limit='64M')(1)\n"
            "except isorun.UsageError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ISORUN_CONTAINMENT": "process-group"})
    assert "refused: host-mem-limit cannot be enforced here" in out.stdout, out.stderr


def test_standby_preloads_the_function_s_module_and_serves_back_to_back_calls(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
    import module_task  # a module-level function: the worker imports it by name

    f = isorun.isolated(module_task.pid_of_worker, standby=2)
    assert "module_task" in f._options.preload
    assert isorun.isolated(lambda: 0, standby=2)._options.preload == ()
    with isorun.Executor(cpu_slots=2, standby=2) as ex:
        pids = [fut.result() for fut in [ex.submit(f) for _ in range(12)]]
    assert len(set(pids)) == 12 and os.getpid() not in pids  # one fresh interpreter per call
