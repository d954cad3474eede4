"""Trackers: MLflow's against a real MLflow store (SQLite), read back with MlflowClient, and
TensorBoard's, read back with TensorBoard's EventAccumulator.

A 12-trial ASHA sweep, killed with SIGKILL in the middle and run again: still one child run per
trial with its parameters, outcome and attempts, each report's loss at its step (continued, not
repeated, by the resumed trials), the result as final metrics, and the sweep a parent run with
the report as an artifact.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path

import pytest

import isorun


CURVE = str(Path(__file__).resolve().parents[2] / "tests" / "helpers" / "curve.py")


def _spec(tmp_path: Path) -> dict:
    return {"command": [sys.executable, CURVE, "--x", "{x}", "--y", "{y}", "--max-t", "27", "--sleep-ms", "5"],
            "metric": {"name": "loss", "goal": "minimize"},
            "scheduler": {"type": "asha", "max_t": 27, "grace_period": 1, "reduction_factor": 3},
            "params": {"x": [0, 0.3, 0.6, 0.8], "y": [0.2, 0.6, 1.0]},
            "resources": {"cpu_slots": 2}, "out": str(tmp_path / "out")}


def _sweep_children() -> list[int]:
    """The pids of this process's children that run the isorun command."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            pids.append(int(entry))
    return pids


def test_an_asha_sweep_in_mlflow_killed_and_resumed_is_one_run_per_trial(tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="MLflow is not installed (tools/setup.sh installs mlflow-skinny)")
    pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs sqlalchemy (tools/setup.sh installs it)")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = _spec(tmp_path)
    seen: list[dict] = []

    def kill_after_three(record: dict) -> None:
        seen.append(record)
        if len(seen) == 3:
            for pid in _sweep_children():
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(isorun.Error):  # the command was killed
        isorun.sweep(spec, track={"mlflow": {"uri": uri, "experiment": "curves"}}, on_record=kill_after_three,
                     quiet=True)
    records = isorun.sweep(spec, track={"mlflow": {"uri": uri, "experiment": "curves"}}, quiet=True)
    assert len(records) == 12

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("curves")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("isorun.role") == "sweep"]
    children = [r for r in runs if "isorun.trial" in r.data.tags]
    assert len(parents) == 1 and len(children) == 12  # no run twice
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["space.x"] == "0, 0.3, 0.6, 0.8"
    assert parent.data.params["metric"] == "loss (min)"
    assert "report.html" in [a.path for a in client.list_artifacts(parent.info.run_id)]

    by_trial = {r.data.tags["isorun.trial"]: r for r in children}
    assert set(by_trial) == {r["id"] for r in records}
    for record in records:
        run = by_trial[record["id"]]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {k: float(v) for k, v in run.data.params.items()} == {k: float(v) for k, v in record["params"].items()}
        assert run.data.tags["outcome"] == record["outcome"]
        assert run.data.tags["attempts"] == str(record["attempts"])
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "loss")
        steps = [m.step for m in history]
        # Every step the trial reached, in order, each once: a trial that ran again after the
        # kill continued where its reports had stopped. (An attempt killed with the sweep may
        # have gone further than the one run again, which its new rung then stopped sooner.)
        assert steps == list(range(1, len(steps) + 1)), record["id"]
        assert len(steps) >= record["step"], record["id"]
        # The result's loss, at the step it was reached.
        assert record["result"]["loss"] in [pytest.approx(m.value) for m in history if m.step == record["step"]]
    assert (tmp_path / "out" / "track" / "mlflow" / "seen.jsonl").exists()
    assert (tmp_path / "mlartifacts").is_dir()  # beside the store, not in the working folder
    assert not Path("mlruns").exists()


