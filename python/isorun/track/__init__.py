"""Trackers a sweep's events go to (docs/sweeps.md#trackers).

A sweep with ``track: {NAME: {...}}`` (``--track NAME[=URI]``) starts each tracker beside it: a
process that reads the sweep's events, one JSON object per line, on its stdin. isorun's own are
``python -m isorun.track.mlflow`` and ``python -m isorun.track.tensorboard``; one of your own, in
any language, reads the same lines (``track: {mine: {command: [python3, mine.py]}}``).

The events, each with ``"event"`` naming it:

- ``sweep``: first, at every start of the tracker: ``settings`` (the rest of its mapping in the
  spec), ``folder`` (``OUT/track/NAME/``, its own), ``out`` and ``sweep`` (subject, metric,
  scheduler, runs, each parameter's values).
- ``start``: an attempt of a trial starts (on Slurm: is submitted in an array): ``trial``,
  ``attempt`` (1, then each retry's), ``params``.
- ``report``: a trial's intermediate report: ``trial``, ``step``, ``metrics``.
- ``checkpoint``: a trial's checkpoint is committed: ``trial``, ``attempt``, ``step``.
- ``end``: a trial's record (``record``, a line of ``OUT/results.jsonl``); ``final`` is false for
  an attempt that is retried at a larger cap.
- ``sweep_end``: the run is over: ``succeeded``, ``failed``, ``pruned``, ``cancelled``,
  ``interrupted``, ``report``, ``results``.

A tracker that fails or stops reading is started again and given every event from the start, so
a tracker keeps in its folder what it needs to skip what it has seen (:class:`Seen` does).
"""

from __future__ import annotations

import json
import math
import os
import select
import sys
from collections.abc import Iterable
from typing import Any, Optional, Union

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
    """What a tracker has already passed on, kept in ``FOLDER/seen.jsonl``: replayed events skip it.

    Per trial: the last step whose report was passed on and whether its end was, and what else the
    tracker keeps beside them (its run's id). A save appends a line for each trial changed since
    the last one, so a sweep of many trials costs a line per change, not the whole state each
    time; the file is compacted (written aside, then renamed) when it is opened. A tracker killed
    at any point repeats at most the one event it was passing on; a line cut short by the kill is
    not read.
    """

    def __init__(self, folder: str) -> None:
        self._path = os.path.join(folder, "seen.jsonl")
        self.data: dict[str, Any] = {"trials": {}}
        self._written: dict[str, str] = {}  # each trial's state as last written
        self._written_rest: Optional[str] = None  # the rest of the state (a tracker's own) as last written
        self._touched: set[str] = set()
        try:
            with open(self._path, encoding="utf-8") as f:
                for line in f:
                    self._apply(line)
        except FileNotFoundError:
            return
        self._compact()  # (also drops a line cut short, which a line appended after would join)

    def _apply(self, line: str) -> None:
        try:
            change = json.loads(line)
        except ValueError:
            return  # the last line, cut short by a kill
        if not isinstance(change, dict):
            return
        if "trial" in change:
            self.data["trials"][str(change["trial"])] = change.get("state", {})
        else:
            self.data.update(change.get("sweep", {}))

    def _lines(self, trials: Iterable[str], whole: bool) -> list[str]:
        """The lines that record ``trials`` (and the rest of the state, if it changed or ``whole``)."""
        lines = []
        rest = json.dumps({k: v for k, v in self.data.items() if k != "trials"}, sort_keys=True)
        if whole or rest != self._written_rest:
            self._written_rest = rest
            lines.append(f'{{"sweep": {rest}}}\n')
        for trial in trials:
            text = json.dumps(self.data["trials"][trial], sort_keys=True)
            if whole or text != self._written.get(trial):
                self._written[trial] = text
                lines.append(f'{{"trial": {json.dumps(trial)}, "state": {text}}}\n')
        return lines

    def _compact(self) -> None:
        aside = self._path + ".tmp"
        with open(aside, "w", encoding="utf-8") as f:
            f.writelines(self._lines(list(self.data["trials"]), whole=True))
        os.replace(aside, self._path)

    def trial(self, trial: str) -> dict[str, Any]:
        """The record of ``trial`` (created empty): ``step`` (last report passed on), ``ended``;
        a tracker may keep more in it. Changes to it are written by the next :meth:`save`."""
        self._touched.add(trial)
        trials: dict[str, Any] = self.data.setdefault("trials", {})
        return trials.setdefault(trial, {"step": None, "ended": False})

    def passed(self, trial: str, step: int) -> bool:
        """Whether a report of ``trial`` at ``step`` (or a later one) was passed on already."""
        last = self.trial(trial)["step"]
        return last is not None and step <= last

    def save(self) -> None:
        """Writes what changed since the last save (a line each), for a restart to find."""
        lines = self._lines(sorted(self._touched), whole=False)
        self._touched.clear()
        if lines:
            with open(self._path, "a", encoding="utf-8") as f:
                f.writelines(lines)


class Tracker:
    """A tracker's handlers, one method per event; each gets the event as a dict.

    Subclasses override what they use; :func:`serve` calls them in the sweep's order.
    """

    def sweep(self, event: dict[str, Any]) -> None:
        """The sweep's first event (at every start of the tracker)."""

    def start(self, event: dict[str, Any]) -> None:
        """An attempt of a trial starts."""

    def report(self, event: dict[str, Any]) -> None:
        """A trial's intermediate report."""

    def checkpoint(self, event: dict[str, Any]) -> None:
        """A trial's checkpoint is committed (``step``; its folder ``OUT/checkpoints/TRIAL/``)."""

    def end(self, event: dict[str, Any]) -> None:
        """A trial's record."""

    def sweep_end(self, event: dict[str, Any]) -> None:
        """The run is over; the last event."""

    def idle(self) -> bool:
        """Every event sent so far has been handled, and no more wait: a tracker that gathers work
        into batches while it is behind (one database transaction for many events) does it now.
        Also called once the input ends. Returns True while work remains: :func:`serve` calls it
        again unless events wait (the sweep counts a tracker that reads nothing for 30 s as hung,
        so one call should take a second or so at most)."""
        return False


def _handle(tracker: Tracker, line: Union[str, bytes]) -> None:
    event = json.loads(line)
    kind = str(event.get("event"))
    handler = getattr(tracker, kind, None)
    if handler is not None and not kind.startswith("_") and kind != "idle":
        handler(event)


def serve(tracker: Tracker, stream: Optional[Any] = None) -> None:
    """Reads the sweep's events from ``stream`` (stdin) and calls ``tracker``'s method for each,
    and its :meth:`Tracker.idle` whenever no more events wait and at the end.

    An event of a kind the tracker does not know is skipped (later versions may add kinds).
    """
    if stream is not None:
        for line in stream:
            _handle(tracker, line)
        while tracker.idle():
            pass
        return
    fd, rest = sys.stdin.fileno(), b""
    while chunk := os.read(fd, 1 << 16):
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                _handle(tracker, line)
        while not select.select([fd], [], [], 0)[0] and tracker.idle():
            pass
    if rest.strip():
        _handle(tracker, rest)
    while tracker.idle():
        pass
