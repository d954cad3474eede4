"""Executors: :class:`Executor` and :func:`map`, on the same admission as every other call."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Callable, Optional, TypeVar, Union, cast

from . import _core, _progress
from ._api import IsolatedFunction, IsolatedFuture, _in_flight, _Options
from ._options import Size
from ._options import check_names as check_option_names
from ._options import size as _size
from ._outcome import Result
from .errors import UsageError

__all__ = ["Executor", "imap", "map"]

R = TypeVar("R")


def _gpu_list(gpus: Union[str, Sequence[int], None]) -> tuple[list[int], bool]:
    """(indices, all) from ``gpus``: ``"all"``, a list or tuple of indices, or None."""
    if gpus is None:
        return [], False
    if isinstance(gpus, str):
        if gpus != "all":
            raise UsageError(f"gpus takes 'all' or a list of GPU indices, not {gpus!r}")
        return [], True
    if not isinstance(gpus, (list, tuple)) or any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
        raise UsageError(f"gpus takes 'all' or a list of GPU indices, not {gpus!r}")
    return list(gpus), False


def _count(value: Optional[int], what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{what} takes a number of calls (1 or more), not {value!r}; leave it out for the default")
    return value


class Executor(concurrent.futures.Executor):
    """Runs calls in fresh, isolated interpreters as its slots allow, like
    ``concurrent.futures.ProcessPoolExecutor`` with a new process for every call::

        with isorun.Executor(gpus="all", mem_limit="6G", timeout="10m") as ex:
            futures = [ex.submit(train, lr) for lr in lrs]          # each an IsolatedFuture
            for fut in concurrent.futures.as_completed(futures): ...
            accuracies = list(ex.map(evaluate, checkpoints))        # lazily, in order

    Slots: per GPU (``gpus="all"`` or indices), as many calls as caps of ``mem_limit`` fit in its
    free memory (at most ``per_gpu``, and at most its share of the cores); without GPUs,
    ``cpu_slots`` CPU calls at once (default one per core). A call waits, first come, first
    served, until a slot is free, and then also for this process's admission, which every
    isolated call goes through: two executors (or an executor and plain calls) never put more
    caps on a GPU than it holds. Each worker's OpenMP/BLAS threads are limited to its share of
    the cores (``cpus_per_call``), unless you set those variables yourself.

    The other keyword options are :func:`isorun.isolated`'s (``timeout``, ``standby``,
    ``preload``, ``host_mem_limit``, ``env``, ...), for the plain functions given to it; an
    :func:`isolated` function keeps its own options, but for where it runs.

    Raises :class:`UsageError` for options that cannot work (nothing is started).
    """

    def __init__(self, max_workers: Union[int, str, Sequence[int], None] = None, *,
                 gpus: Union[str, Sequence[int], None] = None, mem_limit: Optional[Size] = None,
                 per_gpu: Optional[int] = None, cpu_slots: Optional[int] = None, **options: Any) -> None:
        # Executor(4) and Executor(max_workers=4) as concurrent.futures has them; Executor("all")
        # and Executor([0, 1]) name the GPUs, as before.
        if isinstance(max_workers, (str, list, tuple)) and gpus is None:
            gpus, max_workers = max_workers, None
        cpu_slots = _max_workers(max_workers, cpu_slots, gpus)
        check_option_names(options, "Executor", _EXECUTOR_OPTIONS)
        placed = sorted(options.keys() & {"gpu", "gpu_count", "cpu"})
        if placed:
            raise UsageError(f"an Executor places its calls itself: {', '.join(placed)} cannot be given to it; "
                             "use gpus=[...] or gpus='all' (with mem_limit or per_gpu), or cpu_slots")
        gpu_list, all_gpus = _gpu_list(gpus)
        self._mem_limit = _size(mem_limit, "mem_limit")
        try:
            self._admission = _core.executor_admission(gpu_list, all_gpus, self._mem_limit,
                                                       _count(per_gpu, "per_gpu"), _count(cpu_slots, "cpu_slots"))
        except UsageError as exc:
            if "--mem-limit" not in str(exc):
                raise
            # (the runner's words are the command line's)
            raise UsageError("calls packed on GPUs need a cap per call or a number per GPU: give mem_limit "
                             "(e.g. mem_limit='6G') or per_gpu (per_gpu=1: each call has its GPU to itself)") from None
        self._on_gpu = bool(gpu_list) or all_gpus
        if self._mem_limit and not self._on_gpu:
            raise UsageError("mem_limit caps GPU memory, and this executor has no GPUs (give gpus=); to cap the "
                             "host memory of CPU calls use host_mem_limit")
        self._options = _Options.resolve(mem_limit=self._mem_limit or None, **options)
        self._lock = threading.Lock()
        self._shutdown = False
        self._last_call: Optional[tuple[Callable[..., Any], IsolatedFunction[Any]]] = None

    @property
    def plan(self) -> str:
        """How the slots were decided, e.g. ``"2 CPU slots (one per core)"``."""
        return self._admission.plan

    @property
    def waiting(self) -> int:
        """Calls waiting for a slot now."""
        return self._admission.waiting

    @property
    def running(self) -> int:
        """Calls running now (from their admission until their worker is gone)."""
        return self._admission.running

    def _call_of(self, fn: Callable[..., Any]) -> IsolatedFunction[Any]:
        """``fn`` with this executor's options; an isolated function keeps its own but for where it
        runs, which must not conflict with the executor's."""
        last = self._last_call  # (read once: another thread may replace it)
        if last is not None and last[0] is fn:
            return last[1]  # the same function again: its preloads are worked out once, not per submit
        call = self._make_call(fn)
        self._last_call = (fn, call)
        return call

    def _make_call(self, fn: Callable[..., Any]) -> IsolatedFunction[Any]:
        if not isinstance(fn, IsolatedFunction):
            call = IsolatedFunction(fn, self._options)
        else:
            call = fn
            if call._options.on_gpu:
                raise UsageError(f"{fn!r} names its own GPUs (gpu, gpus or gpu_count), and the executor places its "
                                 "calls itself: drop them from isolated(), or call the function directly")
            own = call._options.mem_limit
            if own and self._mem_limit and own != self._mem_limit:
                raise UsageError(f"{fn!r} has mem_limit={own}, and the executor packs calls of mem_limit="
                                 f"{self._mem_limit}: give one of them")
            if own and not self._on_gpu:
                raise UsageError(f"{fn!r} has a mem_limit, which caps GPU memory, and this executor has no GPUs")
            if self._mem_limit and not own:
                call = call.options(mem_limit=self._mem_limit)
        return call

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> IsolatedFuture:  # type: ignore[override]
        """Queues ``fn(*args, **kwargs)`` and returns its future at once (an
        :class:`IsolatedFuture`: ``cancel()`` also stops a running call)."""
        call = self._call_of(fn)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            return call._submit(args, kwargs, self._admission, owner=self)

    def _in_flight(self) -> list[IsolatedFuture]:
        """Its calls' futures not complete yet (kept by the process's completer, not per future
        here: a queued call's future stays small)."""
        return _in_flight(self)

    def map(self, fn: Callable[..., R], *iterables: Iterable[Any], timeout: Optional[float] = None,
            chunksize: int = 1, progress: bool = False, ordered: bool = True) -> Iterator[R]:
        """Like ``concurrent.futures.Executor.map``: ``fn`` over the items of ``iterables``, one
        call each, the results yielded in input order, the first failure raised where its result
        would be; ``timeout`` counts from this call. The items are taken lazily (a generator of a
        million is fine): a window of a few calls per slot is submitted now, and each result
        taken lets the next item in. Leaving the iterator early cancels the calls in flight.

        ``ordered=False`` (isorun's own) yields the results as their calls end instead.
        ``progress=True`` shows the calls ended (of all, where ``iterables`` have a length), the
        failures and the rate on stderr as they end: a tqdm bar where tqdm is installed, else a
        line of isorun's own."""
        _progress.check(progress)
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        bar = _progress.Progress(_length(iterables), "calls") if progress else None
        stream = _Stream(lambda args: self.submit(fn, *args), zip(*iterables), self._window(), ordered, timeout, bar)
        return (f.result() for _, f in _drain(stream, wait=False))

    def _window(self) -> int:
        """Calls kept submitted by a streaming map: enough to keep every slot busy as results are
        taken, few enough that a million inputs cost no memory."""
        return max(8, 4 * self._admission.slots)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls are taken; ``cancel_futures`` cancels the calls still waiting for a slot
        (running ones go on); ``wait`` waits for every call to end."""
        with self._lock:
            self._shutdown = True
        futures = self._in_flight()
        if cancel_futures:
            # Each waiting future is marked cancelled first (so that no end the runner reports
            # meanwhile completes it otherwise), then the runner cancels every waiting call in one
            # pass, instead of a call into it per future; one that started in between is stopped.
            marked = [f for f in futures if not f._job.started and f._cancel_queued()]
            self._admission.cancel_waiting()
            for f in marked:
                if f._job.started:
                    f._job.cancel()
        if wait:
            concurrent.futures.wait(futures)

    def __repr__(self) -> str:
        return f"<isorun.Executor {self.plan}: {self.running} running, {self.waiting} waiting>"


def _length(iterables: Sequence[Iterable[Any]]) -> Optional[int]:
    """How many calls a map over ``iterables`` makes, where each has a length; else None."""
    try:
        return min(len(i) for i in iterables)  # type: ignore[arg-type]
    except TypeError:
        return None


class _Stream:
    """The calls of a streaming map: each item of ``items`` submitted (``submit(item)`` returns
    its future), at most ``window`` in flight, the first window at once; taken (``take()``) in
    input order or, not ``ordered``, as they end, each taken one letting the next item in."""

    def __init__(self, submit: Callable[[Any], IsolatedFuture], items: Iterable[Any], window: int, ordered: bool,
                 timeout: Optional[float], bar: Optional[_progress.Progress]) -> None:
        self._submit, self._items, self._window, self._ordered, self._bar = submit, iter(items), window, ordered, bar
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._in_flight: dict[IsolatedFuture, int] = {}  # (insertion order: input order)
        self._ended: queue.SimpleQueue[concurrent.futures.Future[Any]] = queue.SimpleQueue()
        self._next = 0
        try:
            self._fill()
        except BaseException:
            self.close(wait=True)  # a failed submission leaves nothing queued
            raise

    def _fill(self) -> None:
        while len(self._in_flight) < self._window:
            try:
                item = next(self._items)
            except StopIteration:
                return
            future = self._submit(item)
            self._in_flight[future] = self._next
            self._next += 1
            if not self._ordered:  # (in order, the head is waited for: a queue of all would hold every future)
                future.add_done_callback(self._ended.put)

    def take(self) -> Optional[tuple[int, IsolatedFuture]]:
        """The next finished call (index, future), None once all are taken. Raises
        ``TimeoutError`` past the map's timeout."""
        if not self._in_flight:
            return None
        left = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
        if self._ordered:
            future = next(iter(self._in_flight))
            if not concurrent.futures.wait([future], left).done:
                raise TimeoutError()
        else:
            try:
                future = cast(IsolatedFuture, self._ended.get(timeout=left))
            except queue.Empty:
                raise TimeoutError() from None
        index = self._in_flight.pop(future)
        if self._bar is not None:
            self._bar.advance(future.cancelled() or future.exception() is not None)
        self._fill()
        return index, future

    def close(self, wait: bool) -> None:
        """Cancels the calls in flight (a running one's worker is stopped); ``wait``: until they
        have ended, so that nothing of them is left."""
        futures = list(self._in_flight)
        self._in_flight.clear()
        for f in futures:
            f.cancel()
        if wait:
            concurrent.futures.wait(futures)
        if self._bar is not None:
            self._bar.close()


