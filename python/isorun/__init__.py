"""isorun for Python: each call of a function in a fresh Python process (forked from a zygote
that never touched CUDA, or exec'd), supervised by isorun's C++ runner in this process, under a
GPU memory cap, with results over shared memory.

    import isorun

    @isorun.isolated(gpu=0, mem_limit="2G", timeout="10m")
    def train(lr, hidden): ...

    r = train(0.1, 64)                # a fresh Python process
    fut = train.submit(0.1, 64)       # a concurrent.futures.Future; fut.cancel() stops the worker
    res = train.try_call(0.1, 64)     # res.ok, res.value, res.outcome
    rs = isorun.map(train, [dict(lr=l, hidden=64) for l in (0.1, 0.01)], gpus="all", mem_limit="6G",
                    progress=True)    # a live bar: tqdm where installed
    records = isorun.sweep({"python": train, "params": {"lr": [0.1, 0.01]}, "metric": "accuracy"})
    for record in isorun.sweep_iter(spec): ...   # each record as it is journaled

    import isorun.joblib              # joblib.parallel_backend("isorun", n_jobs=2, host_mem_limit="2G")

See docs/python.md.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._api import IsolatedFunction, IsolatedFuture, PoolStats, isolated, map, pool_stats, stop_standby
    from ._checkpoint import Checkpoint, checkpoint, latest_checkpoint, should_checkpoint
    from ._executor import Executor, imap
    from ._outcome import Outcome, Result
    from ._pool import segment_pool_stats, set_segment_pool
    from ._report import report, should_stop
    from ._sweep import SweepResults, sweep, sweep_iter
    from .errors import (
        Cancelled,
        Error,
        InternalError,
        InvalidResult,
        LargeCallWarning,
        OutOfMemory,
        RemoteTraceback,
        TaskError,
        Timeout,
        UsageError,
        WorkerCrashed,
        WorkerExited,
    )

# Imported on first use (PEP 562): a worker interpreter imports isorun._worker, and with it this
# package, on every call's critical path; it needs none of the caller's machinery.
_WHERE = {
    **dict.fromkeys(["IsolatedFunction", "IsolatedFuture", "isolated", "map", "stop_standby", "pool_stats",
                     "PoolStats"], "_api"),
    **dict.fromkeys(["Executor", "imap"], "_executor"),
    **dict.fromkeys(["Outcome", "Result"], "_outcome"),
    **dict.fromkeys(["set_segment_pool", "segment_pool_stats"], "_pool"),
    **dict.fromkeys(["sweep", "sweep_iter", "SweepResults"], "_sweep"),
    **dict.fromkeys(["report", "should_stop"], "_report"),
    **dict.fromkeys(["Checkpoint", "checkpoint", "latest_checkpoint", "should_checkpoint"], "_checkpoint"),
    **dict.fromkeys(["Cancelled", "Error", "InternalError", "InvalidResult", "OutOfMemory", "RemoteTraceback",
                     "TaskError", "Timeout", "UsageError", "WorkerCrashed", "WorkerExited",
                         "LargeCallWarning"], "errors"),
}


__version__: str  # VERSION's (the top of the source tree), through _version() at first use


def _version() -> str:
    try:
        # Written by the build from VERSION (python/CMakeLists.txt), in the build tree and the wheel.
        from ._version import version
    except ImportError:  # python/isorun itself, not a build of it: the installed distribution's
        from importlib.metadata import version as installed

        return installed("isorun")
    return str(version)


def __getattr__(name: str) -> Any:
    if name == "__version__":  # (read at first use, off a worker's start)
        value = globals()[name] = _version()
        return value
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'isorun' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE) | {"__version__"})


__all__ = [
    "isolated",
    "map",
    "imap",
    "Executor",
    "stop_standby",
    "pool_stats",
    "PoolStats",
    "set_segment_pool",
    "segment_pool_stats",
    "sweep",
    "sweep_iter",
    "SweepResults",
    "report",
    "should_stop",
    "checkpoint",
    "latest_checkpoint",
    "should_checkpoint",
    "Checkpoint",
    "IsolatedFunction",
    "IsolatedFuture",
    "Outcome",
    "Result",
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