def test_track_refuses_what_it_cannot_pass_on(tmp_path):
    with pytest.raises(isorun.UsageError, match="track takes"):
        isorun.sweep(_spec(tmp_path), track=3)  # type: ignore[arg-type]
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("command: [true, '{x}']\nparams: {x: [1]}\n")
    with pytest.raises(isorun.UsageError, match="settings other than uri"):
        isorun.sweep(spec_file, track={"mlflow": {"experiment": "x"}})
    with pytest.raises(isorun.UsageError, match="not a tracker isorun has"):
        isorun.sweep(spec_file, track="wandb", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_sweep_in_tensorboard_has_a_run_per_trial_with_scalars_and_its_hparams_session(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is not installed (tools/setup.sh installs it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    spec = _spec(tmp_path)
    records = isorun.sweep(spec, track="tensorboard", quiet=True)
    logs = tmp_path / "out" / "track" / "tensorboard" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == sorted(r["id"] for r in records)
    for record in records:
        events = EventAccumulator(str(logs / record["id"]))
        events.Reload()
        steps = [s.step for s in events.Scalars("loss")]
        assert steps == list(range(1, record["step"] + 1)), record["id"]
        assert events.Scalars("loss")[-1].value == pytest.approx(record["result"]["loss"], rel=1e-6)
        sessions = {tag: HParamsPluginData.FromString(content)
                    for tag, content in events.PluginTagToContent("hparams").items()}
        start = sessions["_hparams_/session_start_info"].session_start_info
        assert {k: v.number_value for k, v in start.hparams.items()} == record["params"]
        experiment = sessions["_hparams_/experiment"].experiment
        assert [m.name.tag for m in experiment.metric_infos] == ["loss"]
        assert sessions["_hparams_/session_end_info"].session_end_info.status == 1  # STATUS_SUCCESS


def test_mlflow_shows_a_trial_running_with_its_parameters_from_its_start(tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="MLflow is not installed (tools/setup.sh installs mlflow-skinny)")
    pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs sqlalchemy (tools/setup.sh installs it)")
    from isorun.track import serve
    from isorun.track.mlflow import MlflowTracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    folder = tmp_path / "out" / "track" / "mlflow"
    folder.mkdir(parents=True)
    # The events a sweep gives the tracker up to a trial's first report (docs/sweeps.md#trackers).
    events = [
        {"event": "sweep", "protocol": 1, "tracker": "mlflow", "folder": str(folder), "out": str(tmp_path / "out"),
         "settings": {"uri": uri, "experiment": "starts"},
         "sweep": {"subject": "train", "params": {"lr": [0.1, 1.0]}, "metric": {"name": "loss", "maximize": False}}},
        {"event": "start", "trial": "a1", "attempt": 1, "params": {"lr": 0.1}},
        {"event": "report", "trial": "a1", "step": 1, "metrics": {"loss": 0.5}},
    ]
    text = "".join(json.dumps(e) + "\n" for e in events)
    serve(MlflowTracker(), io.StringIO(text))
    serve(MlflowTracker(), io.StringIO(text))  # started again: the same events replayed

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("starts")
    children = [r for r in client.search_runs([experiment.experiment_id]) if "isorun.trial" in r.data.tags]
    assert len(children) == 1  # one run, however often the tracker starts
    run = children[0]
    assert run.info.status == "RUNNING"
    assert run.data.params == {"lr": "0.1"}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 0.5)]


def test_what_a_tracker_saw_grows_a_line_per_change_and_survives_a_cut_line(tmp_path):
    from isorun.track import Seen

    seen = Seen(str(tmp_path))
    seen.data["parent"] = "run-0"
    sizes = []
    for i in range(200):
        seen.trial(f"t{i}")["step"] = 1
        seen.passed("t0", 1)  # read, not changed: nothing written for it
        seen.save()
        sizes.append((tmp_path / "seen.jsonl").stat().st_size)
    growth = [b - a for a, b in zip(sizes, sizes[1:])]
    assert max(growth) < 60 < sizes[-1] / 100  # a line a save (the changed trial's), not the whole state
    seen.trial("t7")["ended"] = True
    seen.save()
    with open(tmp_path / "seen.jsonl", "a", encoding="utf-8") as f:
        f.write('{"trial": "t8", "state": {"step": 9')  # a kill in the middle of a line

    again = Seen(str(tmp_path))
    assert again.data["parent"] == "run-0"
    assert again.trial("t7") == {"step": 1, "ended": True}
    assert again.trial("t8") == {"step": 1, "ended": False}  # the cut line is not read
    assert len((tmp_path / "seen.jsonl").read_text().splitlines()) == 201  # compacted as it opened
    again.trial("t8")["step"] = 2
    again.save()
    assert Seen(str(tmp_path)).trial("t8")["step"] == 2  # appended after the compaction, not joined
