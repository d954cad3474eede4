"""Isolated calls: :func:`isolated`, :class:`IsolatedFunction`, :func:`map`."""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import functools
import inspect
import itertools
import os
import select
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from concurrent.futures._base import CANCELLED as _CANCELLED
from concurrent.futures._base import CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED
from concurrent.futures._base import PENDING as _PENDING
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypeVar, Union, overload

from . import _core, _options, _output, _pool
from ._outcome import Outcome, Result
from ._payload import RAISED, code_names, decode_result, encode_call, importable
from .errors import (
    Cancelled,
    InternalError,
    InvalidResult,
    OutOfMemory,
    RemoteTraceback,
    TaskError,
    Timeout,
    UsageError,
    WorkerCrashed,
    WorkerExited,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["isolated", "IsolatedFunction", "IsolatedFuture", "map", "stop_standby", "pool_stats", "PoolStats"]

R = TypeVar("R")


class _Options:
    """The options of isolated() as given, resolved once (_options.resolve) when the function is
    wrapped; each option's resolved value is an attribute of the same name (``gpus``: "all" or a
    tuple; ``timeout`` and ``grace`` as ``timeout_ms`` and ``grace_ms``)."""

    def __init__(self, given: Mapping[str, Any]) -> None:
        self.given = dict(given)  # what options() changes and resolves again
        self._values = _options.resolve(self.given)
        # launch()'s last answer and the sys.path it was made for: [(path, answer)].
        self._launch: list = []

    @classmethod
    def resolve(cls, **given: Any) -> _Options:
        _options.check_names(given, "isolated()")
        return cls(given)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # (not yet set while unpickling)
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"isolated() has no option {name!r}") from None

    def __getstate__(self) -> dict[str, Any]:
        # Without the launch kept for calls (its C++ options do not pickle): made again where used.
        return {"given": self.given, "_values": self._values, "_launch": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Options) and self._values == other._values

    __hash__ = None  # type: ignore[assignment]

    def changed(self, changes: Mapping[str, Any]) -> _Options:
        """These options with ``changes``; a change of where the call runs replaces the old
        placement as a whole (gpu=1 on a function that had gpus=[0, 1] is one GPU)."""
        _options.check_names(changes, "options()")
        given = dict(self.given)
        if changes.keys() & set(_options.PLACEMENT):
            for name in _options.PLACEMENT:
                given.pop(name, None)
        given.update(changes)
        return _Options(given)

    @property
    def timeout_ms(self) -> int:
        return int(self._values["timeout"])

    @property
    def grace_ms(self) -> int:
        return int(self._values["grace"])

    @property
    def adaptive(self) -> bool:
        """start="auto" as it applies: an adaptive pool of workers forked from a zygote (not with
        warm_context, whose waiting workers hold a CUDA context a zygote never has)."""
        return self.start == "auto" and not self.warm_context

    @property
    def zygote(self) -> bool:
        """Workers forked from a zygote interpreter, not exec'd each."""
        return self.start == "zygote" or self.adaptive

    @property
    def on_gpu(self) -> bool:
        """Whether the call names its GPUs (else it runs where an executor puts it, or on the CPU)."""
        return self.gpu is not None or bool(self.gpus) or self.gpu_count > 0

    def launch(self, output: Optional[_output.CallOutput] = None) -> _core.Launch:
        """How a call's worker is launched (its argv, launch environment and C++ options, the
        descriptors of ``output`` where the caller reads its output), which the calls share: made
        once for as long as sys.path and the descriptors stay the same (each call's path runs
        cold, where building it anew costs tens of µs), and a queued call holds a reference to
        it, not a copy. (Calls that forward their output into the caller's ``sys.stdout`` share
        its pipe; calls that capture theirs have pipes, and so a launch, of their own.)"""
        fds = output.fds() if output is not None else None
        cached = self._launch[:1]  # [(sys.path, fds, made)], read at once: another thread may replace it
        if cached and cached[0][0] == sys.path and cached[0][1] == fds and self.gpus != "all":
            return cached[0][2]
        options = self.core() if output is None else output.apply(self.core())
        made = _core.Launch(self.argv(), self.launch_env(), options)
        self._launch[:] = [(list(sys.path), fds, made)]
        return made

    def core(self) -> _core.CallOptions:
        o = _core.CallOptions()
        for name, field in _options.CORE_FIELDS:
            setattr(o, field, self._values[name])
        o.gpus = _all_gpus() if self.gpus == "all" else list(self.gpus)
        # A small result comes back as the worker reports it, not after its exit, where its
        # output goes straight to fds 1 and 2 (_output.CallOutput.apply turns this off).
        o.early_small_result = not self.early_result
        o.zygote = self.zygote
        if self.adaptive and not self.standby:
            # One worker kept forked and waiting (more while calls come back to back), from the
            # end of the first call until calls stop coming for a while.
            o.standby = 1
            o.linger_ms = _idle_ms()
        return o

    def argv(self) -> list[str]:
        # argv[0] is the interpreter's own path: Python finds its prefix (and a venv) from it.
        # The folder isorun was imported from comes last on the worker's path, for where it is
        # not on the interpreter's own (a build tree, a folder on this process's sys.path).
        return [self.python, "-c", _BOOTSTRAP.format(root=_PACKAGE_ROOT)]

    def launch_env(self) -> list[str]:
        if not self.preload:
            return []
        # A standby interpreter imports before its call (and the call's sys.path) arrives: it
        # gets this process's sys.path at launch to find them where this process would.
        return [f"ISORUN_PY_PRELOAD={','.join(self.preload)}",
                f"ISORUN_PY_PATH={os.pathsep.join(p for p in sys.path if p)}"]


