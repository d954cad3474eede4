"""The live progress of many calls or trials (``progress=True`` of :func:`isorun.map`,
:meth:`isorun.Executor.map`, :func:`isorun.sweep`): tqdm where it is installed, else one line
of isorun's own on stderr."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Optional

from .errors import UsageError


def check(progress: Any) -> bool:
    """``progress`` as a bool; anything else is a :class:`UsageError`."""
    if not isinstance(progress, bool):
        raise UsageError(f"progress takes True or False, not {progress!r}")
    return progress


def _tqdm() -> Any:
    """tqdm's class, or None where tqdm is not installed. ``tqdm.auto``: a widget in Jupyter,
    a text bar elsewhere."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """Done of total, failures and the rate, shown as they change; safe to update from any
    thread (futures' callbacks run on the runner's threads). ``done`` and ``failed`` may start
    above 0 (a resumed sweep), and the rate counts only what ended since. ``total`` is None where
    it is not known (inputs from a generator)."""

    def __init__(self, total: Optional[int], unit: str, done: int = 0, failed: int = 0) -> None:
        self._total, self._unit = total, unit
        self._done, self._failed, self._start_done = done, failed, done
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._closed = False
        self._ended = threading.Event()
        self._tenth = -1  # for a stderr that is not a terminal: the last tenth written,
        self._written = -1  # and the count it was written at
        tqdm = _tqdm()
        self._bar = (tqdm(total=total, initial=done, unit=f" {unit}", file=sys.stderr, dynamic_ncols=True)
                     if tqdm else None)
        self._terminal = self._bar is None and sys.stderr.isatty()
        self._show()

    def advance(self, failed: bool = False) -> None:
        """One more ended, ``failed`` or not."""
        with self._lock:
            self._set(self._done + 1, self._failed + failed)

    def update(self, done: int, failed: int) -> None:
        """``done`` have ended so far, ``failed`` of them failed."""
        with self._lock:
            self._set(done, failed)

    def _set(self, done: int, failed: int) -> None:
        if self._closed or (done, failed) == (self._done, self._failed):
            return
        if self._bar is not None:
            self._bar.update(done - self._done)
        self._done, self._failed = done, failed
        self._show()
        if self._total is not None and done >= self._total:
            self._close()

    def close(self) -> None:
        """Ends the display (the last line stays)."""
        with self._lock:
            self._close()

    def wait(self) -> None:
        """Returns once the display has ended: all have ended, or :meth:`close` was called."""
        self._ended.wait()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._terminal:
            sys.stderr.write("\n")
        elif self._written != self._done:
            self._write(self._line() + "\n")  # where it stopped
        self._ended.set()  # (once the last line is out)

    def _line(self) -> str:
        elapsed = time.monotonic() - self._start
        rate = (self._done - self._start_done) / elapsed if elapsed > 0 else 0.0
        of = "" if self._total is None else f"/{self._total}"
        return f"isorun: {self._done}{of} {self._unit}, {self._failed} failed, {rate:.2f}/s"

    def _show(self) -> None:
        if self._bar is not None:
            if self._failed:
                self._bar.set_postfix(failed=self._failed)
            return
        if self._terminal:
            self._write("\r" + self._line() + "\033[K")  # rewritten in place; the end of a longer line erased
            return
        # A log, not a terminal: a line per tenth (without a total, each time the count doubles),
        # not one per update.
        tenth = 10 * self._done // max(self._total, 1) if self._total is not None else self._done.bit_length()
        if tenth > self._tenth:
            self._tenth, self._written = tenth, self._done
            self._write(self._line() + "\n")

    @staticmethod
    def _write(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()
