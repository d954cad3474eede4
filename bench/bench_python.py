#!/usr/bin/env python3
"""isorun for Python against its peers, side by side in one run (docs/python.md; bench/README.md).

  trivial call in a fresh process: isorun cold, standby, standby with preload=["numpy"] (the
    function uses numpy), the same with early_result=True; multiprocessing spawn (a Process per
    call; Pool(maxtasksperchild=1));
    `python3 -c` with the same imports, for the cold call's goal
  1 GiB numpy result: isorun on a standby interpreter (zero-copy in the caller), multiprocessing
    Pool, and memcpy; "the function alone" is what the function itself takes, here

  with --gpu (PyTorch with CUDA): a trivial PyTorch CUDA function on a warm standby interpreter
    (preload=["torch"], warm_context=True, under mem_limit) against torch.multiprocessing spawn
    doing the same in a fresh Process

Each line: median, p10 and p90 of N calls, in ms. Run from the repository root with the package
importable (`pip install .`, or PYTHONPATH=build/python after a CMake build):

    python3 bench/bench_python.py [--reps 30] [--big-reps 5] [--gib 1] [--gpu]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import isorun


def trivial():
    return 1


def with_numpy():
    import numpy

    return float(numpy.ones(4).sum())


def big_array(nbytes):
    import numpy

    a = numpy.empty(nbytes // 8, dtype=numpy.float64)
    a.fill(1.0)
    return a


def torch_trivial():
    """A trivial PyTorch CUDA function: a tensor on the device and its sum back."""
    import torch

    return float(torch.ones(4, device="cuda").sum())


def _process_target(q, fn, args):
    q.put(fn(*args))


def spawn_process_call(ctx, fn, *args):
    """A fresh spawn Process per call, its result through a Queue (what multiprocessing offers)."""
    q = ctx.Queue()
    p = ctx.Process(target=_process_target, args=(q, fn, args))
    p.start()
    r = q.get()
    p.join()
    return r


def percentiles(ms):
    s = sorted(ms)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return statistics.median(s), q[0], q[-1]


def guard(name: str, value: float, op: str, goal: float) -> None:
    """A line tools/bench-check.sh reads: a figure against its goal."""
    print(f"guard: {name} {value:.4f} {op} {goal:g}")


def timed(label, fn, reps, before=None):
    out = []
    for _ in range(reps):
        if before:
            before()  # not timed: e.g. let the standby pool refill
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    med, p10, p90 = percentiles(out)
    print(f"{label:<58} median {med:9.2f} ms   p10 {p10:9.2f}   p90 {p90:9.2f}", flush=True)
    return med


def default_section(args) -> None:
    """What the obvious code gets: isolated(f)() and isorun.map(f, inputs) with no options,
    against concurrent.futures.ProcessPoolExecutor with max_tasks_per_child=1 (a fresh process per
    task too), spaced and back to back, in this program's first calls."""
    reps, gap = args.reps, args.spaced
    print(f"the default, isolated(f)() with no options (f uses numpy); calls {gap * 1000:.0f} ms apart, or back to back")
    f = isorun.isolated(with_numpy)
    t = time.perf_counter()
    f()
    first = (time.perf_counter() - t) * 1e3
    print(f"{'isorun default, the first call of the program':<58} {first:9.2f} ms")
    spaced = lambda: time.sleep(gap)  # noqa: E731
    d_spaced = timed("isorun default, spaced", f, reps, before=spaced)
    d_b2b = timed("isorun default, back to back", f, reps)
    # Without waiting for the worker's exit (as ProcessPoolExecutor does not wait for its own):
    early = isorun.isolated(with_numpy, early_result=True)
    d_early = timed("isorun default + early_result=True, spaced", early, reps, before=spaced)
    with cf.ProcessPoolExecutor(1, max_tasks_per_child=1) as ppe:
        ppe.submit(with_numpy).result()
        p_spaced = timed("ProcessPoolExecutor(1, max_tasks_per_child=1), spaced",
                         lambda: ppe.submit(with_numpy).result(), reps, before=spaced)
        p_b2b = timed("ProcessPoolExecutor(1, max_tasks_per_child=1), back to back",
                      lambda: ppe.submit(with_numpy).result(), reps)
    cores = os.cpu_count() or 1
    n = 200
    maps = []
    for _ in range(3):
        t = time.perf_counter()
        assert all(r.ok for r in isorun.map(trivial_arg, range(n)))
        i_rate = n / (time.perf_counter() - t)
        with cf.ProcessPoolExecutor(cores, max_tasks_per_child=1) as ppe:
            t = time.perf_counter()
            list(ppe.map(trivial_arg, range(n)))
            p_rate = n / (time.perf_counter() - t)
        maps.append((i_rate, p_rate))
    i_rate = statistics.median(m[0] for m in maps)
    p_rate = statistics.median(m[1] for m in maps)
    print(f"{'isorun.map(f, range(200)), no options':<58} {i_rate:9.1f} calls/s (runs: "
          f"{', '.join(f'{m[0]:.0f}' for m in maps)})")
    print(f"{f'ProcessPoolExecutor({cores}, max_tasks_per_child=1).map':<58} {p_rate:9.1f} calls/s (runs: "
          f"{', '.join(f'{m[1]:.0f}' for m in maps)})")
    print(f"  default spaced / PPE fresh spaced {d_spaced / p_spaced:.2f}x (goal <= 1.5x; with early_result "
          f"{d_early / p_spaced:.2f}x); back to back: "
          f"{p_b2b / d_b2b:.2f}x PPE fresh's throughput (goal >= 3x); map {i_rate / p_rate:.2f}x PPE fresh's "
          f"(goal >= 3x)")
    guard("python.default_spaced_over_ppe_fresh", d_spaced / p_spaced, "<=", 1.5)
    guard("python.default_b2b_throughput_over_ppe_fresh", p_b2b / d_b2b, ">=", 3)
    guard("python.default_map_over_ppe_fresh", i_rate / p_rate, ">=", 3)
    isorun.stop_standby()


