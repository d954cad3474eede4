#!/usr/bin/env python3
"""Search through isorun against Optuna's own loop, in one run (docs/sweeps.md#search;
bench/README.md "Search").

  quality: Branin, Hartmann-6 and a 5-parameter synthetic training objective, with noise, 100
    trials on 4 parallel slots, --seeds seeds: the best loss found by TPE through isorun
    (search: {type: optuna, sampler: tpe}), by Optuna's own study.optimize(n_jobs=4) with the
    same sampler (constant_liar, as isorun runs it), and by isorun's random search (random:, the
    same budget). isorun's TPE against Optuna's: a two-sided Mann-Whitney U test (same
    distribution: p well above 0.05); against random: the medians.
  overhead: what isorun spends per trial on the protocol (an ask and a tell to a searcher that
    answers at once, against the same trials from a list), and what TPE itself takes per
    ask+tell at 100 trials (Optuna in-process: the searcher's own cost, paid whoever runs it).

    PYTHONPATH=build/python python3 bench/bench_search.py [--seeds 10] [--quick] [--only quality|overhead]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "python_tasks"))
import search_objectives as objectives  # noqa: E402
from quiet import sweep  # noqa: E402

import isorun  # noqa: E402

optuna = __import__("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

MODULE = os.path.join(HERE, "python_tasks", "search_objectives.py")


def quantiles(values: list[float]) -> str:
    s = sorted(values)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return f"{statistics.median(s):9.4f} [{q[0]:8.4f}, {q[-1]:8.4f}]"


def isorun_search(function: str, seed: int, trials: int, slots: int, work: str) -> float:
    spec = {
        "python": f"{MODULE}:{function}",
        "params": {"seed": seed},
        "metric": {"name": "loss", "goal": "minimize"},
        "search": {"type": "optuna", "sampler": "tpe", "seed": seed, "trials": trials,
                   "params": objectives.SPACES[function]},
        "resources": {"cpu_slots": slots, "start": "zygote"},
        "out": os.path.join(work, f"tpe-{function}-{seed}"),
    }
    records = sweep(spec)
    return min(r["result"]["loss"] for r in records if r["outcome"] == "success")


def random_params(space: dict) -> dict:
    out = {}
    for name, d in space.items():
        if "categorical" in d:
            out[name] = {"choice": d["categorical"]}
        elif "int" in d:
            lo, hi = d["int"]
            out[name] = {"choice": [v for v in (2 ** k for k in range(0, 12)) if lo <= v <= hi]}
        else:
            out[name] = {"loguniform" if d.get("log") else "uniform": d["float"]}
    return out


def isorun_random(function: str, seed: int, trials: int, slots: int, work: str) -> float:
    spec = {
        "python": f"{MODULE}:{function}",
        "params": {"seed": [seed]},
        "metric": {"name": "loss", "goal": "minimize"},
        "random": {"count": trials, "seed": seed, "params": random_params(objectives.SPACES[function])},
        "resources": {"cpu_slots": slots, "start": "zygote"},
        "out": os.path.join(work, f"random-{function}-{seed}"),
    }
    records = sweep(spec)
    return min(r["result"]["loss"] for r in records if r["outcome"] == "success")


def suggest(trial, name: str, d: dict):
    if "categorical" in d:
        return trial.suggest_categorical(name, d["categorical"])
    if "int" in d:
        return trial.suggest_int(name, *d["int"], log=bool(d.get("log")))
    return trial.suggest_float(name, *d["float"], log=bool(d.get("log")))


def optuna_search(function: str, seed: int, trials: int, slots: int) -> float:
    space = objectives.SPACES[function]
    fn = objectives.FUNCTIONS[function]

    def objective(trial):
        return fn(**{name: suggest(trial, name, d) for name, d in space.items()}, seed=seed)["loss"]

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, constant_liar=slots > 1))
    study.optimize(objective, n_trials=trials, n_jobs=slots)
    return study.best_value


NULL_SEARCHER = r"""
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["op"] == "ask":
        print(json.dumps({"params": {"x": m["number"] * 0.001}}), flush=True)
    else:
        print("{}", flush=True)
