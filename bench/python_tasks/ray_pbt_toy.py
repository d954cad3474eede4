#!/usr/bin/env python3
"""Ray Tune's PBT on the PBT paper's toy problem (pbt_toy.py: its START, descend, quality), the
population and budget of bench/bench_pbt.py: 4 members, h = (1, 0) and (0, 1) twice each, theta
from (0.9, 0.9), --steps steps of --step-ms each, a checkpoint every 4 steps, decisions every
--interval steps (quantile 0.5; h0 and h1 perturbed x 0.8 or x 1.2, or drawn afresh from
uniform[0, 1] with probability 0.5). Each seed runs in each of --modes: "synch", Ray's
synchronous PBT (it decides once every trial has reached the step, as isorun does), and "async",
its default (a trial is ranked as it reaches the step, against the others' latest scores).

Run by bench/bench_pbt.py in an interpreter that has Ray (`--ray-python`; Ray is no dependency of
isorun's): it prints one JSON object, {"ray": version, "init_s": seconds, "runs": {mode: [{"seed",
"best", "wall", "trials", "exploits"}, ...]}}, and nothing else on stdout (Ray's own lines go to
stderr). Ray writes under a temporary folder, removed at the end, and is given a token
of its own, so that it writes none under ~/.ray.

    /work/venv-ray/bin/python bench/python_tasks/ray_pbt_toy.py [--seeds 5] [--modes synch,async]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report, no prompt
# Token authentication, as Ray's default, but with this run's token rather than ~/.ray/auth_token
# (which ray.init would write).
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

import numpy  # noqa: E402  (comes with Ray; tune.uniform draws from its generator)
import ray  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.schedulers import PopulationBasedTraining  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pbt_toy import CHECKPOINT_EVERY, START, descend, quality  # noqa: E402

FIRST_H = ((1.0, 0.0), (0.0, 1.0), (1.0, 0.0), (0.0, 1.0))
"""h of each member of the first population, as in bench_pbt.py's spec."""
MODES = ("synch", "async")
"""Ray's PBT decides synchronously (as isorun's) or asynchronously (its default)."""


def toy(config: dict[str, Any]) -> None:
    """pbt_toy.toy as a Ray Tune function trainable: Q reported each step, theta (and the step)
    in a checkpoint every CHECKPOINT_EVERY steps; a trial PBT made exploit another resumes from
    that one's checkpoint with the mutated config."""
    theta, start = list(START), 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = json.loads((Path(folder) / "state.json").read_text())
        theta, start = saved["theta"], saved["step"]
    q = quality(theta)
    for step in range(start + 1, config["steps"] + 1):
        if config["step_s"]:
            time.sleep(config["step_s"])  # the step's work
        theta = descend(theta, config["h0"], config["h1"], config["lr"])
        q = quality(theta)
        if step % CHECKPOINT_EVERY == 0:
            with tempfile.TemporaryDirectory() as folder:
                (Path(folder) / "state.json").write_text(json.dumps({"theta": theta, "step": step}))
                tune.report({"step": step, "q": q}, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report({"step": step, "q": q})
    if start >= config["steps"]:
        tune.report({"step": start, "q": q})  # resumed at the end: what it holds (pbt_toy returns it)


def population(storage: str, args: argparse.Namespace, seed: int, synch: bool) -> dict[str, Any]:
    """One PBT run of the population; its best final Q, wall time (Tuner.fit), trials and exploits.
    Every trial must end at the last step (the same budget as isorun's members)."""
    # Ray's PBT draws from Python's generator and tune.uniform from numpy's, both in this process
    # (the driver); no seed makes it repeatable: its decisions follow the order results come in.
    random.seed(seed)
    numpy.random.seed(seed)
    scheduler = PopulationBasedTraining(
        time_attr="step", perturbation_interval=args.interval, quantile_fraction=0.5,
        resample_probability=0.5, hyperparam_mutations={"h0": tune.uniform(0, 1), "h1": tune.uniform(0, 1)},
        synch=synch)
    param_space = {
        "member": tune.grid_search(list(range(len(FIRST_H)))),
        "h0": tune.sample_from(lambda config: FIRST_H[config["member"]][0]),
        "h1": tune.sample_from(lambda config: FIRST_H[config["member"]][1]),
        "steps": args.steps, "lr": 0.05, "step_s": args.step_ms / 1000,
    }
    tuner = tune.Tuner(
        toy, param_space=param_space,
        tune_config=tune.TuneConfig(metric="q", mode="max", scheduler=scheduler, reuse_actors=True),
        run_config=tune.RunConfig(name=f"{'synch' if synch else 'async'}-{seed}", storage_path=storage, verbose=0))
    start = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - start
    if results.errors:
        raise RuntimeError(f"seed {seed}: trials failed: {results.errors}")
    final = [results[i].metrics or {} for i in range(len(results))]  # each trial's last report
    if any(metrics.get("step") != args.steps for metrics in final):
        raise RuntimeError(f"seed {seed}: a trial ended short of step {args.steps}: {final}")
    log = Path(results.experiment_path) / "pbt_global.txt"  # one line per exploit
    return {"seed": seed, "best": max(metrics["q"] for metrics in final), "wall": wall, "trials": len(results),
            "exploits": len(log.read_text().splitlines()) if log.exists() else 0}


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Ray's and Tune's lines go to stderr (at the descriptor level), so that stdout holds the
    JSON object alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated, of: synch (Ray's synchronous PBT), async (its default)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes: of {', '.join(MODES)}")
    work = tempfile.mkdtemp(prefix="isorun-bench-ray-")
    try:
        with stdout_to_stderr():
            start = time.perf_counter()
            # 4 CPUs: the 4 members at once, as isorun's cpu_slots: 4 (on however many cores).
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                     _temp_dir=os.path.join(work, "ray"))
            init_s = time.perf_counter() - start
            try:
                runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
                for seed in range(args.seeds):  # the modes interleaved, as bench_pbt.py's runs
                    for mode in modes:
                        runs[mode].append(population(os.path.join(work, "tune"), args, seed, mode == "synch"))
            finally:
                ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"ray": ray.__version__, "init_s": init_s, "runs": runs}))


if __name__ == "__main__":
    main()