def trivial_arg(x):
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30, help="calls per trivial-call line")
    ap.add_argument("--big-reps", type=int, default=5, help="calls per large-result line")
    ap.add_argument("--gib", type=float, default=1.0, help="size of the large result, GiB")
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds between standby calls (untimed) for the replacement interpreter to get "
                         "ready, as it would between a program's calls")
    ap.add_argument("--spaced", type=float, default=0.3, help="seconds between the default's spaced calls")
    ap.add_argument("--default-only", action="store_true", help="only the default's lines")
    ap.add_argument("--gpu", action="store_true",
                    help="only the GPU figure: PyTorch on a warm standby interpreter against torch.multiprocessing")
    args = ap.parse_args()
    if args.gpu:
        gpu_figure(args)
        return
    ctx = mp.get_context("spawn")
    reps = args.reps
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {reps} calls per line "
          f"({args.big_reps} for the large result)\n")

    default_section(args)
    if args.default_only:
        return

    print("\ntrivial call in a fresh process, each way pinned (start=\"exec\": an exec'd interpreter per worker)")
    cold = isorun.isolated(trivial, start="exec")
    timed("isorun cold", cold, reps)
    standby = isorun.isolated(trivial, standby=1, start="exec")
    standby.warm_up()
    settle = lambda: time.sleep(args.settle)  # noqa: E731
    med_standby = timed("isorun standby", standby, reps, before=settle)
    np_standby = isorun.isolated(with_numpy, standby=1, preload=["numpy"], start="exec")
    np_standby.warm_up()
    med_np_standby = timed('isorun standby, preload=["numpy"], function uses numpy', np_standby, reps,
                           before=settle)
    # The same, its result handed over before the interpreter's exit (early_result): the exit of
    # an interpreter with numpy loaded is a millisecond or more, off the call's path here.
    np_early = isorun.isolated(with_numpy, standby=1, preload=["numpy"], early_result=True, start="exec")
    np_early.warm_up()
    med_np_early = timed('isorun standby, preload=["numpy"], early_result=True', np_early, reps, before=settle)
    np_cold = isorun.isolated(with_numpy, start="exec")
    med_np_cold = timed("isorun cold, function uses numpy", np_cold, reps)
    med_spawn = timed("multiprocessing spawn Process, function uses numpy",
                      lambda: spawn_process_call(ctx, with_numpy), reps)
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        pool.apply(trivial)
        timed("multiprocessing spawn Pool(maxtasksperchild=1), numpy", lambda: pool.apply(with_numpy), reps)
    med_c = timed('python3 -c "import numpy" (a bare interpreter, same import)',
                  lambda: subprocess.run([sys.executable, "-c", "import numpy"], check=True), reps)
    isorun.stop_standby()

    nbytes = int(args.gib * (1 << 30))
    print(f"\n{args.gib:g} GiB numpy result")
    # On a standby interpreter with numpy imported, so that the figure is the result's way back,
    # not the interpreter's start.
    big = isorun.isolated(big_array, standby=1, preload=["numpy"], start="exec")
    # The caller's segment pool as it is by default: a segment released lately lingers (up to
    # 2 GiB, for ISORUN_IDLE seconds), so the result's pages are warm from the second call on.
    big.warm_up()
    big(nbytes)  # the segment pool's first use: later calls reuse its resident pages
    med_big = timed("isorun, standby+preload (zero-copy in the caller)", lambda: big(nbytes), args.big_reps,
                    before=settle)
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        timed("multiprocessing spawn Pool(maxtasksperchild=1)", lambda: pool.apply(big_array, (nbytes,)),
              args.big_reps)
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    dst.fill(0)
    med_memcpy = timed("memcpy (np.copyto into resident memory)", lambda: np.copyto(dst, src), args.big_reps)
    producer = timed("(the function alone, in this process: allocate and fill)", lambda: big_array(nbytes),
                     args.big_reps)

    print("\ngoals")
    print(f"  standby+preload call {med_np_early:.2f} ms with early_result, {med_np_standby:.2f} ms waiting for the "
          f"exit (goal <= 2 ms); {med_spawn / med_np_early:.0f}x faster than a spawn Process (goal >= 20x)")
    print(f"  cold call with numpy {med_np_cold:.1f} ms = {med_np_cold / med_c:.2f}x python3 -c (goal <= 1.2x)")
    print(f"  {args.gib:g} GiB result {med_big:.0f} ms, of which the function itself ~{producer:.0f} ms; "
          f"transfer ~{max(med_big - producer, 0.01):.0f} ms vs memcpy {med_memcpy:.0f} ms "
          f"= {med_memcpy / max(med_big - producer, 0.01):.2f}x memcpy (goal >= 0.5x)")
    print(f"  (standby call without numpy: {med_standby:.2f} ms)")
    # The figures tools/bench-check.sh guards (each past twice its goal fails CI).
    guard("python.spawn_process_over_standby_early", med_spawn / med_np_early, ">=", 20)
    guard("python.cold_numpy_over_python_c", med_np_cold / med_c, "<=", 1.2)


