"""The exceptions of isolated calls: one per way a call can end other than with its value.

Every class derives from :class:`isorun.Error`, and also from the built-in exception a Python
user would catch for the same failure (``TimeoutError``, ``MemoryError``, ``ValueError``...).
Each carries the call's :class:`isorun.Outcome` (``None`` for :class:`UsageError`, raised before
anything started).

The function's own exception is not wrapped: it is raised in the caller with its original type
wherever it unpickles there, with the worker's traceback chained as its ``__cause__``.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ._outcome import Outcome

__all__ = [
    "Error",
    "TaskError",
    "WorkerCrashed",
    "Timeout",
    "OutOfMemory",
    "InvalidResult",
    "Cancelled",
    "UsageError",
    "InternalError",
    "RemoteTraceback",
]


class Error(Exception):
    """Base of every isorun error."""

    outcome: Optional["Outcome"]

    def __init__(self, message: str, outcome: Optional["Outcome"] = None) -> None:
        super().__init__(message)
        self.outcome = outcome


class TaskError(Error):
    """The function raised an exception that could not be re-raised as itself in the caller
    (its type does not unpickle here). ``type_name`` names it; ``remote_traceback`` is the
    worker's traceback as text."""

    def __init__(self, message: str, outcome: Optional["Outcome"] = None, *, type_name: str = "",
                 remote_traceback: str = "") -> None:
        super().__init__(message, outcome)
        self.type_name = type_name
        self.remote_traceback = remote_traceback


class WorkerCrashed(Error):
    """The worker died (a signal) or exited without delivering a result."""

    @property
    def signal(self) -> int:
        """The signal that ended the worker, or 0 if it exited."""
        return self.outcome.signal if self.outcome else 0

    @property
    def exit_code(self) -> int:
        """The worker's exit code, or -1 if a signal ended it."""
        return self.outcome.exit_code if self.outcome else -1

    @property
    def stderr_tail(self) -> list[str]:
        """The last lines the worker wrote to stderr."""
        return list(self.outcome.stderr_tail) if self.outcome else []


class Timeout(Error, TimeoutError):
    """The call ran past its ``timeout`` and its worker was stopped, with its whole process group."""


class OutOfMemory(Error, MemoryError):
    """The function hit its memory cap (``mem_limit``)."""


class InvalidResult(Error):
    """The worker delivered something that failed validation (a bad handshake, a corrupt,
    truncated or oversized result). It was discarded."""


class Cancelled(Error, concurrent.futures.CancelledError):
    """The call was stopped by the caller: ``Future.cancel()``, ``cancel()`` or Ctrl-C."""


class UsageError(Error, ValueError):
    """The call cannot be made as asked (a bad option, a GPU that does not exist, a cap larger
    than the GPU). Nothing was started."""


class InternalError(Error, RuntimeError):
    """isorun itself failed (shared memory or the worker process could not be created)."""


class RemoteTraceback(Exception):
    """The worker's traceback, as the ``__cause__`` of an exception re-raised in the caller."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n(in the isolated worker)\n" + self.text