def _drain(stream: _Stream, wait: bool) -> Iterator[tuple[int, IsolatedFuture]]:
    """What ``stream`` takes, until all are taken; left early (an error, a closed iterator,
    Ctrl-C), the calls in flight are cancelled (and waited for, with ``wait``)."""
    try:
        while (taken := stream.take()) is not None:
            yield taken
    finally:
        stream.close(wait)


def _args_of(item: Any) -> tuple[tuple, dict]:
    """A dict input is passed as keyword arguments, a tuple as positional ones, anything else as
    the one argument."""
    if isinstance(item, Mapping):
        return (), dict(item)
    if isinstance(item, tuple):
        return item, {}
    return (item,), {}


_EXECUTOR_OPTIONS = ("max_workers", "gpus", "mem_limit", "per_gpu", "cpu_slots")


def _max_workers(max_workers: Any, cpu_slots: Optional[int], gpus: Any) -> Optional[int]:
    """``cpu_slots`` where ``max_workers`` (concurrent.futures' name for it) is given instead."""
    if max_workers is None:
        return cpu_slots
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise UsageError(f"max_workers takes a number of calls at once (1 or more), not {max_workers!r}")
    if cpu_slots is not None:
        raise UsageError("max_workers and cpu_slots are the same (the CPU calls at once): give one of them")
    if gpus is not None:
        raise UsageError("max_workers is the number of CPU calls at once (cpu_slots); with gpus, the calls on "
                         "each GPU are set by mem_limit or per_gpu")
    return max_workers


