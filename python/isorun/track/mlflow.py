"""A sweep in MLflow: ``python -m isorun.track.mlflow`` (docs/sweeps.md#trackers).

The sweep is a parent run (its parameters' values and metric as params, ``sweep.json`` as an
artifact, the report as one at the end); each trial a child run: its parameters, each report's
metrics at their step, the result's numeric fields as final metrics, its outcome and attempts as
tags, its log as an artifact. Settings (``track: {mlflow: {...}}``): ``uri``, the tracking store
(default ``$MLFLOW_TRACKING_URI``, else ``sqlite:///OUT/track/mlflow/mlflow.db``), ``experiment``
(default ``isorun``) and ``artifacts``, where a new experiment keeps its artifacts (default: the
store's choice; ``mlartifacts`` beside a SQLite store's file).

A resumed sweep, or this tracker started again, finds its runs again (their ids are kept in its
folder, and each run is tagged with the sweep's folder and the trial's id) and skips what it has
logged: every trial is one run, and a trial's metrics continue where they stopped.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from isorun.track import Seen, Tracker, numbers, serve

__all__ = ["MlflowTracker", "main"]

# MLflow's limit on a param's value (characters).
_PARAM_CHARS = 6000


def _artifacts_beside(uri: str) -> Optional[str]:
    """Where a new experiment of a local SQLite store keeps its artifacts: ``mlartifacts`` beside
    the database (MLflow's own default, ``./mlruns``, would be the sweep's working folder)."""
    if not uri.startswith("sqlite:///"):
        return None  # a server's or a database's: the store decides
    return "file://" + os.path.join(os.path.dirname(os.path.abspath(uri[len("sqlite:///"):])), "mlartifacts")


def _text(value: Any) -> str:
    return (value if isinstance(value, str) else repr(value) if not isinstance(value, list) else
            ", ".join(map(str, value)))[:_PARAM_CHARS]


class MlflowTracker(Tracker):
    """The sweep's events as MLflow runs (a parent for the sweep, a child per trial)."""

    def __init__(self) -> None:
        self.client: Optional[MlflowClient] = None
        self.seen: Optional[Seen] = None
        self.out = ""
        self.experiment = ""
        self.parent = ""
        self.runs: dict[str, str] = {}

    def sweep(self, event: dict[str, Any]) -> None:
        settings = event.get("settings") or {}
        folder = event["folder"]
        self.out = event["out"]
        uri = settings.get("uri") or os.environ.get("MLFLOW_TRACKING_URI") or \
            "sqlite:///" + os.path.join(folder, "mlflow.db")
        self.client = MlflowClient(tracking_uri=uri)
        name = settings.get("experiment") or "isorun"
        found = self.client.get_experiment_by_name(name)
        self.experiment = found.experiment_id if found else self.client.create_experiment(
            name, artifact_location=settings.get("artifacts") or _artifacts_beside(uri))
        self.seen = Seen(folder)
        # The runs an earlier start made (one look: a tracker killed between making a run and
        # saving its state finds it here, and makes no second one).
        self.runs = self._runs()
        self.parent = self.seen.data.get("parent") or self.runs.get("", "")
        sweep = event.get("sweep") or {}
        if not self.parent:
            subject = str(sweep.get("subject") or "sweep")
            tags = {"isorun.out": self.out, "isorun.role": "sweep", "isorun.subject": subject}
            run = self.client.create_run(self.experiment, tags=tags,
                                         run_name=os.path.basename(self.out.rstrip("/")) or subject)
            self.parent = run.info.run_id
            self.seen.data["parent"] = self.parent
            self.seen.save()
        else:
            self.client.update_run(self.parent, status="RUNNING")
        params = [Param(f"space.{k}", _text(v)) for k, v in (sweep.get("params") or {}).items()]
        metric = sweep.get("metric") or {}
        if metric:
            params.append(Param("metric", f"{metric.get('name')} ({'max' if metric.get('maximize') else 'min'})"))
        params.append(Param("trials", str(sweep.get("trials", ""))))
        logged = self.client.get_run(self.parent).data.params
        self.client.log_batch(self.parent, params=[p for p in params if p.key not in logged])
        spec = os.path.join(self.out, "sweep.json")
        if os.path.exists(spec):
            self.client.log_artifact(self.parent, spec)

    def _runs(self) -> dict[str, str]:
        """The runs of this sweep in the experiment by trial ('' for the sweep's own)."""
        assert self.client is not None
        runs: dict[str, str] = {}
        token = None
        while True:
            page = self.client.search_runs([self.experiment], filter_string=f"tags.`isorun.out` = '{self.out}'",
                                           max_results=1000, page_token=token)
            for run in page:
                tags = run.data.tags
                runs[tags.get("isorun.trial", "") if tags.get("isorun.role") != "sweep" else ""] = run.info.run_id
            token = page.token
            if not token:
                return runs

    def _child(self, trial: str) -> str:
        """The trial's run, made where it has none."""
        assert self.client is not None and self.seen is not None
        state = self.seen.trial(trial)
        if not state.get("run"):
            state["run"] = self.runs.get(trial) or self.client.create_run(
                self.experiment, run_name=trial,
                tags={"mlflow.parentRunId": self.parent, "isorun.out": self.out, "isorun.trial": trial}).info.run_id
            self.seen.save()
        return str(state["run"])

    def report(self, event: dict[str, Any]) -> None:
        assert self.client is not None and self.seen is not None
        trial, step = str(event["trial"]), int(event["step"])
        state = self.seen.trial(trial)
        if self.seen.passed(trial, step):
            return  # logged before this start
        run = self._child(trial)
        metrics = [Metric(k, v, 0, step) for k, v in numbers(event.get("metrics") or {}).items()]
        self.client.log_batch(run, metrics=metrics)
        state["step"] = step
        self.seen.save()

    def end(self, event: dict[str, Any]) -> None:
        assert self.client is not None and self.seen is not None
        trial, record = str(event["trial"]), event["record"]
        state = self.seen.trial(trial)
        if state["ended"]:
            return
        run = self._child(trial)
        # Once (MLflow refuses a param logged again with another value; a retried attempt has the same).
        params = [] if state.get("params") else [Param(k, _text(v)) for k, v in (record.get("params") or {}).items()]
        state["params"] = True
        tags = [RunTag("outcome", str(record.get("outcome"))), RunTag("attempts", str(record.get("attempts")))]
        if record.get("error"):
            tags.append(RunTag("error", str(record["error"])[:5000]))
        metrics = [Metric(k, v, 0, int(record.get("step", 0) or 0)) for k, v in numbers(record.get("result")).items()]
        for field in ("wall_s", "peak_allocated", "peak_reserved"):
            if isinstance(record.get(field), (int, float)):
                metrics.append(Metric(f"isorun.{field}", float(record[field]), 0, 0))
        self.client.log_batch(run, metrics=metrics, params=params, tags=tags)
        if not event.get("final", True):
            return  # retried at a larger cap: the trial goes on
        for suffix in (".out", ".err"):
            log = os.path.join(self.out, "logs", trial + suffix)
            if os.path.exists(log) and os.path.getsize(log) > 0:
                self.client.log_artifact(run, log, "logs")
        ok = record.get("outcome") in ("success", "pruned")
        self.client.set_terminated(run, status="FINISHED" if ok else "FAILED")
        state["ended"] = True
        self.seen.save()

    def sweep_end(self, event: dict[str, Any]) -> None:
        assert self.client is not None
        report = event.get("report")
        if report and os.path.exists(report):
            self.client.log_artifact(self.parent, report)
        if event.get("interrupted"):
            self.client.update_run(self.parent, status="KILLED")
        else:
            self.client.set_terminated(self.parent, status="FINISHED" if not event.get("failed") else "FAILED")


def main() -> None:
    """Serves the sweep's events on stdin."""
    serve(MlflowTracker())


if __name__ == "__main__":
    main()
