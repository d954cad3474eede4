"""A sweep in TensorBoard: ``python -m isorun.track.tensorboard`` (docs/sweeps.md#trackers).

Each trial is a run folder, ``LOGDIR/TRIAL/``, with its reports' metrics as scalars at their step,
the result's numeric fields at the last step, and its HParams session (its parameters, the
metrics, how it ended), so TensorBoard's HParams dashboard shows the sweep as a table and as
parallel coordinates. Settings (``track: {tensorboard: {...}}``): ``uri``, the log folder
(default ``OUT/track/tensorboard/logs``); view it with ``tensorboard --logdir LOGDIR``.

Written with TensorBoard's own event-file writer and protos (the ``tensorboard`` package; no
TensorFlow). A replay skips what :class:`isorun.track.Seen` says was written.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.hparams.api_pb2 import Experiment, HParamInfo, MetricInfo, MetricName, Status
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo, SessionStartInfo
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from isorun.track import Seen, Tracker, numbers, serve

__all__ = ["TensorBoardTracker", "main"]

# The HParams plugin's tags and version (tensorboard/plugins/hparams/metadata.py).
_EXPERIMENT, _SESSION_START, _SESSION_END = ("_hparams_/experiment", "_hparams_/session_start_info",
                                             "_hparams_/session_end_info")


def _hparams(tag: str, data: HParamsPluginData) -> Summary:
    data.version = 0
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="hparams",
                                                                  content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=tag, metadata=meta)])


class TensorBoardTracker(Tracker):
    """The sweep's trials as TensorBoard runs with scalars and HParams sessions."""

    def __init__(self) -> None:
        self.logdir = ""
        self.seen: Optional[Seen] = None
        self.params: list[str] = []
        self.metric = ""
        self.writers: dict[str, EventFileWriter] = {}

    def sweep(self, event: dict[str, Any]) -> None:
        settings = event.get("settings") or {}
        self.logdir = settings.get("uri") or os.path.join(event["folder"], "logs")
        self.seen = Seen(event["folder"])
        sweep = event.get("sweep") or {}
        self.params = sorted((sweep.get("params") or {}).keys())
        self.metric = str((sweep.get("metric") or {}).get("name") or "")

    def _write(self, trial: str, step: int, summary: Summary) -> None:
        writer = self.writers.get(trial)
        if writer is None:
            writer = self.writers[trial] = EventFileWriter(os.path.join(self.logdir, trial))
        writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def _start(self, trial: str, params: Optional[dict[str, Any]]) -> None:
        """The trial's HParams session, once, when its parameters are known."""
        assert self.seen is not None
        state = self.seen.trial(trial)
        if state.get("session") or params is None:
            return
        names = sorted(set(self.params) | set(params))
        metrics = [self.metric] if self.metric else []
        experiment = Experiment(hparam_infos=[HParamInfo(name=n) for n in names],
                                metric_infos=[MetricInfo(name=MetricName(tag=m)) for m in metrics])
        self._write(trial, 0, _hparams(_EXPERIMENT, HParamsPluginData(experiment=experiment)))
        start = SessionStartInfo(group_name=trial, start_time_secs=time.time())
        for name, value in params.items():
            if isinstance(value, bool):
                start.hparams[name].bool_value = value
            elif isinstance(value, (int, float)):
                start.hparams[name].number_value = float(value)
            else:
                start.hparams[name].string_value = str(value)
        self._write(trial, 0, _hparams(_SESSION_START, HParamsPluginData(session_start_info=start)))
        state["session"] = True

    def start(self, event: dict[str, Any]) -> None:
        assert self.seen is not None
        trial = str(event["trial"])
        if not self.seen.trial(trial)["ended"]:
            self._start(trial, event.get("params") or {})
            self.writers[trial].flush()  # on disk before the state says so
            self.seen.save()

    def report(self, event: dict[str, Any]) -> None:
        assert self.seen is not None
        trial, step = str(event["trial"]), int(event["step"])
        state = self.seen.trial(trial)
        if self.seen.passed(trial, step):
            return
        values = [Summary.Value(tag=k, simple_value=v) for k, v in numbers(event.get("metrics") or {}).items()]
        self._write(trial, step, Summary(value=values))
        self.writers[trial].flush()
        state["step"] = step
        self.seen.save()

    def end(self, event: dict[str, Any]) -> None:
        assert self.seen is not None
        trial, record = str(event["trial"]), event["record"]
        state = self.seen.trial(trial)
        if state["ended"] or not event.get("final", True):
            return
        self._start(trial, record.get("params") or {})
        step = int(record.get("step", 0) or 0)
        values = [Summary.Value(tag=k, simple_value=v) for k, v in numbers(record.get("result")).items()]
        if values and not self.seen.passed(trial, step):
            self._write(trial, step, Summary(value=values))
        ok = record.get("outcome") in ("success", "pruned")
        end = SessionEndInfo(status=Status.Value("STATUS_SUCCESS" if ok else "STATUS_FAILURE"),
                             end_time_secs=time.time())
        self._write(trial, step, _hparams(_SESSION_END, HParamsPluginData(session_end_info=end)))
        self.writers.pop(trial).close()
        state["ended"] = True
        self.seen.save()

    def sweep_end(self, event: dict[str, Any]) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


def main() -> None:
    """Serves the sweep's events on stdin."""
    serve(TensorBoardTracker())


if __name__ == "__main__":
    main()
