"""Intermediate reports of a sweep's trial, for early stopping (docs/sweeps.md#early-stopping):
``isorun.report(step=3, loss=0.41)`` while the function runs, and ``isorun.should_stop()`` for
a function that stops cleanly when its trial is pruned."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from typing import Any

__all__ = ["report", "should_stop"]

_stop_asked = False
_installed = False


def _plain(value: Any) -> Any:
    # NaN and the infinities have no JSON form: null, which early stopping takes for the worst.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "tolist"):  # NumPy scalars and arrays
        return _plain(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def report(step: int, **metrics: Any) -> None:
    """Reports the trial's ``step`` and its metrics then (``isorun.report(step=3, loss=0.41)``),
    which the sweep's scheduler (ASHA, median) judges while the trial runs. Written at once as
    one line ``{"step": 3, "loss": 0.41}`` on stdout, which the sweep reads as the trial's log
    grows (outside a sweep it is a line of output)."""
    if isinstance(step, bool) or not isinstance(step, int) and not hasattr(step, "__index__"):
        raise TypeError(f"report: step is a whole number, not {type(step).__name__}")
    if int(step) < 0:
        raise ValueError("report: step is 0 or more")
    write_line({"step": int(step), **_plain(metrics)})


def write_line(fields: dict[str, Any]) -> None:
    """``fields`` as one JSON line on stdout, which a sweep reads as the trial's log grows."""
    line = json.dumps(fields, allow_nan=False) + "\n"
    sys.stdout.flush()  # what the function printed before comes first
    data = line.encode()
    while data:  # one write for a line of ordinary size: never interleaved, never seen in part
        data = data[os.write(sys.stdout.fileno(), data):]


def _on_stop(signum: int, frame: Any) -> None:
    global _stop_asked
    _stop_asked = True


def should_stop() -> bool:
    """Whether the trial has been asked to stop (early stopping pruned it, or the sweep is
    stopping), for a function that stops cleanly (a checkpoint, say). From the first call on
    (make it before the first report), a SIGTERM no longer ends the interpreter at once but makes
    this True, and the function has the stop's grace period to return; the stop stands (a pruned
    trial is journaled with its last report). A function that never asks is ended by it."""
    global _installed
    if not _installed:
        signal.signal(signal.SIGTERM, _on_stop)
        _installed = True
    return _stop_asked
