#!/usr/bin/env python3
"""Calls in numbers from Python (bench/README.md "Calls at scale"), each beside its peer in one run:

  queued: N calls queued on isorun.Executor(cpu_slots=1) behind one running call (it blocks on a
    FIFO): threads in the caller, each submit, memory per queued call, the caller's CPU while they
    wait, shutdown(cancel_futures=True); beside concurrent.futures.ProcessPoolExecutor(1) doing
    the same.
  imap: isorun.imap over a generator of M trivial inputs (start="zygote", the fastest start the
    package offers for a pure-Python function): the caller's RSS growth, and the throughput of the
    last 10 % of the results against the first 10 %.
  sweep: `isorun sweep` of N trials of the example task `hello` on 2 CPU slots: trials/s, the
    last 10 % against the first 10 % (from the journal's start and wall times), the resume of
    the finished sweep (nothing to run) and `isorun report`.

Run from the repository root with the package importable:

    python3 bench/bench_scale.py [--queued 100000] [--imap 20000] [--sweep 100000]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_tasks"))
import executor_tasks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import isorun  # noqa: E402


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE") / (1 << 20)


def cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def hold(path: str) -> str:
    """Runs until the FIFO `path` is opened for writing."""
    with open(path) as f:
        return f.read()


def queued(label: str, make, n: int, fifo: str) -> None:
    """N submits behind one running call of `make()`'s executor, then a cancelling shutdown."""
    before_threads, before_rss = threads(), rss_mib()
    ex = make()
    running = ex.submit(hold, fifo)
    futures = []
    submit_us = []
    t_all = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        futures.append(ex.submit(executor_tasks.square, i))
        submit_us.append((time.perf_counter() - t) * 1e6)
    all_s = time.perf_counter() - t_all
    held_threads, held_rss = threads(), rss_mib()
    c0, w0 = cpu_s(), time.perf_counter()
    time.sleep(1.0)  # the caller waits: what does waiting cost it?
    idle = (cpu_s() - c0) / (time.perf_counter() - w0)
    t = time.perf_counter()
    ex.shutdown(wait=False, cancel_futures=True)
    cancel_ms = (time.perf_counter() - t) * 1e3
    cancelled_at_once = sum(f.cancelled() for f in futures)
    with open(fifo, "w") as f:
        f.write("go")
    running.result()
    ex.shutdown(wait=True)
    cancelled = sum(f.cancelled() for f in futures)
    q = statistics.quantiles(submit_us, n=10)
    print(f"{label}")
    print(f"  threads in the caller        {before_threads} before, {held_threads} with them queued   "
          f"goal <= cores + 16 ({os.cpu_count()} cores)")
    print(f"  each submit                  median {statistics.median(submit_us):.1f} us (p10 {q[0]:.1f}, "
          f"p90 {q[-1]:.1f}); all {all_s:.2f} s   goal <= 50 us")
    print(f"  memory per queued call       {(held_rss - before_rss) * (1 << 20) / n:.0f} bytes "
          f"(RSS +{held_rss - before_rss:.0f} MiB)   goal <= 2 KiB")
    print(f"  caller CPU while they wait   {idle * 100:.2f} % of a core   goal <= 1 %")
    print(f"  shutdown(cancel_futures)     {cancel_ms:.0f} ms, {cancelled_at_once} of {n} cancelled when it "
          f"returned, {cancelled} in the end   goal <= 1 s", flush=True)