def _all_gpus() -> list[int]:
    """Every GPU's index (gpus="all"), as map's plan finds them."""
    slots, _how = _core.plan_slots([], True, 0, 1, 0)
    found = sorted({i for slot in slots for i in slot})
    if not found:
        raise UsageError("gpus='all': this machine has no GPU (use cpu=True)")
    return found


IDLE_ENV = _pool.IDLE_ENV
_idle_ms = _pool.idle_ms
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOTSTRAP = "import sys; sys.path.append({root!r}); from isorun._worker import main; main()"

_pool.apply_default()  # a caller keeps at most 256 MiB of idle segments, unless set_segment_pool says


# Calls in flight, so that the interpreter's exit stops them before it finalizes; and the futures
# of calls the process's watcher watches (isorun._core), by token, which one thread completes as
# their calls end: a call in flight costs no thread of its own.
_live_jobs: set[_core.Job] = set()
_live_lock = threading.Lock()
_exiting = threading.Event()  # set at the interpreter's exit: no new call is started
_futures: dict[int, IsolatedFuture] = {}
_futures_lock = threading.Lock()  # held while a call is started and its future recorded
_tokens = itertools.count(1)
_completer: Optional[threading.Thread] = None


def _complete_futures() -> None:
    """The completer thread: completes the futures of the calls that ended, in the order they
    ended, until the interpreter's exit closes the completions."""
    while True:
        tokens = _core.take_completed()
        if tokens is None:
            return
        for token in tokens:
            with _futures_lock:  # (recorded once its start returned)
                future = _futures[token]
            try:
                future._complete()
            finally:
                with _futures_lock:  # (in flight until complete: an executor's shutdown waits for it)
                    del _futures[token]


def _in_flight(owner: object) -> list[IsolatedFuture]:
    """The futures of ``owner``'s calls (an executor's) that are not complete yet."""
    with _futures_lock:
        return [f for f in _futures.values() if f._owner is owner]


def _start_completer() -> None:
    global _completer
    with _live_lock:
        if _completer is None:
            _completer = threading.Thread(target=_complete_futures, name="isorun-completions", daemon=True)
            _completer.start()


def _track(job: _core.Job) -> None:
    with _live_lock:
        _live_jobs.add(job)
        late = _exiting.is_set()  # started as the interpreter's exit stopped the others
    if late:
        job.cancel()


# The output pipes of calls in flight (_output), closed with their call.
_outputs: dict[_core.Job, _output.CallOutput] = {}


def _untrack(job: _core.Job) -> Optional[tuple[str, str]]:
    """The call has ended (or was stopped and waited for): forgotten, its output pipes closed and
    drained. Returns (stdout, stderr) where they were captured."""
    with _live_lock:
        _live_jobs.discard(job)
        output = _outputs.pop(job, None)
    return output.close() if output is not None else None


