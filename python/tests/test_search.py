"""Sweeps whose trials Optuna's samplers choose (docs/sweeps.md#search): ``search: {type: optuna, ...}``
in a spec, and ``isorun.sweep(..., search=sampler, trials=N)``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import isorun

optuna = pytest.importorskip("optuna")

TRIALS = textwrap.dedent('''
    import time

    def quadratic(x, y, category="a"):
        return {"loss": (x - 0.3) ** 2 + (y + 0.5) ** 2 + (0.0 if category == "a" else 0.5)}

    def two(x, y):
        # Two objectives that pull apart: their Pareto front is a curve, not a point.
        return {"loss": (x - 1) ** 2 + y ** 2, "cost": (x + 1) ** 2 + y ** 2}

    def slow(x, y):
        time.sleep(0.2)
        return {"loss": (x - 0.3) ** 2 + (y + 0.5) ** 2}
''')


@pytest.fixture
def trials(tmp_path):
    path = tmp_path / "trials.py"
    path.write_text(TRIALS)
    return path


def spec_of(module, out, function="quadratic", **search):
    return {
        "python": f"{module}:{function}",
        "metric": {"name": "loss", "goal": "minimize"},
        "search": {"type": "optuna", "params": {"x": {"float": [-2, 2]}, "y": {"float": [-2, 2]}}, **search},
        "resources": {"cpu_slots": 2},
        "out": str(out),
    }


@pytest.mark.parametrize("sampler", ["tpe", "random", "qmc", "nsgaii", "cmaes", "gp"])
def test_each_sampler_chooses_trials_within_their_distributions(trials, tmp_path, sampler):
    needs = {"cmaes": "cmaes", "gp": "torch"}.get(sampler)
    if needs:
        pytest.importorskip(needs, reason=f"Optuna's {sampler} sampler needs {needs}")
    records = isorun.sweep(spec_of(trials, tmp_path / "out", sampler=sampler, seed=0, trials=8))
    assert len(records) == 8
    for r in records:
        assert r["outcome"] == "success"
        assert -2 <= r["params"]["x"] <= 2 and -2 <= r["params"]["y"] <= 2
    conversation = [json.loads(line) for line in (tmp_path / "out" / "search.jsonl").read_text().splitlines()]
    assert sum("ask" in m for m in conversation) == 8
    assert sum("tell" in m for m in conversation) == 8


def test_int_step_log_and_categorical_distributions(trials, tmp_path):
    spec = spec_of(trials, tmp_path / "out", sampler="random", seed=1, trials=12)
    spec["search"]["params"] = {"x": {"int": [-2, 2]}, "y": {"float": [0.01, 1], "log": True},
                                "category": {"categorical": ["a", "b"]}}
    records = isorun.sweep(spec)
    assert len(records) == 12
    for r in records:
        assert isinstance(r["params"]["x"], int) and -2 <= r["params"]["x"] <= 2
        assert 0.01 <= r["params"]["y"] <= 1
        assert r["params"]["category"] in ("a", "b")


def test_tpe_beats_its_random_start_on_a_quadratic(trials, tmp_path):
    # One slot: each ask follows the tell before it, so the seeded sampler makes the same choices
    # on every run (on two, which trial ends first varies, and with it what TPE has seen).
    spec = spec_of(trials, tmp_path / "out", sampler="tpe", seed=0, trials=40)
    spec["resources"]["cpu_slots"] = 1
    records = isorun.sweep(spec)
    losses = [r["result"]["loss"] for r in records]
    assert min(losses) < 0.05  # (random search over the same box reaches ~0.1 in 40 trials)


def test_a_sampler_or_study_from_python(trials, tmp_path):
    spec = spec_of(trials, tmp_path / "out")
    records = isorun.sweep(spec, search=optuna.samplers.TPESampler(seed=3), trials=6)
    assert len(records) == 6 and all(r["outcome"] == "success" for r in records)
    # The same folder again, with the same kind of sampler: resumed, nothing runs again.
    assert len(isorun.sweep(spec, search=optuna.samplers.TPESampler(seed=3), trials=6)) == 6
    with pytest.raises(isorun.UsageError, match=r"holds a different sweep.*\(--out; out= in Python\)"):  # another sampler: not resumed
        isorun.sweep(spec, search=optuna.samplers.RandomSampler(seed=3), trials=6)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    again = isorun.sweep(spec_of(trials, tmp_path / "out2"), search=study, trials=4)
    assert len(again) == 4
    with pytest.raises(isorun.UsageError, match="Optuna sampler"):
        isorun.sweep(spec_of(trials, tmp_path / "out3"), search="tpe", trials=4)
    with pytest.raises(isorun.UsageError, match="trials takes"):
        isorun.sweep(spec_of(trials, tmp_path / "out3"), search=optuna.samplers.TPESampler(), trials=0)
    with pytest.raises(isorun.UsageError, match="spec given as a dict"):
        isorun.sweep(str(tmp_path / "spec.yaml"), trials=3)


def test_several_objectives(trials, tmp_path):
    spec = spec_of(trials, tmp_path / "out", function="two", sampler="nsgaii", seed=0, trials=12,
                   objectives=[{"name": "loss", "goal": "minimize"}, {"name": "cost", "goal": "minimize"}])
    records = isorun.sweep(spec)
    assert len(records) == 12
    tells = [json.loads(line) for line in (tmp_path / "out" / "search.jsonl").read_text().splitlines()
             if '"tell"' in line]
    assert all(len(t["values"]) == 2 for t in tells)
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Pareto front" in report


def test_a_seeded_search_resumed_after_kill_9_proposes_what_it_proposed(trials, tmp_path):
    out = tmp_path / "out"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(json.dumps(spec_of(trials, out, function="slow", sampler="tpe", seed=7, trials=10)))
    env = dict(os.environ, ISORUN_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p))
    command = [os.path.join(os.path.dirname(isorun.__file__), "bin", "isorun"), "sweep", str(spec_path),
               "--no-progress"]
    journal = out / "results.jsonl"
    with subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL) as first:
        while (not journal.exists() or len(journal.read_text().splitlines()) < 4) and first.poll() is None:
            time.sleep(0.02)  # (polls the journal: the sweep says nothing else while it runs)
        first.send_signal(signal.SIGKILL)
    resumed = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "did not propose again" not in resumed.stderr
    records = isorun.sweep(json.loads(spec_path.read_text()))
    assert len(records) == 10 and all(r["outcome"] == "success" for r in records)


def test_a_spec_with_a_sampler_whose_package_is_missing_is_refused(trials, tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(isorun.UsageError, match="gp sampler needs torch"):
            isorun.sweep(spec_of(trials, tmp_path / "out", sampler="gp", trials=3))
        assert not (tmp_path / "out" / "results.jsonl").exists() or not (tmp_path / "out" / "results.jsonl").read_text()
    else:
        pytest.skip("torch is installed here: the GP sampler runs")
