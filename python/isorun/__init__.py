"""isorun for Python: each call of a function in a fresh, exec'd Python interpreter, supervised
by isorun's C++ runner in this process, under a GPU memory cap, with results over shared memory.

    import isorun

    @isorun.isolated(gpu=0, mem_limit="2G", timeout="10m")
    def train(lr, hidden): ...

    r = train(0.1, 64)                # a fresh Python process
    fut = train.submit(0.1, 64)       # a concurrent.futures.Future; fut.cancel() stops the worker
    res = train.try_call(0.1, 64)     # res.ok, res.value, res.outcome
    rs = isorun.map(train, [dict(lr=l, hidden=64) for l in (0.1, 0.01)], gpus="all", mem_limit="6G")

See docs/python.md.
"""

from ._api import IsolatedFunction, IsolatedFuture, isolated, map, stop_standby
from ._outcome import Outcome, Result
from .errors import (
    Cancelled,
    Error,
    InternalError,
    InvalidResult,
    OutOfMemory,
    RemoteTraceback,
    TaskError,
    Timeout,
    UsageError,
    WorkerCrashed,
)

__version__ = "0.1.0"

__all__ = [
    "isolated",
    "map",
    "stop_standby",
    "IsolatedFunction",
    "IsolatedFuture",
    "Outcome",
    "Result",
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