# The workers of the latest calls handed over before their exit (an early result), which the
# watcher reaps as they end: what tests wait for before they count this process's children.
_early_exits: collections.deque[int] = collections.deque(maxlen=256)


def _wait_early_exits() -> None:
    """Waits until each worker of a call handed over early, that is still this process's child,
    has ended."""
    while _early_exits:
        pid = _early_exits.popleft()
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:  # (after the pidfd: the same process, or one gone)
                mine = int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
            if mine:
                select.select([fd], [], [])
        except OSError:
            pass
        finally:
            os.close(fd)


def _wait_all() -> None:
    """Waits until every call in flight has ended and its worker is gone."""
    with _live_lock:
        jobs = list(_live_jobs)
    for job in jobs:
        job.wait(None)
    _core.wait_idle()  # (a GPU worker that handed its result over early exits behind it, holding its slot)


@atexit.register
def _stop_everything() -> None:
    with _live_lock:
        _exiting.set()
        jobs = list(_live_jobs)
        completer = _completer
    for job in jobs:
        job.cancel()
    for job in jobs:
        job.wait(None)
    _core.close_completions()  # the futures of those calls are completed, then the completer ends
    if completer is not None:
        completer.join()
    _core.stop_standby()


def _tail(outcome: Outcome) -> str:
    lines = [line for line in outcome.stderr_tail if line.strip()]
    # The worker's faulthandler wrote the Python stack of a fatal signal: all of it, from its
    # first line on (the frame that crashed is not among the last few lines).
    fatal = next((i for i, line in enumerate(lines) if line.startswith(("Fatal Python error", "Current thread ",
                                                                         "Thread 0x"))), None)
    lines = lines[fatal:] if fatal is not None else lines[-5:]
    return ("; stderr ends:\n  " + "\n  ".join(lines)) if lines else ""


def _task_error(obj: Any, outcome: Outcome) -> TaskError:
    """The function's exception, where it cannot be itself here: its type, message and
    attributes (reprs), and why."""
    message = f"{obj.type_name}: {obj.message}"
    if obj.attributes:
        message += " [" + ", ".join(f"{k}={v}" for k, v in obj.attributes.items()) + "]"
    if obj.reason:
        message += f" (not raised as itself: {obj.reason})"
    return TaskError(message, outcome, type_name=obj.type_name, remote_traceback=obj.tb,
                     attributes=obj.attributes, reason=obj.reason)


def _finish(job: _core.Job) -> Result[Any]:
    """The finished job as a Result: value, or the exception the call raises."""
    captured = None
    try:
        core_outcome, payload = job.result()
    finally:
        captured = _untrack(job)
    outcome = Outcome._from_core(core_outcome)
    if outcome.exit_pending and outcome.pid > 0:
        _early_exits.append(outcome.pid)
    if captured is not None:
        outcome = dataclasses.replace(outcome, stdout=captured[0], stderr=captured[1])
    kind = outcome.kind
    if kind == "success":
        try:
            tag, obj = decode_result(payload)
        except Exception as exc:  # noqa: BLE001 - anything the payload or its unpickling raised
            outcome = dataclasses.replace(outcome, kind="invalid_result",
                                          message=f"the result could not be read: {type(exc).__name__}: {exc}")
            err = InvalidResult(outcome.message, outcome)
            err.__cause__ = exc
            return Result(outcome, error=err)
        if tag != RAISED:
            return Result(outcome, obj)
        outcome = dataclasses.replace(outcome, kind="task_error", error_type=obj.type_name, message=obj.message,
                                      traceback=obj.tb)
        cap = outcome.driver_cap
        if cap and cap["refusals"]:
            # The framework's own out-of-memory error, raised after the cap refused it memory.
            report = (f"the function reached its mem_limit of {cap['limit']} bytes: {cap['refusals']} device "
                      f"allocation(s) refused (the largest {cap['largest_refused']} bytes), peak "
                      f"{cap['peak']} bytes; it raised {obj.type_name}: {obj.message}")
            outcome = dataclasses.replace(outcome, kind="out_of_memory", message=report)
            oom = OutOfMemory(report, outcome)
            oom.remote_traceback = obj.tb  # type: ignore[attr-defined]  # as a TaskError has it
            oom.__cause__ = obj.exc if obj.exc is not None else RemoteTraceback(obj.tb)
            return Result(outcome, error=oom)
        raised = obj.exc
        if raised is None:
            raised = _task_error(obj, outcome)
        else:
            try:
                raised.remote_traceback = obj.tb
                raised.isorun_outcome = outcome
            except Exception:  # noqa: BLE001 - an exception type that refuses new attributes
                pass
        raised.__cause__ = RemoteTraceback(obj.tb)
        return Result(outcome, error=raised)
    message = outcome.describe()
    error: BaseException
    if kind == "task_error":
        error = TaskError(message, outcome, type_name=outcome.error_type)
    elif kind == "out_of_memory":
        error = OutOfMemory(message, outcome)
    elif kind == "crashed":
        # Exited (sys.exit, os._exit) rather than killed by a signal.
        crashed = WorkerExited if outcome.signal == 0 and outcome.exit_code >= 0 else WorkerCrashed
        error = crashed(message + _tail(outcome), outcome)
    elif kind == "timeout":
        error = Timeout(message, outcome)
    elif kind == "cancelled":
        error = Cancelled(message, outcome)
    elif kind == "invalid_result":
        error = InvalidResult(message, outcome)
    else:
        error = InternalError(message + _tail(outcome), outcome)
    return Result(outcome, error=error)