"""


def overhead(trials: int, work: str) -> None:
    searcher = os.path.join(work, "null_searcher.py")
    with open(searcher, "w") as f:
        f.write(NULL_SEARCHER)
    base = {"python": f"{MODULE}:branin", "params": {"x2": 2.0}, "metric": {"name": "loss", "goal": "minimize"},
            "resources": {"cpu_slots": 2, "start": "zygote"}}
    walls: dict[str, list[float]] = {"list": [], "search": []}
    for rep in range(3):
        listed = dict(base, params={"x2": [2.0], "x1": [i * 0.001 for i in range(trials)]},
                      out=os.path.join(work, f"list-{rep}"))
        t = time.perf_counter()
        sweep(listed)
        walls["list"].append(time.perf_counter() - t)
        searched = dict(base, search={"type": "command", "command": [sys.executable, searcher], "params": ["x1"],
                                      "trials": trials}, out=os.path.join(work, f"null-{rep}"))
        searched["params"] = {"x2": 2.0}
        # (the null searcher proposes x, which branin calls x1: renamed in its answer below)
        with open(searcher, "w") as f:
            f.write(NULL_SEARCHER.replace('"x"', '"x1"'))
        t = time.perf_counter()
        sweep(searched)
        walls["search"].append(time.perf_counter() - t)
    per = (statistics.median(walls["search"]) - statistics.median(walls["list"])) / trials * 1e3
    print(f"overhead: {trials} trivial trials, 2 slots, zygote, 3 reps: from a list {statistics.median(walls['list']):.2f} s, "
          f"from a searcher that answers at once {statistics.median(walls['search']):.2f} s")
    print(f"  isorun's protocol per trial (an ask and a tell, each fsync'ed to search.jsonl): {per:.2f} ms; goal <= 5 ms")
    # TPE's own cost per ask+tell, in-process, over 100 trials of Branin.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, constant_liar=True))
    space = {"x1": optuna.distributions.FloatDistribution(-5, 10), "x2": optuna.distributions.FloatDistribution(0, 15)}
    costs = []
    for _ in range(100):
        t = time.perf_counter()
        trial = study.ask(space)
        value = objectives.branin(**trial.params)["loss"]
        study.tell(trial, value)
        costs.append((time.perf_counter() - t) * 1e3)
    print(f"  Optuna TPE's own ask+tell (in-process, trials 1-100): median {statistics.median(costs):.2f} ms, "
          f"last 10 {statistics.median(costs[-10:]):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("quality", "overhead"), help="run one part alone")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.trials = 2, 30
    from scipy.stats import mannwhitneyu

    with tempfile.TemporaryDirectory(prefix="isorun-bench-search-") as work:
        if args.only == "overhead":
            overhead(args.trials, work)
            return
        print(f"quality: best loss after {args.trials} trials on {args.slots} slots, {args.seeds} seeds "
              f"(median [p10, p90])")
        print(f"  {'function':<10} {'isorun TPE':>30} {'Optuna TPE (study.optimize)':>30} {'isorun random':>30}  "
              f"U-test p  TPE < random")
        for function in ("branin", "hartmann6", "training"):
            ours, theirs, rand = [], [], []
            t = time.perf_counter()
            for seed in range(args.seeds):
                ours.append(isorun_search(function, seed, args.trials, args.slots, work))
                theirs.append(optuna_search(function, seed, args.trials, args.slots))
                rand.append(isorun_random(function, seed, args.trials, args.slots, work))
            p = mannwhitneyu(ours, theirs, alternative="two-sided").pvalue
            better = statistics.median(ours) < statistics.median(rand)
            print(f"  {function:<10} {quantiles(ours):>30} {quantiles(theirs):>30} {quantiles(rand):>30}  "
                  f"{p:8.3f}  {'yes' if better else 'no'}   ({time.perf_counter() - t:.0f} s)", flush=True)
        if args.only != "quality":
            overhead(args.trials, work)


if __name__ == "__main__":
    main()
