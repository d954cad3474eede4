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
import time
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


class _Waiting:
    """What a trial's run waits for: its parameters (from its start), its reports' metrics and
    its latest checkpoint."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.metrics: list[Metric] = []
        self.step: Optional[int] = None  # the last report's
        self.checkpoint: Optional[int] = None


class MlflowTracker(Tracker):
    """The sweep's events as MLflow runs (a parent for the sweep, a child per trial)."""

    def __init__(self) -> None:
        self.client: Optional[MlflowClient] = None
        self.seen: Optional[Seen] = None
        self.out = ""
        self.experiment = ""
        self.parent = ""
        self.runs: dict[str, str] = {}
        self.waiting: dict[str, _Waiting] = {}  # by trial: what waits for the tracker to be idle

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

    def _child(self, trial: str, tags: list[RunTag]) -> tuple[str, list[RunTag]]:
        """The trial's run, made where it has none, and what of ``tags`` is left to log: a run
        made here takes them with it (a transaction fewer)."""
        assert self.client is not None and self.seen is not None
        state = self.seen.trial(trial)
        if not state.get("run"):
            state["run"] = self.runs.get(trial)
            if not state["run"]:
                own = {"mlflow.parentRunId": self.parent, "isorun.out": self.out, "isorun.trial": trial}
                state["run"] = self.client.create_run(self.experiment, run_name=trial,
                                                      tags={**own, **{t.key: t.value for t in tags}}).info.run_id
                tags = []
        return str(state["run"]), tags

    def _log(self, trial: str, metrics: list[Metric], tags: list[RunTag],
             params: Optional[dict[str, Any]] = None) -> str:
        """Logs to the trial's run (made where it has none) what waits for it and what is given,
        in as few of MLflow's batches as its limits allow; returns the run. The parameters (its
        start's, else ``params``) go once: MLflow refuses a param logged again."""
        assert self.client is not None and self.seen is not None
        state = self.seen.trial(trial)
        waiting = self.waiting.pop(trial, None)
        if waiting is not None and waiting.checkpoint is not None:
            tags = [RunTag("checkpoint", str(waiting.checkpoint)), *tags]
        run, tags = self._child(trial, tags)
        chosen = (waiting.params if waiting is not None and waiting.params else params) or {}
        logged = [] if state.get("params") else [Param(k, _text(v)) for k, v in chosen.items()]
        metrics = (waiting.metrics if waiting is not None else []) + metrics
        if logged:
            state["params"] = True
        while metrics or logged or tags:  # at most 1000 values a batch, 100 of them params, 100 tags
            batch_params, logged = logged[:100], logged[100:]
            batch_tags, tags = tags[:100], tags[100:]
            room = 1000 - len(batch_params) - len(batch_tags)
            batch_metrics, metrics = metrics[:room], metrics[room:]
            self.client.log_batch(run, metrics=batch_metrics, params=batch_params, tags=batch_tags)
        if waiting is not None and waiting.step is not None:
            state["step"] = waiting.step
        return run

    def start(self, event: dict[str, Any]) -> None:
        assert self.seen is not None
        trial = str(event["trial"])
        state = self.seen.trial(trial)
        if not state["ended"] and not state.get("params"):
            # Made when the tracker is idle (or with the trial's end, if that comes first): a
            # tracker behind the sweep makes a run and logs a trial in one go.
            self.waiting.setdefault(trial, _Waiting()).params = dict(event.get("params") or {})

    def report(self, event: dict[str, Any]) -> None:
        assert self.seen is not None
        trial, step = str(event["trial"]), int(event["step"])
        waiting = self.waiting.get(trial)
        if self.seen.passed(trial, step) or (waiting is not None and waiting.step is not None and waiting.step >= step):
            return  # logged before this start
        waiting = self.waiting.setdefault(trial, _Waiting())
        waiting.metrics += [Metric(k, v, 0, step) for k, v in numbers(event.get("metrics") or {}).items()]
        waiting.step = step
        if len(waiting.metrics) >= 1000:  # a batch's worth: logged now, however far behind
            self._log(trial, [], [])
            self.seen.save()

    def checkpoint(self, event: dict[str, Any]) -> None:
        """A trial's checkpoint is committed: its run's tag ``checkpoint`` says the latest step."""
        assert self.seen is not None
        trial = str(event["trial"])
        if not self.seen.trial(trial)["ended"]:
            self.waiting.setdefault(trial, _Waiting()).checkpoint = int(event["step"])

    def idle(self) -> bool:
        """Makes the runs of the trials that started, and logs the reports that came, since the
        last time: a run and a batch a trial, however many reports it made meanwhile; for a second
        at most (True: some wait still)."""
        if self.seen is None:
            return False
        until = time.monotonic() + 1.0
        for trial in list(self.waiting):
            if time.monotonic() >= until:
                return True
            self._log(trial, [], [])
            self.seen.save()  # (after each trial: a tracker killed now repeats nothing it logged)
        return False

    def end(self, event: dict[str, Any]) -> None:
        assert self.client is not None and self.seen is not None
        trial, record = str(event["trial"]), event["record"]
        state = self.seen.trial(trial)
        if state["ended"]:
            return
        tags = [RunTag("outcome", str(record.get("outcome"))), RunTag("attempts", str(record.get("attempts")))]
        if record.get("error"):
            tags.append(RunTag("error", str(record["error"])[:5000]))
        metrics = [Metric(k, v, 0, int(record.get("step", 0) or 0)) for k, v in numbers(record.get("result")).items()]
        for field in ("wall_s", "peak_allocated", "peak_reserved"):
            if isinstance(record.get(field), (int, float)):
                metrics.append(Metric(f"isorun.{field}", float(record[field]), 0, 0))
        run = self._log(trial, metrics, tags, record.get("params"))
        if not event.get("final", True):
            self.seen.save()
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
        self.idle()
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