_MAKING = threading.Lock()  # makes futures' conditions (IsolatedFuture._condition)


class IsolatedFuture(concurrent.futures.Future):
    """The future of one isolated call (:meth:`IsolatedFunction.submit`).

    A ``concurrent.futures.Future``, except that :meth:`cancel` also works while the call runs:
    it stops the worker (SIGTERM, then SIGKILL after the grace period), and the future is then
    cancelled. ``result()`` raises the call's exception as calling the function would.
    """

    def __init__(self, job: _core.Job, owner: object = None) -> None:
        # concurrent.futures.Future.__init__, but for its condition, made on first use
        # (_condition): a Condition is most of a future's size, and a hundred thousand queued
        # calls' futures are mostly never waited on one by one.
        self._state = _PENDING
        self._result = None
        self._exception: Optional[BaseException] = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[concurrent.futures.Future], object]] = []
        self._job = job
        self._owner = owner  # the executor that submitted it (_in_flight)
        self._outcome: Optional[Outcome] = None
        self._call_result: Optional[Result[Any]] = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        made = self.__dict__.get("_made_condition")
        if made is None:
            with _MAKING:
                made = self.__dict__.get("_made_condition")
                if made is None:
                    made = self.__dict__["_made_condition"] = threading.Condition()
        return made

    def _cancel_queued(self) -> bool:
        """``Future.cancel()`` for a call that has not started, without making the condition
        where none is made yet: then no thread waits on it and no callback was added, and
        while ``_MAKING`` is held none can be. (An executor's shutdown cancels a hundred
        thousand at once.)"""
        with _MAKING:
            if "_made_condition" not in self.__dict__:
                if self._state == _PENDING:
                    self._state = _CANCELLED
                return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED)
        return concurrent.futures.Future.cancel(self)

    def _running_or_notify_cancel(self) -> bool:
        """``set_running_or_notify_cancel()``, for a call cancelled by _cancel_queued without
        making its condition."""
        with _MAKING:
            if "_made_condition" not in self.__dict__ and self._state == _CANCELLED:
                self._state = _CANCELLED_AND_NOTIFIED
                return False
        return self.set_running_or_notify_cancel()

    @property
    def pid(self) -> int:
        """The worker's pid (it may name another process once the worker is gone)."""
        return self._job.pid

    @property
    def outcome(self) -> Optional[Outcome]:
        """How the call ended, once it has."""
        return self._outcome

    def cancel(self) -> bool:
        """Stops the call's worker; True if the future is now cancelled (False once done)."""
        if not super().cancel():
            return False
        self._job.cancel()
        return True

    def running(self) -> bool:
        """True once the call has been admitted and its worker started, until it ends."""
        return not self.done() and self._job.started

    def _complete(self) -> None:
        self._job.wait(None)
        try:
            result = _finish(self._job)
        except BaseException as exc:  # noqa: BLE001 - the worker could not be started at all
            self._call_result = Result(None, error=exc)  # type: ignore[arg-type]
            if self._running_or_notify_cancel():
                self.set_exception(exc)
            return
        self._call_result = result
        self._outcome = result.outcome
        if not self._running_or_notify_cancel():
            return  # cancelled: result() raises CancelledError
        if result.ok:
            self.set_result(result.value)
        else:
            self.set_exception(result.exception)


