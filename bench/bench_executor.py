#!/usr/bin/env python3
"""Many calls at once through isorun's admission and executors, beside their peers, in one run
(docs/python.md "Many calls"; bench/README.md "Calls in numbers").

  back to back: N trivial calls one after another (latency) and all at once (calls/s), through
    isorun cold (a fresh interpreter launched per call), isorun.Executor(standby=2,
    preload=["numpy"]), the same with start="zygote" (each worker forked from one interpreter
    that imported numpy) and concurrent.futures.ProcessPoolExecutor(max_tasks_per_child=1) (spawn:
    a fresh process per call, the same promise);
  spaced: a module-level function on a standby interpreter (its module preloaded), calls
    --gap-ms apart, beside the same call back to back;
  sweep: a 40-trial sweep of a trivial Python function on 2 slots, isorun.sweep (standby, and
    start: zygote)
    against Optuna's study.optimize(n_jobs=2) starting `python -c` per trial (the floor a
    subprocess per trial gives), where Optuna is installed;
  scikit-learn: 20 LogisticRegression fits on the digits bundled with scikit-learn, through
    isorun.Executor(preload=["sklearn"], standby=2) and a warm ProcessPoolExecutor (workers
    reused: the floor, no isolation).

Each figure: median with p10 and p90 in ms, or a throughput; ratios beside their floor. Run from
the repository root with the package importable:

    python3 bench/bench_executor.py [--calls 200] [--gap-ms 300] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_tasks"))
import executor_tasks  # noqa: E402

import isorun  # noqa: E402


def stats(ms: list[float]) -> tuple[float, float, float]:
    s = sorted(ms)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return statistics.median(s), q[0], q[-1]


def line(label: str, ms: list[float], floor: float | None = None) -> float:
    med, p10, p90 = stats(ms)
    ratio = f"  {med / floor:5.2f}x" if floor else ""
    print(f"  {label:<58} {med:8.2f} ms  (p10 {p10:7.2f}, p90 {p90:7.2f}){ratio}")
    return med


def sequential(call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def burst(submit, n: int) -> float:
    """Calls per second with n calls submitted at once."""
    t = time.perf_counter()
    futures = [submit() for _ in range(n)]
    for f in futures:
        f.result()
    return n / (time.perf_counter() - t)


def back_to_back(n: int) -> None:
    print(f"back to back: {n} trivial calls, each in a fresh process")
    cold = isorun.isolated(executor_tasks.trivial)
    spawn = mp.get_context("spawn")
    with isorun.Executor(standby=2, preload=["numpy"]) as standby, \
            isorun.Executor(standby=2, preload=["numpy"], start="zygote") as zygote, \
            cf.ProcessPoolExecutor(2, mp_context=spawn, max_tasks_per_child=1) as ppe:
        for fn in (standby.submit, zygote.submit, ppe.submit):  # launched once before timing
            fn(executor_tasks.trivial).result()
        floor = line("ProcessPoolExecutor(max_tasks_per_child=1), one at a time",
                     sequential(lambda: ppe.submit(executor_tasks.trivial).result(), n))
        line("isorun cold, one at a time", sequential(cold, n), floor)
        with isorun.Executor(standby=2) as bare:
            bare.submit(executor_tasks.trivial).result()
            line("isorun Executor(standby=2), no preload, one at a time",
                 sequential(lambda: bare.submit(executor_tasks.trivial).result(), n), floor)
        line("isorun Executor(standby=2, preload=numpy), one at a time",
             sequential(lambda: standby.submit(executor_tasks.trivial).result(), n), floor)
        line("isorun Executor(standby=2, preload=numpy, start=zygote), one at a time",
             sequential(lambda: zygote.submit(executor_tasks.trivial).result(), n), floor)
        ppe_rate = burst(lambda: ppe.submit(executor_tasks.trivial), n)
        cold_rate = burst(lambda: cold.submit(), n)
        standby_rate = burst(lambda: standby.submit(executor_tasks.trivial), n)
        zygote_rate = burst(lambda: zygote.submit(executor_tasks.trivial), n)
    print(f"  all {n} at once, calls/s: ProcessPoolExecutor {ppe_rate:7.1f}   isorun cold {cold_rate:7.1f} "
          f"({cold_rate / ppe_rate:4.2f}x)   isorun standby {standby_rate:7.1f} ({standby_rate / ppe_rate:4.2f}x)"
          f"   isorun zygote {zygote_rate:7.1f} ({zygote_rate / ppe_rate:4.2f}x)")


def spaced(n: int, gap_ms: float) -> None:
    print(f"spaced: a module-level function (numpy), standby=2, early_result, calls {gap_ms:.0f} ms apart")
    f = isorun.isolated(executor_tasks.with_numpy, standby=2, preload=["numpy"], early_result=True)
    f.warm_up()
    f()
    out = []
    for _ in range(n):
        time.sleep(gap_ms / 1e3)  # a user's pause between calls, outside the timed region
        t = time.perf_counter()
        f()
        out.append((time.perf_counter() - t) * 1e3)
    floor = line("`python -c pass` (a bare interpreter's start, the cold floor)",
                 sequential(lambda: subprocess.run([sys.executable, "-S", "-c", "pass"], check=True), max(10, n // 3)))
    line("isorun standby, spaced", out, floor)
    line("isorun standby, back to back", sequential(f, n), floor)
    isorun.stop_standby()


def sweep(trials: int) -> None:
    print(f"sweep: {trials} trials of a trivial Python function on 2 slots")
    xs = [round(0.05 * i, 2) for i in range(trials // 2)]
    spec = {"python": "executor_tasks:sweep_trial", "params": {"x": xs, "y": [0, 1]},
            "metric": {"name": "loss", "goal": "minimize"}}

    def isorun_rate(start: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            t = time.perf_counter()
            records = isorun.sweep({**spec, "resources": {"cpu_slots": 2, "standby": 1, "start": start},
                                    "out": os.path.join(out, "s")})
            wall = time.perf_counter() - t
        assert len(records) == trials and all(r["outcome"] == "success" for r in records)
        return trials / wall

    rate, zygote = isorun_rate("exec"), isorun_rate("zygote")
    try:
        import optuna
    except ImportError:
        print(f"  isorun.sweep: {rate:6.1f} trials/s, start: zygote {zygote:6.1f} trials/s "
              "(Optuna is not installed: no peer figure)")
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_tasks")

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        y = trial.suggest_int("y", 0, 1)
        code = f"import sys; sys.path.insert(0, {here!r}); import executor_tasks, json; " \
               f"print(json.dumps(executor_tasks.sweep_trial({x}, {y})))"
        return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout.split(":")[1].strip(" }\n"))

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    t = time.perf_counter()
    study.optimize(objective, n_trials=trials, n_jobs=2)
    peer = trials / (time.perf_counter() - t)
    print(f"  Optuna, a subprocess per trial (n_jobs=2): {peer:6.1f} trials/s   isorun.sweep: {rate:6.1f} trials/s "
          f"({rate / peer:4.2f}x), start: zygote {zygote:6.1f} trials/s ({zygote / peer:4.2f}x)")


def sklearn_fits(n: int) -> None:
    print(f"scikit-learn: {n} LogisticRegression fits on the digits, 2 at a time")
    cs = [0.01 * (i + 1) for i in range(n)]

    def warm_pool(threads: str | None) -> tuple[float, list[float]]:
        """A warm ProcessPoolExecutor(2), its workers started with these BLAS/OpenMP threads."""
        names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        saved = {k: os.environ.get(k) for k in names}
        if threads:
            os.environ.update(dict.fromkeys(names, threads))
        try:
            with cf.ProcessPoolExecutor(2) as warm:
                list(warm.map(executor_tasks.fit, [1.0, 1.0]))  # both workers started, sklearn imported
                t = time.perf_counter()
                got = list(warm.map(executor_tasks.fit, cs))
                return time.perf_counter() - t, got
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    oversubscribed_s, _ = warm_pool(None)
    warm_s, floor = warm_pool("1")
    with isorun.Executor(cpu_slots=2, standby=2, preload=["sklearn", "sklearn.linear_model", "sklearn.datasets"]) as ex:
        list(ex.map(executor_tasks.fit, [1.0, 1.0]))  # its standby interpreters launched
        t = time.perf_counter()
        got = list(ex.map(executor_tasks.fit, cs))
        isorun_s = time.perf_counter() - t
    assert got == floor
    with isorun.Executor(cpu_slots=2, standby=2, preload=["sklearn", "sklearn.linear_model", "sklearn.datasets"],
                         start="zygote") as ex:
        list(ex.map(executor_tasks.fit, [1.0, 1.0]))  # its zygote ready, scikit-learn imported once
        t = time.perf_counter()
        got = list(ex.map(executor_tasks.fit, cs))
        zygote_s = time.perf_counter() - t
    assert got == floor
    print(f"  warm ProcessPoolExecutor, 1 thread per worker (the floor):      {warm_s:6.2f} s")
    print(f"  warm ProcessPoolExecutor, BLAS threads left at every core:       {oversubscribed_s:6.2f} s "
          f"({oversubscribed_s / warm_s:4.2f}x)")
    print(f"  isorun Executor, a fresh interpreter per fit (its share: 1 thread): {isorun_s:6.2f} s "
          f"({isorun_s / warm_s:4.2f}x)")
    print(f"  isorun Executor, start=\"zygote\" (a worker forked per fit):       {zygote_s:6.2f} s "
          f"({zygote_s / warm_s:4.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=300.0)
    ap.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    a = ap.parse_args()
    n = 30 if a.quick else a.calls
    print(f"isorun {isorun.__version__}, Python {sys.version.split()[0]}, {len(os.sched_getaffinity(0))} cores")
    back_to_back(n)
    spaced(max(10, n // 4), a.gap_ms)
    sweep(40)
    sklearn_fits(20)


if __name__ == "__main__":
    main()