def _imap(fn: Union[Callable[..., R], IsolatedFunction[R]], inputs: Iterable[Any], *,
          gpus: Union[str, Sequence[int], None], mem_limit: Optional[Size], per_gpu: Optional[int],
          cpu_slots: Optional[int], on_result: Optional[Callable[[int, Result[R]], None]], progress: bool,
          ordered: bool, **options: Any) -> Iterator[tuple[int, Result[R]]]:
    """:func:`imap` as (index, result) pairs: what :func:`map` needs when it takes them as they end."""
    _progress.check(progress)
    check_option_names(options, "map", (*_EXECUTOR_OPTIONS, "on_result", "progress"))
    cpu_slots = _max_workers(options.pop("max_workers", None), cpu_slots, gpus)
    if on_result is not None and not callable(on_result):
        raise UsageError(f"on_result takes a function of (index, result), not {on_result!r}")
    placed = sorted(options.keys() & {"gpu", "gpu_count", "cpu"})
    if placed:
        raise UsageError(f"map places each call on its slots: {', '.join(placed)} cannot be given to it; "
                         "use gpus=[...] or gpus='all' (with mem_limit or per_gpu), or cpu_slots")
    base = fn if isinstance(fn, IsolatedFunction) else IsolatedFunction(fn, _Options.resolve(**options))
    if isinstance(fn, IsolatedFunction) and options:
        base = base.options(**options)
    own = base._options
    if own.gpu_count:
        raise UsageError(f"{fn!r} asks for any {own.gpu_count} GPUs (gpu_count); map runs each call on one GPU: "
                         "give gpus=[...] or gpus='all' to map")
    own_all = own.gpu is None and isinstance(own.gpus, str)  # gpus="all", the only string it takes
    own_gpus = [own.gpu] if own.gpu is not None else [] if isinstance(own.gpus, str) else list(own.gpus)
    if own_all:
        if gpus is None:
            gpus = "all"
        elif gpus != "all":
            raise UsageError(f"{fn!r} runs on every GPU (gpus='all'), and map was given gpus={gpus!r}: "
                             "give one of them")
    elif gpus is None:
        gpus = own_gpus or None
    elif own_gpus and (gpus == "all" or sorted(_gpu_list(gpus)[0]) != sorted(own_gpus)):
        raise UsageError(f"{fn!r} runs on GPU(s) {own_gpus}, and map was given gpus={gpus!r}: give one of them")
    cap = _size(mem_limit, "mem_limit")
    if cap and own.mem_limit and cap != own.mem_limit:
        raise UsageError(f"{fn!r} has mem_limit={own.mem_limit}, and map was given mem_limit={cap}: give one of them")
    cap = cap or own.mem_limit
    if own_gpus or own_all or own.mem_limit:
        base = base.options(gpu=None, gpus=None, gpu_count=0, mem_limit=None)
    executor = Executor(gpus, mem_limit=cap or None, per_gpu=per_gpu, cpu_slots=cpu_slots)

    def submit(item: Any) -> IsolatedFuture:
        args, kwargs = _args_of(item)
        return executor.submit(base, *args, **kwargs)

    try:
        bar = _progress.Progress(_length([inputs]), "calls") if progress else None
        stream = _Stream(submit, inputs, executor._window(), ordered, None, bar)
    except BaseException:
        executor.shutdown(wait=False)
        raise
    return _results(stream, executor, on_result)


