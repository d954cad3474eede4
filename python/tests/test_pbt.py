"""Population-based training in a sweep (docs/sweeps.md#population-based-training): members in the
bottom quantile replaced by children of top members, which start from their parent's checkpoint;
lineage in the records; resume after kill -9 makes the same decisions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import isorun

TOY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                   "python_tasks", "pbt_toy.py")


def spec_of(out, pbt=True, seed=0):
    spec = {
        "python": f"{TOY}:toy",
        "metric": {"name": "q", "goal": "maximize"},
        "zip": [{"member": [0, 1, 2, 3], "h0": [1.0, 0.0, 1.0, 0.0], "h1": [0.0, 1.0, 0.0, 1.0]}],
        "params": {"steps": [60], "lr": [0.05], "step_s": [0.02]},
        "resources": {"cpu_slots": 4},
        "checkpoints": {"keep": 2},
        "out": str(out),
    }
    if pbt:
        # (h perturbed x 0.8 or x 1.2 stays 0 where it is: drawn afresh half the time, it does not.)
        spec["scheduler"] = {"type": "pbt", "interval": 4, "quantile": 0.5, "seed": seed,
                             "resample_probability": 0.5,
                             "mutations": {"h0": {"uniform": [0, 1]}, "h1": {"uniform": [0, 1]}}}
    return spec


def test_members_are_replaced_by_children_that_start_from_their_parent_s_checkpoint(tmp_path):
    records = isorun.sweep(spec_of(tmp_path / "out"))
    by_id = {r["id"]: r for r in records}
    children = [r for r in records if r.get("origin")]
    assert children, "no member was ever replaced"
    for child in children:
        origin = child["origin"]
        assert origin["parent"] in by_id and origin["replaces"] in by_id
        # Stopped for the child at its next report; one replaced at its last step ends as it was.
        assert by_id[origin["replaces"]]["outcome"] in ("pruned", "success")
        assert origin["generation"] >= 1
        if child["outcome"] == "success" and origin["step"] > 0:
            assert child["result"]["start"] == origin["step"]  # resumed from the parent's checkpoint
    best = max(r["result"]["q"] for r in records if r["outcome"] == "success")
    alone = isorun.sweep(spec_of(tmp_path / "alone", pbt=False))
    assert max(r["result"]["q"] for r in alone) == pytest.approx(1.2 - 0.81, abs=1e-3)  # one coordinate each
    assert best > 0.6  # exploit and explore got both coordinates down
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Population" in report


def test_a_sweep_resumed_after_kill_9_makes_the_same_children(tmp_path):
    out = tmp_path / "out"
    path = tmp_path / "spec.yaml"
    spec = spec_of(out, seed=3)
    spec["params"]["steps"] = [80]
    spec["resources"] = {"cpu_slots": 1}  # reports in one order every run: the decisions are comparable
    path.write_text(json.dumps(spec))
    env = dict(os.environ, ISORUN_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p))
    command = [os.path.join(os.path.dirname(isorun.__file__), "bin", "isorun"), "sweep", str(path), "--no-progress"]
    journal = out / "results.jsonl"
    with subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL) as first:
        while (not journal.exists() or len(journal.read_text().splitlines()) < 2) and first.poll() is None:
            time.sleep(0.02)  # (polls the journal: the sweep says nothing else while it runs)
        first.send_signal(signal.SIGKILL)
    done = subprocess.run(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert done.returncode == 0, done.stderr
    resumed = [json.loads(line) for line in journal.read_text().splitlines()]
    # The same sweep, never interrupted: the same decisions, so the same children.
    fresh = isorun.sweep(dict(spec, out=str(tmp_path / "fresh")))
    assert {r["id"] for r in resumed} == {r["id"] for r in fresh}
    lineage = {r["id"]: (r["origin"]["parent"], r["origin"]["replaces"]) for r in fresh if r.get("origin")}
    assert {r["id"]: (r["origin"]["parent"], r["origin"]["replaces"]) for r in resumed if r.get("origin")} == lineage


def test_pbt_specs_isorun_refuses(tmp_path):
    spec = spec_of(tmp_path / "out")
    del spec["checkpoints"]
    with pytest.raises(isorun.UsageError, match="pbt starts each new trial from a top trial's checkpoint"):
        isorun.sweep(spec)
    spec = spec_of(tmp_path / "out")
    spec["scheduler"]["mutations"] = {"momentum": "perturb"}
    with pytest.raises(isorun.UsageError, match="'momentum', which is none of the trials' parameters"):
        isorun.sweep(spec)
    spec = spec_of(tmp_path / "out")
    spec["scheduler"]["population"] = 8
    with pytest.raises(isorun.UsageError, match="population 8, but params: expand to 4"):
        isorun.sweep(spec)
    spec = spec_of(tmp_path / "out")
    spec["scheduler"]["quantile"] = 0.9
    with pytest.raises(isorun.UsageError, match="quantile must be above 0 and at most 0.5"):
        isorun.sweep(spec)
