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
    "WorkerExited",
    "Timeout",
    "OutOfMemory",
    "InvalidResult",
    "Cancelled",
    "UsageError",
    "InternalError",
    "RemoteTraceback",
    "LargeCallWarning",
]


class Error(Exception):
    """Base of every isorun error."""

    outcome: Optional[Outcome]

    def __init__(self, message: str, outcome: Optional[Outcome] = None) -> None:
        super().__init__(message)
        self.outcome = outcome


class TaskError(Error):
    """The function raised an exception that could not be re-raised as itself in the caller:
    neither it nor its type and attributes pickled in the worker, or its type does not unpickle
    here, or it is one that would end the caller (``KeyboardInterrupt``, ``GeneratorExit``).
    ``type_name`` names its type, ``attributes`` holds the reprs of its attributes, ``reason``
    says why it is not itself, and ``remote_traceback`` is the worker's traceback as text."""

    def __init__(self, message: str, outcome: Optional[Outcome] = None, *, type_name: str = "",
                 remote_traceback: str = "", attributes: Optional[dict[str, str]] = None,
                 reason: str = "") -> None:
        super().__init__(message, outcome)
        self.type_name = type_name
        self.remote_traceback = remote_traceback
        self.attributes: dict[str, str] = dict(attributes or {})
        self.reason = reason


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


class WorkerExited(WorkerCrashed):
    """The worker exited without a result: the function called ``sys.exit()`` (or raised
    ``SystemExit``) or ``os._exit()``, or something it called ended the process. In the worker,
    ``SystemExit`` ends the interpreter as it would in a script (``atexit`` handlers run); in the
    caller it is this exception, never a ``SystemExit`` of its own. ``exit_code`` is the status."""


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


class LargeCallWarning(UserWarning):
    """The pickled call (the function, what it captured, its arguments) is large: it is copied
    to every worker. Pass large data as a file or load it in the function instead of capturing
    it. Warned once per function."""