def _importable_module_of(fn: Callable[..., Any]) -> Optional[str]:
    """The module a module-level function is found in by the worker's import, else None (a
    function of ``__main__`` or of a module no finder knows, a lambda, a closure, a method:
    those travel by value)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not isinstance(module, str) or not importable(module) or "<" in qualname or "." in qualname:
        return None
    loaded = sys.modules.get(module)
    if loaded is None or getattr(loaded, qualname, None) is not fn:
        return None
    return module


@functools.lru_cache(maxsize=256)
def _packages_named_by(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The third-party packages ``fn``'s code names (``np.`` of a global ``np``, an ``import
    torch`` in its body, in nested functions too) that this process has imported: what a zygote
    preloads for it. Not the standard library (cheap to import), not isorun, not ``__main__``."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ()
    names = code_names(code)
    glob = getattr(fn, "__globals__", {})
    found = []
    for name in sorted(names):
        value = glob.get(name)
        module = getattr(value, "__name__", None) if isinstance(value, types.ModuleType) else \
            (name if name in sys.modules else None)
        top = module.partition(".")[0] if module else None
        if top and top not in _STDLIB and top != "isorun" and top not in found and preloadable(top):
            found.append(top)
    return tuple(found)


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))  # (Python 3.10+; before, stdlib ones are kept)


def preloadable(module: str) -> bool:
    """Whether a worker can preload ``module``: loaded here from a file (not a built-in one) and
    found by the worker's import (:func:`importable`: not ``__main__``, not loaded by path)."""
    loaded = sys.modules.get(module)
    return loaded is not None and getattr(loaded, "__file__", None) is not None and importable(module)


