"""Trackers a sweep's events go to (docs/sweeps.md#trackers).

A sweep with ``track: {NAME: {...}}`` (``--track NAME[=URI]``) starts each tracker beside it: a
process that reads the sweep's events, one JSON object per line, on its stdin. isorun's own are
``python -m isorun.track.mlflow`` and ``python -m isorun.track.tensorboard``; one of your own, in
any language, reads the same lines (``track: {mine: {command: [python3, mine.py]}}``).

The events, each with ``"event"`` naming it:

- ``sweep``: first, at every start of the tracker: ``settings`` (the rest of its mapping in the
  spec), ``folder`` (``OUT/track/NAME/``, its own), ``out`` and ``sweep`` (subject, metric,
  scheduler, runs, each parameter's values).
- ``report``: a trial's intermediate report: ``trial``, ``step``, ``metrics``.
- ``end``: a trial's record (``record``, a line of ``OUT/results.jsonl``); ``final`` is false for
  an attempt that is retried at a larger cap.
- ``sweep_end``: the run is over: ``succeeded``, ``failed``, ``pruned``, ``report``, ``results``.

A tracker that fails or stops reading is started again and given every event from the start, so
a tracker keeps in its folder what it needs to skip what it has seen (:class:`Seen` does).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Optional

__all__ = ["Seen", "Tracker", "numbers", "serve"]


def numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """The numeric fields of a result or a report's metrics: a number (named ``result``), or a
    mapping of them, nested names joined by '.'; what is not a finite number is left out."""
    if isinstance(value, bool):
        return {prefix or "result": float(value)}
    if isinstance(value, (int, float)):
        return {prefix or "result": float(value)} if math.isfinite(value) else {}
    if isinstance(value, dict):
        out: dict[str, float] = {}
        for k, v in value.items():
            out.update(numbers(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {}


class Seen:
    """What a tracker has already passed on, kept in ``FOLDER/seen.json``: replayed events skip it.

    Per trial: the last step whose report was passed on and whether its end was. Saved after each
    change (written aside, then renamed), so a tracker killed at any point repeats at most the one
    event it was passing on.
    """

    def __init__(self, folder: str) -> None:
        self._path = os.path.join(folder, "seen.json")
        self.data: dict[str, Any] = {"trials": {}}
        try:
            with open(self._path, encoding="utf-8") as f:
                self.data = json.load(f)
        except FileNotFoundError:
            pass

    def trial(self, trial: str) -> dict[str, Any]:
        """The record of ``trial`` (created empty): ``step`` (last report passed on), ``ended``."""
        trials: dict[str, Any] = self.data.setdefault("trials", {})
        return trials.setdefault(trial, {"step": None, "ended": False})

    def passed(self, trial: str, step: int) -> bool:
        """Whether a report of ``trial`` at ``step`` (or a later one) was passed on already."""
        last = self.trial(trial)["step"]
        return last is not None and step <= last

    def save(self) -> None:
        """Writes the state durably enough for a restart: aside, then renamed over the old."""
        aside = self._path + ".tmp"
        with open(aside, "w", encoding="utf-8") as f:
            json.dump(self.data, f)
        os.replace(aside, self._path)


class Tracker:
    """A tracker's handlers, one method per event; each gets the event as a dict.

    Subclasses override what they use; :func:`serve` calls them in the sweep's order.
    """

    def sweep(self, event: dict[str, Any]) -> None:
        """The sweep's first event (at every start of the tracker)."""

    def report(self, event: dict[str, Any]) -> None:
        """A trial's intermediate report."""

    def end(self, event: dict[str, Any]) -> None:
        """A trial's record."""

    def sweep_end(self, event: dict[str, Any]) -> None:
        """The run is over; the last event."""


def serve(tracker: Tracker, stream: Optional[Any] = None) -> None:
    """Reads the sweep's events from ``stream`` (stdin) and calls ``tracker``'s method for each.

    An event of a kind the tracker does not know is skipped (later versions may add kinds).
    """
    for line in stream if stream is not None else sys.stdin:
        event = json.loads(line)
        handler = getattr(tracker, str(event.get("event")), None)
        if handler is not None and not str(event.get("event")).startswith("_"):
            handler(event)