def imap_line(m: int) -> None:
    before = rss_mib()
    done = 0
    stamps = []
    peak = before
    t0 = time.perf_counter()
    for r in isorun.imap(executor_tasks.square, (i for i in range(m)), start="zygote"):
        assert r.ok
        done += 1
        stamps.append(time.perf_counter())
        if done % 1000 == 0:
            peak = max(peak, rss_mib())
    total = time.perf_counter() - t0
    tenth = max(1, m // 10)
    first = tenth / (stamps[tenth - 1] - t0)
    last = tenth / (stamps[-1] - stamps[-tenth - 1])
    print(f"isorun.imap(square, <generator of {m}>, start=\"zygote\")")
    print(f"  {m / total:.0f} calls/s in all ({total:.1f} s)")
    print(f"  throughput, last 10 % / first 10 %   {last:.0f} / {first:.0f} calls/s = {last / first:.2f}   "
          "goal >= 0.9")
    print(f"  caller RSS growth            {peak - before:.1f} MiB (the stamps list: "
          f"{m * 32 / (1 << 20):.1f} MiB of it)   goal <= 100 MB", flush=True)


def sweep_line(n: int, cli: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        names = ", ".join(f"t{i}" for i in range(n))
        with open(os.path.join(tmp, "spec.yaml"), "w") as f:
            f.write(f"task: hello\nparams:\n  name: [{names}]\nresources: {{cpu_slots: 2}}\nout: {tmp}/out\n")
        timed = []
        for args in (["sweep", f"{tmp}/spec.yaml", "--no-progress"], ["sweep", f"{tmp}/spec.yaml", "--no-progress"],
                     ["report", f"{tmp}/out"]):
            t = time.perf_counter()
            r = subprocess.run([cli] + args, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{cli} {' '.join(args)} failed ({r.returncode}): {r.stderr}")
            timed.append(time.perf_counter() - t)
        with open(os.path.join(tmp, "out", "results.jsonl")) as f:
            ends = sorted(r["start_s"] + r["wall_s"] for r in map(json.loads, f))
    if len(ends) != n:
        sys.exit(f"isorun sweep journaled {len(ends)} trials of {n}")
    tenth = max(1, n // 10)
    first = tenth / ends[tenth - 1]
    last = tenth / (ends[-1] - ends[-tenth - 1])
    print(f"isorun sweep: {n} trials of hello on 2 CPU slots")
    print(f"  {n / timed[0]:.0f} trials/s in all ({timed[0]:.1f} s)")
    print(f"  trials/s, last 10 % / first 10 %    {last:.0f} / {first:.0f} = {last / first:.2f}   goal >= 0.9")
    print(f"  resume with nothing to run   {timed[1]:.2f} s")
    print(f"  isorun report                {timed[2]:.2f} s")
    print(f"guard: scale.sweep_last_over_first_trials_per_s {last / first:.3f} >= 0.9", flush=True)


def future_floor(n: int) -> None:
    """What a bare concurrent.futures.Future costs."""
    before = rss_mib()
    held = [cf.Future() for _ in range(n)]
    print("a bare concurrent.futures.Future (the peer's; an isorun future makes its Condition, most of it, only "
          f"once waited on): {(rss_mib() - before) * (1 << 20) / len(held):.0f} bytes", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queued", type=int, default=100_000, help="calls queued behind the running one")
    ap.add_argument("--imap", type=int, default=20_000, help="inputs of the imap line (0: skip it)")
    ap.add_argument("--sweep", type=int, default=100_000, help="trials of the sweep line (0: skip it)")
    ap.add_argument("--isorun", default=os.path.join(ROOT, "build", "bin", "isorun"), help="the CLI, for the sweep line")
    ap.add_argument("--section", choices=["isorun", "peer", "future", "imap", "sweep"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.section is None:
        # Each section in a process of its own: memory one freed would be reused by the next.
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores\n", flush=True)
        sections = (("isorun", "peer", "future") if args.queued else ()) + (("imap",) if args.imap else ())
        per_call = {}
        for section in sections:
            out = subprocess.run([sys.executable, __file__, "--queued", str(args.queued), "--imap", str(args.imap),
                                  "--section", section], check=True, stdout=subprocess.PIPE, text=True).stdout
            print(out, end="", flush=True)
            found = re.search(r"memory per queued call\s+(\d+) bytes", out)
            if found:
                per_call[section] = int(found.group(1))
        if "isorun" in per_call and "peer" in per_call:
            # (The goal is 2 KiB a call; the peer's, a bare future and its work item, is about that.)
            print(f"guard: scale.queued_bytes_over_peer {per_call['isorun'] / per_call['peer']:.3f} <= 1", flush=True)
        if args.sweep:
            print()
            sweep_line(args.sweep, args.isorun)
        return
    if args.section == "future":
        future_floor(args.queued)
    elif args.section == "imap":
        print()
        imap_line(args.imap)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            fifo = os.path.join(tmp, "hold")
            os.mkfifo(fifo)
            if args.section == "isorun":
                queued(f"{args.queued} calls queued behind one running call, isorun.Executor(cpu_slots=1)",
                       lambda: isorun.Executor(cpu_slots=1), args.queued, fifo)
            else:
                queued("the same, concurrent.futures.ProcessPoolExecutor(1) (the peer)",
                       lambda: cf.ProcessPoolExecutor(1), args.queued, fifo)

if __name__ == "__main__":
    main()
