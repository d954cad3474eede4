"""How a call ended, as values: :class:`Outcome` and :class:`Result`."""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, Optional, TypeVar

__all__ = ["Outcome", "Result"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one isolated call ended.

    ``kind`` is one of ``"success"``, ``"task_error"``, ``"out_of_memory"``, ``"crashed"``,
    ``"timeout"``, ``"cancelled"``, ``"invalid_result"``, ``"internal_error"``.
    """

    kind: str
    message: str = ""
    error_type: str = ""  #: the exception's type, for task_error and out_of_memory
    exit_code: int = -1  #: the worker's exit code, -1 when a signal ended it (or not known)
    signal: int = 0  #: the signal that ended the worker, 0 if none
    core_dumped: bool = False
    stderr_tail: tuple[str, ...] = ()  #: the last lines of the worker's stderr
    wall: float = 0.0  #: seconds from assignment to the worker's end (or the early hand-over)
    run: float = 0.0  #: seconds inside the function
    timeout: float = 0.0  #: the timeout that stopped it, seconds
    peak_allocated: int = 0  #: the allocator's peaks on the device, bytes (0 when unknown)
    peak_reserved: int = 0
    host_memory_peak: int = 0  #: the worker's cgroup memory.peak, bytes (0 when unknown)
    exit_pending: bool = False  #: handed over early (early_result); the exit is not known yet
    device: str = ""  #: "cpu" or the GPU's UUID
    pid: int = 0  #: the worker's pid (it may name another process by now)
    traceback: str = ""  #: the worker's traceback when the function raised
    #: With mem_limit on a GPU: the cap on the driver API, {"limit", "refusals",
    #: "largest_refused", "peak"} in bytes and counts; None without it.
    driver_cap: Optional[dict[str, int]] = None
    #: With capture_output=True: what the worker wrote to stdout and stderr (else None).
    stdout: Optional[str] = None
    stderr: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the call returned its value."""
        return self.kind == "success"

    @classmethod
    def _from_core(cls, d: dict[str, Any], **changes: Any) -> Outcome:
        o = cls(
            kind=d["kind"],
            message=d["message"],
            error_type=d["error_type"],
            exit_code=d["exit_code"],
            signal=d["signal"],
            core_dumped=d["core_dumped"],
            stderr_tail=tuple(d["stderr_tail"]),
            wall=d["wall_s"],
            run=d["run_s"],
            timeout=d["timeout_s"],
            peak_allocated=d["peak_allocated"],
            peak_reserved=d["peak_reserved"],
            host_memory_peak=d["host_memory_peak"],
            exit_pending=d["exit_pending"],
            device=d["device"],
            pid=d["pid"],
            driver_cap=d.get("driver_cap"),
        )
        return dataclasses.replace(o, **changes) if changes else o

    def describe(self) -> str:
        """One line: ``"task_error: ValueError: bad lr"``."""
        what = f"{self.error_type}: {self.message}" if self.error_type else self.message
        return f"{self.kind}: {what}" if what else self.kind


class Result(Generic[T]):
    """A finished call as a value (what ``try_call`` returns): never raises for failures of the
    function or its worker until :attr:`value` is read."""

    __slots__ = ("outcome", "_value", "_error")

    def __init__(self, outcome: Outcome, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.outcome = outcome
        self._value = value
        self._error = error

    @property
    def ok(self) -> bool:
        """True when the call returned its value."""
        return self._error is None

    @property
    def value(self) -> T:
        """The function's return value; raises the call's exception if it failed."""
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def exception(self) -> Optional[BaseException]:
        """The exception :attr:`value` would raise, or None."""
        return self._error

    def __repr__(self) -> str:
        return f"Result(ok={self.ok}, outcome={self.outcome.describe()!r})"
