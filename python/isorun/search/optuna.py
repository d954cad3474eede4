"""Optuna's samplers as an isorun searcher: ``python -m isorun.search.optuna`` (docs/sweeps.md#search).

It speaks isorun's searcher protocol on stdin and stdout, one JSON object per line, one answer
per message: ``hello`` (the search's settings: sampler, seed, the distributions, the objectives,
the slots), ``ask`` (answered with the parameters of ``study.ask()``), ``tell`` (the trial's
values, or that it failed or was pruned: ``study.tell()``). A resumed sweep replays the
conversation: with a seed, each ask proposes again what it proposed before.

The sampler is built from the settings (``tpe`` with ``constant_liar`` where trials run in
parallel, ``cmaes``, ``gp``, ``nsgaii``, ``random``, ``qmc``), or, for the Python API
(``isorun.sweep(..., search=sampler)``), unpickled from the file ``$ISORUN_SEARCH_SAMPLER``
names."""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

__all__ = ["check", "distributions", "make_sampler", "main"]


def distributions(params: dict[str, Any]) -> dict[str, BaseDistribution]:
    """The Optuna distributions of a spec's ``search: params:`` (as isorun normalizes them)."""
    out: dict[str, BaseDistribution] = {}
    for name, d in params.items():
        kind = d["type"]
        if kind == "categorical":
            out[name] = CategoricalDistribution(d["choices"])
        elif kind == "int":
            out[name] = IntDistribution(int(d["low"]), int(d["high"]), log=bool(d.get("log", False)),
                                        step=int(d.get("step", 1)))
        else:
            out[name] = FloatDistribution(float(d["low"]), float(d["high"]), log=bool(d.get("log", False)),
                                          step=d.get("step"))
    return out


# What each sampler needs beyond Optuna (Optuna imports them only when the sampler first runs).
_NEEDS = {"cmaes": ("cmaes", "pip install cmaes"), "gp": ("torch", "pip install torch"),
          "qmc": ("scipy", "pip install scipy")}


def check(sampler: str) -> None:
    """Raises ImportError, saying what to install, where ``sampler`` cannot run here."""
    needed = _NEEDS.get(sampler)
    if needed is None:
        return
    module, install = needed
    try:
        __import__(module)
    except ImportError as e:
        raise ImportError(f"Optuna's {sampler} sampler needs {module} ({e}); {install}") from e


def make_sampler(name: str, seed: int | None, slots: int, objectives: int) -> optuna.samplers.BaseSampler:
    """The sampler a spec names."""
    if name.startswith("pickled:"):
        with open(os.environ["ISORUN_SEARCH_SAMPLER"], "rb") as f:
            sampler: optuna.samplers.BaseSampler = pickle.load(f)
        return sampler
    if name == "tpe":
        # Trials running in parallel: the ones not yet told count as a bad value, so that the
        # next asks look elsewhere (Optuna's advice for parallel TPE).
        return optuna.samplers.TPESampler(seed=seed, constant_liar=slots > 1)
    if name == "cmaes":
        if objectives > 1:
            raise SystemExit("isorun.search.optuna: cmaes optimizes one objective; use nsgaii, tpe or random")
        return optuna.samplers.CmaEsSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsgaii":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # (stderr is the sweep's search.err)
    study: optuna.Study | None = None
    space: dict[str, BaseDistribution] = {}
    asked: dict[int, optuna.trial.Trial] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        op = message.get("op")
        if op == "hello":
            settings = message["search"]
            objectives = message["objectives"]
            space = distributions(settings["params"])
            sampler = make_sampler(settings.get("sampler", "tpe"), settings.get("seed"), int(message.get("slots", 1)),
                                   len(objectives))
            study = optuna.create_study(sampler=sampler, directions=[o["goal"] for o in objectives])
            _answer({})
        elif study is None:
            raise SystemExit(f"isorun.search.optuna: {op} before hello")
        elif op == "ask":
            trial = study.ask(space)
            before = message.get("params")
            if message.get("replay") and before is not None and trial.params != before:
                # Not what it proposed before (no seed, or a sampler that is not deterministic):
                # that ask never happened, and the trial is the one the sweep ran.
                study.tell(trial, state=TrialState.FAIL)
                study.enqueue_trial(before)
                trial = study.ask(space)
            asked[int(message["number"])] = trial
            _answer({"params": trial.params})
        elif op == "tell":
            trial = asked.pop(int(message["number"]))
            values = message.get("values") or []
            if message.get("outcome") == "success" and values and all(v is not None for v in values):
                study.tell(trial, values if len(values) > 1 else values[0])
            elif message.get("outcome") == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, state=TrialState.FAIL)
            _answer({})
        else:
            _answer({})  # a message of a later protocol: nothing to do here


if __name__ == "__main__":
    main()