class IsolatedFunction(Generic[R]):
    """A function wrapped to run in a fresh Python interpreter per call (see :func:`isolated`)."""

    def __init__(self, fn: Callable[..., R], options: _Options) -> None:
        if not callable(fn):
            raise UsageError(f"isolated() wraps a callable, not {fn!r}")
        self.__wrapped__ = fn
        if options.standby or options.zygote:
            # A standby interpreter (or a zygote) imports the function's own module while it
            # waits (and with it what the module imports), or for a function that travels by value
            # (of __main__, a lambda) the packages its code names that this process has imported
            # (numpy, torch, ...): the call then pays neither. (By module, not by function: the
            # functions of one module share a pool.)
            module = _importable_module_of(fn)
            wanted = (module,) if module else _packages_named_by(fn)
            extra = tuple(name for name in wanted if name not in options.preload)
            if extra:
                options = options.changed({"preload": options.preload + extra})
        self._options = options
        functools.update_wrapper(self, fn)

    def _start(self, args: tuple, kwargs: dict, executor: Optional[_core.Admission] = None,
               caller_waits: bool = False, token: int = 0) -> _core.Job:
        """Queues the call for admission (at ``executor``, then the process's) and returns its
        job; it has started where it fit at once. ``caller_waits``: this thread waits for it
        next (``job.wait(None)``), and watches it there; else the process's watcher watches it
        and hands ``token`` to the completer thread once it has ended."""
        if _exiting.is_set():
            raise Cancelled("the interpreter is exiting: no call is started", None)
        o = self._options
        if o.mem_limit and not o.on_gpu and executor is None:
            raise UsageError("mem_limit caps GPU memory, and this call has no GPU (give gpu=, gpus= or gpu_count=); "
                             "to cap the host memory of a CPU call use host_mem_limit")
        try:
            request = encode_call(self.__wrapped__, args, kwargs)
        except UsageError:
            raise  # it names the argument that cannot travel
        except Exception as exc:
            raise UsageError(f"the call cannot be pickled: {type(exc).__name__}: {exc}") from exc
        o = self._options
        output = _output.for_call(o.capture_output, o.echo_stderr, o.early_result)
        try:
            job = _core.start(request, o.launch(output), executor, caller_waits, token)
        except BaseException:
            if output is not None:
                output.close()
            raise
        if output is not None:
            with _live_lock:
                _outputs[job] = output
        _track(job)
        return job

    def try_call(self, *args: Any, **kwargs: Any) -> Result[R]:
        """Runs the function in a fresh interpreter and returns how it ended as a :class:`Result`,
        without raising for failures of the function or its worker (a :class:`UsageError` or
        KeyboardInterrupt still raises)."""
        job = self._start(args, kwargs, caller_waits=True)
        try:
            job.wait(None)
        except BaseException:
            _untrack(job)  # job.wait stopped the worker and waited for it
            raise
        return _finish(job)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Runs the function in a fresh interpreter and returns its value, or raises: the
        function's own exception, or :class:`TaskError`, :class:`WorkerCrashed`,
        :class:`Timeout`, :class:`OutOfMemory`, :class:`InvalidResult`, :class:`Cancelled`,
        :class:`UsageError`. Ctrl-C stops the worker."""
        return self.try_call(*args, **kwargs).value

    def submit(self, *args: Any, **kwargs: Any) -> IsolatedFuture:
        """Queues the call and returns its future at once; the call starts as soon as this
        process's admission has room for it (a GPU's memory for its cap, a CPU slot)."""
        return self._submit(args, kwargs, None)

    def _submit(self, args: tuple, kwargs: dict, executor: Optional[_core.Admission],
                owner: object = None) -> IsolatedFuture:
        _start_completer()
        token = next(_tokens)
        # The completer takes the token only once the future is recorded: the call may end before
        # its start returns here.
        with _futures_lock:
            future = IsolatedFuture(self._start(args, kwargs, executor, token=token), owner)
            _futures[token] = future
        return future

    async def acall(self, *args: Any, **kwargs: Any) -> R:
        """Awaitable call: ``await f.acall(x)`` runs the function in a fresh interpreter, as a call
        would, without blocking the event loop. Cancelling the awaiting task stops the worker (or
        takes the call out of the admission queue)."""
        import asyncio

        return await asyncio.wrap_future(self.submit(*args, **kwargs))

    def warm_up(self) -> None:
        """Launches this function's ``standby`` interpreters now (each imports its ``preload``
        modules and waits for a call) and returns once they are launched: before timing calls,
        or before the first call should find them waiting. Does nothing without ``standby``. With
        ``start="zygote"`` it returns once the zygote has imported the preloads (or failed) and
        forked the ``standby`` workers: until then, calls get exec'd workers rather than wait."""
        o = self._options
        _core.fill_standby(o.launch(), None)

    def options(self, **changes: Unpack[_options.Options]) -> IsolatedFunction[R]:
        """The same function with some options changed."""
        return IsolatedFunction(self.__wrapped__, self._options.changed(changes))

    def __repr__(self) -> str:
        return f"<isolated {getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!r}>"


@overload
def isolated(fn: Callable[..., R], /, **options: Unpack[_options.Options]) -> IsolatedFunction[R]: ...
@overload
def isolated(fn: None = None, /,
             **options: Unpack[_options.Options]) -> Callable[[Callable[..., R]], IsolatedFunction[R]]: ...