def imap(fn: Union[Callable[..., R], IsolatedFunction[R]], inputs: Iterable[Any], *,
         gpus: Union[str, Sequence[int], None] = None, mem_limit: Optional[Size] = None, per_gpu: Optional[int] = None,
         cpu_slots: Optional[int] = None, on_result: Optional[Callable[[int, Result[R]], None]] = None,
         progress: bool = False, ordered: bool = True, **options: Any) -> Iterator[Result[R]]:
    """Runs ``fn`` on every input, each call in a fresh interpreter, in parallel on the slots of an
    :class:`Executor`, and yields a :class:`Result` per input, in input order (failures are
    results too). A dict input is passed as keyword arguments, a tuple as positional ones,
    anything else as the one argument. ``on_result(index, result)`` is called as each ends;
    ``progress=True`` shows the calls ended of all, the failures and the rate on stderr (a tqdm bar
    where tqdm is installed, else a line of isorun's own).

    Where calls run: ``gpus``, ``mem_limit``, ``per_gpu``, ``cpu_slots`` as for
    :class:`Executor`; an :func:`isolated` function's own ``gpu``/``gpus`` and ``mem_limit``
    are kept where this call gives none, and a :class:`UsageError` says where they conflict. Other
    keyword options are those of :func:`isolated`.

    The inputs are taken lazily (a generator of a million is fine), a few calls per slot kept
    submitted; ``ordered=False`` yields each result as its call ends. Options are checked, and the
    first calls submitted, before this returns; leaving the iterator early stops the calls in
    flight and waits for them.
    """
    calls = _imap(fn, inputs, gpus=gpus, mem_limit=mem_limit, per_gpu=per_gpu, cpu_slots=cpu_slots,
                  on_result=on_result, progress=progress, ordered=ordered, **options)
    return (result for _, result in calls)


