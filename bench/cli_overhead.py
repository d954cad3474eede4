#!/usr/bin/env python3
"""The command line's fixed cost: `isorun --cpu -q -- PROGRAM` against PROGRAM alone.

Also a task run, `isorun --cpu -q hello` (the example task), which `isorun` hands to isorun-cli:
it has no floor of its own, so it is a figure to compare between builds (`--before`).

Runs are interleaved, so each figure has its floor from the same moments of the same run. Wall
time is what a user waits; CPU time (user + system, of isorun and everything it starts) is what
the start costs, and stays steady on a loaded machine where wall time does not.

    bench/cli_overhead.py [--isorun BUILD/bin/isorun] [--before OTHER/bin/isorun] [--runs N] [PROGRAM]

`--before` adds a second isorun (another build) to the same interleaving, for before/after
figures.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import time
from pathlib import Path

FLOOR = "program alone (floor)"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[int(q * (len(s) - 1))]


def main() -> None:
    here = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isorun", default=str(here / "build" / "bin" / "isorun"))
    p.add_argument("--before", help="another isorun to measure beside it")
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("program", nargs="?", default="/bin/true")
    a = p.parse_args()

    builds = {"before": a.before, "after": a.isorun} if a.before else {"": a.isorun}
    commands = {FLOOR: [a.program]}
    for name, isorun in builds.items():
        commands[f"isorun {name} -- PROGRAM".replace("  ", " ")] = [isorun, "--cpu", "-q", "--", a.program]
    for name, isorun in builds.items():
        commands[f"isorun {name} hello".replace("  ", " ")] = [isorun, "--cpu", "-q", "hello"]
    wall: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(a.runs):
        for name, cmd in commands.items():
            c0, t0 = children_cpu(), time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            wall[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name].append((children_cpu() - c0) * 1e3)

    print(f"`isorun --cpu -q -- {a.program}` and `isorun --cpu -q hello`, {a.runs} interleaved runs; "
          "median (p10, p90), ms")
    floor_wall, floor_cpu = statistics.median(wall[FLOOR]), statistics.median(cpu[FLOOR])
    for name in commands:
        w, c = wall[name], cpu[name]
        extra = ""
        if name.endswith("-- PROGRAM"):
            extra = (f"  +{statistics.median(w) - floor_wall:.2f} wall, "
                     f"+{statistics.median(c) - floor_cpu:.2f} CPU over the floor")
        print(f"  {name:26s} wall {statistics.median(w):6.2f} ({quantile(w, .1):.2f}, {quantile(w, .9):.2f})"
              f"  CPU {statistics.median(c):6.2f} ({quantile(c, .1):.2f}, {quantile(c, .9):.2f}){extra}")


if __name__ == "__main__":
    main()