def isolated(fn: Optional[Callable[..., R]] = None, /, **options: Any) -> Any:
    """Wraps ``fn`` so that each call runs in a fresh Python process no call ran in before,
    forked from a zygote that never initialized CUDA or exec'd (``start``), supervised by
    isorun's C++ runner in this process. As a decorator, with or without options::

        @isorun.isolated(gpu=0, mem_limit="2G", timeout="10m")
        def train(lr, hidden): ...

        f = isorun.isolated(lambda x: x * 2, cpu=True)

    The function and its arguments travel by value (cloudpickle: lambdas, closures, functions
    of ``__main__``); the result with pickle protocol 5, a large array arriving as a read-only
    view of the shared memory it was written into.

    Options (as the C++ ``isolated_options``):
      gpu, gpus, gpu_count: one GPU by index, these GPUs, or any this many (default: the CPU);
      cpu: say so explicitly; mem_limit: the cap on each device, bytes or "2G";
      timeout, grace: seconds or "30s" (grace: SIGTERM to SIGKILL when stopping, default 5 s);
      env: extra environment (a dict or "KEY=VALUE" strings); standby: interpreters kept
      launched and waiting; preload: modules those interpreters import while they wait;
      warm_context: with one GPU, waiting interpreters also create the CUDA context;
      early_result: hand any result over, sealed, before the worker has exited (a small result
        of a CPU call whose output goes to fds 1 and 2 comes back so without it);
      alloc_conf: the allocator's configuration; python: the interpreter (default
      ``sys.executable``); echo_stderr: copy the worker's stderr to ours, live;
      host_mem_limit: a hard cap on the worker's host memory, its children's included (the
      worker's cgroup; refused where no cgroup can enforce it); cpus_per_call: the cores a call
      may use (its OMP/BLAS thread limits, and the CPU slots it takes; default its share);
      capture_output: keep the worker's stdout and stderr in the outcome (``outcome.stdout``,
      ``outcome.stderr``) instead of writing them out; start: how workers are made, each
      running one call: "auto" (the default) forks them from a zygote interpreter that the end
      of the first call starts, which imports the function's module and the packages its code
      names, never initializes CUDA, and is stopped after ``ISORUN_IDLE`` seconds (10) with no
      call running; "zygote" keeps it; "exec" execs each (docs/python.md says what siblings share).

    What the worker prints goes to this process's stdout and stderr; where ``sys.stdout`` or
    ``sys.stderr`` is not fd 1 or 2 (Jupyter, ``contextlib.redirect_stdout``), into those
    objects, line by line as it comes.

    Every call waits for this process's admission: no more caps on a GPU than its memory, no
    more CPU calls at once than cores (see :class:`Executor` for limits of your own).

    Raises :class:`UsageError` for options that cannot work (nothing is started).
    """
    opts = _Options.resolve(**options)
    if fn is None:
        return lambda f: IsolatedFunction(f, opts)
    return IsolatedFunction(fn, opts)


# What help() and IDEs show: the options as keywords, from their one declaration.
isolated.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("fn", inspect.Parameter.POSITIONAL_ONLY, default=None, annotation="Optional[Callable[..., R]]"),
     *_options.keywords()])
IsolatedFunction.options.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *_options.keywords()],
    return_annotation="IsolatedFunction[R]")


def map(fn: Union[Callable[..., R], IsolatedFunction[R]], inputs: Iterable[Any], **options: Any) -> list[Result[R]]:
    """See :func:`isorun._executor.map` (``isorun.map``)."""
    from ._executor import map as run

    return run(fn, inputs, **options)


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """One pool of workers kept waiting in this process (:func:`pool_stats`)."""

    start: str
    """How its workers are made: "zygote" (forked from its zygote) or "exec"."""
    adaptive: bool
    """Made by ``start="auto"``: started by the end of a first call, stopped after idle seconds."""
    dormant: bool
    """Adaptive and holding nothing now (no call came for ``ISORUN_IDLE`` seconds)."""
    pids: tuple[int, ...]
    """Its interpreters alive now: the zygote first (if it has one), then the waiting workers."""
    rss_bytes: int
    """Their resident memory, summed (a forked worker's pages shared with its zygote count in
    each, so this is an upper bound)."""
    hits: int
    """Calls that found a worker waiting."""
    misses: int
    """Calls that had a worker launched for them (the first, and those past what was waiting)."""
    preload: tuple[str, ...]
    """The modules its interpreters import while they wait."""


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")
    except (OSError, IndexError, ValueError):
        return 0  # gone meanwhile


def pool_stats() -> list[PoolStats]:
    """The pools of waiting workers this process keeps now (``start="auto"``'s adaptive ones,
    ``start="zygote"``'s, ``standby=N``'s): what they hold, the memory it takes and the calls
    they served."""
    out = []
    for raw in _core.pool_stats():
        pids = ((raw["zygote_pid"],) if raw["zygote_pid"] > 0 else ()) + tuple(raw["waiting"])
        preload = next((e.partition("=")[2] for e in raw["env"] if e.startswith("ISORUN_PY_PRELOAD=")), "")
        out.append(PoolStats(start="zygote" if raw["zygote"] else "exec", adaptive=raw["adaptive"],
                             dormant=raw["dormant"], pids=pids, rss_bytes=sum(_rss(p) for p in pids),
                             hits=raw["hits"], misses=raw["misses"], preload=tuple(filter(None, preload.split(",")))))
    return out


def stop_standby() -> None:
    """Stops every standby interpreter (and every zygote, ``start="zygote"``) and waits until
    they are gone; the next call that asks for them launches them afresh."""
    _core.stop_standby()
