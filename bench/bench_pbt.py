#!/usr/bin/env python3
"""Population-based training on the PBT paper's toy problem, in one run (docs/sweeps.md#population-based-training;
bench/README.md "Population-based training").

bench/python_tasks/pbt_toy.py: maximize Q(theta) = 1.2 - |theta|^2 by gradient steps on a
surrogate weighted by h, from theta = (0.9, 0.9); a population of 4 (h = (1, 0) and (0, 1), twice
each), --steps steps each: the best Q reached by the population with PBT (decisions every
--interval steps, h mutated: perturbed, or drawn afresh from [0, 1] half the time) against the same
population without exploit and explore (its best is 0.39: each member shrinks one coordinate),
over --seeds seeds, with the wall time and the trials PBT made. Ray Tune's PBT runs on the same
problem and budget (bench/python_tasks/ray_pbt_toy.py), synchronous (deciding as isorun does) and
asynchronous (its default), in --ray-python: an interpreter that has Ray, such as a venv's (Ray is
no dependency of isorun's); by default this one, where Ray is installed; skipped where it is not.

    PYTHONPATH=build/python python3 bench/bench_pbt.py [--seeds 5] [--ray-python /work/venv-ray/bin/python]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.join(HERE, "python_tasks", "pbt_toy.py")
RAY_TOY = os.path.join(HERE, "python_tasks", "ray_pbt_toy.py")
sys.path.insert(0, os.path.join(HERE, "python_tasks"))
from quiet import sweep as quiet_sweep  # noqa: E402

RAY_MODES = {"synch": "synchronous", "async": "default (asynchronous)"}
"""How Ray's PBT decides, in ray_pbt_toy.py's --modes, and the words for each in the table."""


def population(out: str, args: argparse.Namespace, pbt: bool, seed: int) -> dict[str, Any]:
    """One sweep of the population, with PBT or without; its best Q, wall time and trials."""
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


def ray_python(args: argparse.Namespace) -> Optional[str]:
    """The interpreter to run Ray Tune in: --ray-python, or this one where Ray is installed."""
    if args.ray_python:
        return args.ray_python
    return sys.executable if importlib.util.find_spec("ray") is not None else None


def ray_pbt(args: argparse.Namespace) -> tuple[Optional[dict[str, Any]], str]:
    """Ray Tune's PBT on the same problem and budget (ray_pbt_toy.py, in its own interpreter): its
    figures (None where Ray is not there or failed) and a line saying where it ran, or why not."""
    python = ray_python(args)
    if python is None:
        return None, "Ray is not installed here: no Ray Tune figure (--ray-python: an interpreter that has it)"
    if subprocess.run([python, "-c", "import ray"], capture_output=True).returncode != 0:
        return None, f"Ray is not installed in {python}: no Ray Tune figure"
    run = subprocess.run([python, RAY_TOY, "--seeds", str(args.seeds), "--steps", str(args.steps),
                          "--interval", str(args.interval), "--step-ms", str(args.step_ms),
                          "--modes", args.ray_modes], capture_output=True, text=True)
    if run.returncode != 0:
        tail = "\n    ".join(run.stderr.strip().splitlines()[-8:])
        return None, f"Ray Tune's run failed (exit {run.returncode}): no Ray Tune figure\n    {tail}"
    figures = json.loads(run.stdout)
    return figures, f"Ray {figures['ray']} in {python}; ray.init {figures['init_s']:.1f} s once, not in the walls"


def row(label: str, runs: list[dict[str, Any]], trials: str = "") -> str:
    """A line of the table: best Q median [min, max], median wall time and trials."""
    best = [r["best"] for r in runs]
    trials = trials or f"{statistics.median(r['trials'] for r in runs):g}"
    return (f"  {label:<39} Q {statistics.median(best):.4f} [{min(best):.4f}, {max(best):.4f}]  "
            f"wall {statistics.median(r['wall'] for r in runs):.1f} s  trials {trials}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--ray-python", help="a Python that has Ray (default: this one, where it has)")
    parser.add_argument("--ray-modes", default=",".join(RAY_MODES),
                        help="how Ray's PBT decides: synch, async or both (comma-separated)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="isorun-bench-pbt-") as work:
        with_pbt, without = [], []
        for seed in range(args.seeds):
            with_pbt.append(population(os.path.join(work, f"pbt-{seed}"), args, True, seed))
            without.append(population(os.path.join(work, f"plain-{seed}"), args, False, seed))
    ray_figures, where = ray_pbt(args)
    print(f"PBT toy (Jaderberg et al. 2017): population 4, {args.steps} steps of {args.step_ms:g} ms, decisions every "
          f"{args.interval} steps, {args.seeds} seeds; best Q (max 1.2), median [min, max]")
    print(row("with PBT", with_pbt))
    print(row("same population, no exploit/explore", without))
    for mode, runs in (ray_figures["runs"] if ray_figures else {}).items():
        exploits = statistics.median(r["exploits"] for r in runs)
        print(row(f"Ray Tune's PBT, {RAY_MODES[mode]}", runs,
                  f"{statistics.median(r['trials'] for r in runs):g} ({exploits:g} exploits, in place)"))
    print(f"  {where}")


if __name__ == "__main__":
    main()