def _results(stream: _Stream, executor: Executor,
             on_result: Optional[Callable[[int, Result[R]], None]]) -> Iterator[tuple[int, Result[R]]]:
    """(index, result) as ``stream`` takes them, each told to ``on_result`` first."""
    try:
        # Ctrl-C (or a callback that raised): the calls left stop, and are waited for.
        for index, future in _drain(stream, wait=True):
            result = cast(Result[R], future._call_result)
            if on_result is not None:
                on_result(index, result)
            yield index, result
    finally:
        executor.shutdown(wait=False)


def map(fn: Union[Callable[..., R], IsolatedFunction[R]], inputs: Iterable[Any], *,
        gpus: Union[str, Sequence[int], None] = None, mem_limit: Optional[Size] = None, per_gpu: Optional[int] = None,
        cpu_slots: Optional[int] = None, on_result: Optional[Callable[[int, Result[R]], None]] = None,
        progress: bool = False, **options: Any) -> list[Result[R]]:
    """Runs ``fn`` on every input, each call in a fresh interpreter, in parallel on the slots of an
    :class:`Executor`, and returns a :class:`Result` per input, in input order (failures are
    results too): ``list(imap(...))``. A dict input is passed as keyword arguments, a tuple as
    positional ones, anything else as the one argument. ``on_result(index, result)`` is called as
    each ends; ``progress=True`` shows the calls ended of all, the failures and the rate on stderr
    (a tqdm bar where tqdm is installed, else a line of isorun's own).

    Where calls run: ``gpus``, ``mem_limit``, ``per_gpu``, ``cpu_slots`` as for
    :class:`Executor`; an :func:`isolated` function's own ``gpu``/``gpus`` and ``mem_limit``
    are kept where this call gives none, and a :class:`UsageError` says where they conflict. Other
    keyword options are those of :func:`isolated`. For more inputs than results you want to hold
    at once, use :func:`imap`.
    """
    results: list[Optional[Result[R]]] = []
    for index, result in _imap(fn, inputs, gpus=gpus, mem_limit=mem_limit, per_gpu=per_gpu, cpu_slots=cpu_slots,
                               on_result=on_result, progress=progress, ordered=False, **options):
        results.extend([None] * (index + 1 - len(results)))
        results[index] = result
    return cast(list[Result[R]], results)