def gpu_figure(args) -> None:
    """A trivial PyTorch CUDA call: warm standby interpreter against torch.multiprocessing spawn,
    with the worker's exit (its CUDA context's teardown) waited for, the default, and with
    ``early_result=True``, which hands the result over before that teardown."""
    import torch
    import torch.multiprocessing as tmp

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{args.reps} calls per isorun line\n")
    # The replacement interpreter imports torch and makes its context between calls: seconds.
    settle = lambda: time.sleep(max(args.settle, 6.0))  # noqa: E731
    meds = {}
    for label, early in (("exit waited for (the default)", False), ("early_result=True", True)):
        warm = isorun.isolated(torch_trivial, gpu=0, mem_limit="4G", standby=1, preload=["torch"], warm_context=True,
                               early_result=early)
        warm.warm_up()
        warm()  # the first call may wait for its interpreter's imports; later ones find them done
        meds[early] = timed(f'isorun standby, preload=["torch"], warm_context, {label}', warm, args.reps,
                            before=settle)
        isorun.stop_standby()
    ctx = tmp.get_context("spawn")
    reps = max(3, args.reps // 10)  # seconds each
    med_spawn = timed("torch.multiprocessing spawn Process, same function",
                      lambda: spawn_process_call(ctx, torch_trivial), reps)
    for early, med in meds.items():
        print(f"goal: warm standby PyTorch call, {'early_result' if early else 'exit waited for'}: {med:.1f} ms "
              f"(goal <= 20 ms) against spawn {med_spawn:.0f} ms ({med_spawn / med:.0f}x, goal >= 50x)")

if __name__ == "__main__":
    main()
