"""A joblib parallel backend: each batch of a ``joblib.Parallel`` call (scikit-learn's
``n_jobs=``: ``GridSearchCV``, ``cross_validate``, forests) runs in a fresh, isolated interpreter
of an :class:`isorun.Executor`, under its caps and the process's admission. Importing this
module registers it as ``"isorun"``::

    import joblib
    import isorun.joblib

    with joblib.parallel_backend("isorun", n_jobs=2, host_mem_limit="2G", timeout="10m"):
        search = GridSearchCV(SVC(), {"C": [0.1, 1, 10]}, n_jobs=2).fit(X, y)

The keyword options are :class:`isorun.Executor`'s (``gpus``, ``mem_limit``, ``per_gpu``, and
:func:`isorun.isolated`'s: ``timeout``, ``host_mem_limit``, ``standby``, ``preload``, ``env``,
...); ``n_jobs`` is the number of CPU slots (``cpu_slots``), or, on GPUs, how many batches joblib
hands out at once. ``n_jobs=1`` runs in the calling process: joblib does so with every backend.
joblib has no entry points for backends, so the import is what registers it.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, cast

try:
    import joblib
    from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase, SequentialBackend
except ImportError as e:  # joblib is an optional dependency
    raise ImportError("isorun.joblib needs joblib: pip install 'isorun[joblib]' (or pip install joblib)") from e

from . import _core
from ._api import IsolatedFunction, IsolatedFuture, _importable_module_of, preloadable
from ._executor import Executor
from .errors import UsageError

__all__ = ["IsorunBackend", "register"]

#: The backend's name for ``joblib.parallel_backend`` and ``joblib.parallel_config``.
NAME = "isorun"


class IsorunBackend(AutoBatchingMixin, ParallelBackendBase):
    """Runs each batch of a ``joblib.Parallel`` call as a call of an :class:`isorun.Executor`:
    a fresh interpreter per batch (auto-batching, as loky's, amortizes the start of each),
    under the executor's options."""

    supports_retrieve_callback = True
    # Each batch is a process of its own: nothing is shared with the caller's memory.
    supports_sharedmem = False
    uses_threads = False

    def __init__(self, nesting_level: Optional[int] = None, inner_max_num_threads: Optional[int] = None,
                 **options: Any) -> None:
        if inner_max_num_threads is not None:
            raise UsageError("inner_max_num_threads: isorun limits each worker's threads to its share of the cores "
                             "itself; give cpus_per_call=N to give each batch N cores")
        placed = sorted(options.keys() & {"cpu_slots"})
        if placed:
            raise UsageError("cpu_slots: with joblib, n_jobs is the number of CPU slots")
        super().__init__(nesting_level=nesting_level)
        self._options = options
        Executor(**options)  # bad options are a UsageError here, before joblib starts anything
        self._executor: Optional[Executor] = None
        self._warm: set[tuple[str, ...]] = set()  # the preloads of the kinds of batch started this Parallel call

    def effective_n_jobs(self, n_jobs: Optional[int]) -> int:
        """``n_jobs`` as joblib counts it: -1 is one per core, -2 all cores but one, ..."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max((os.cpu_count() or 1) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: Optional[int] = 1, parallel: Any = None, prefer: Optional[str] = None,
                  require: Optional[str] = None, **backend_kwargs: Any) -> int:
        """A new executor for a ``Parallel`` call: ``n_jobs`` CPU slots, or the GPUs' slots.
        ``backend_kwargs`` are ``Parallel``'s memory-mapping options (``max_nbytes``,
        ``mmap_mode``, ``temp_folder``), which loky uses; here a batch's arguments travel with it."""
        n = self.effective_n_jobs(n_jobs)
        options = dict(self._options)
        if "gpus" not in options:
            options["cpu_slots"] = n
        self._executor = Executor(**options)
        self._warm = set()  # (a pool gone dormant since the last Parallel call starts again)
        self.parallel = parallel
        return n

    def submit(self, func: Callable[[], Any], callback: Optional[Callable[[Any], None]] = None) -> IsolatedFuture:
        """Runs ``func`` (a batch of joblib calls) in a fresh interpreter; its future."""
        assert self._executor is not None, "configure() comes first"
        future = self._executor.submit(self._with_preloads(func))
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def _with_preloads(self, batch: Callable[[], Any]) -> Any:
        """The batch as a call whose workers import, while they wait, joblib's own module and
        the modules of its functions (scikit-learn's ``_fit_and_score``) and of its arguments'
        types (the estimator's): a batch then pays none of those imports, which are most of a
        small fit's time. One set of modules per kind of batch, so batches of one search share a pool."""
        assert self._executor is not None
        options = self._executor._options
        if not (options.zygote or options.standby):
            return batch
        modules: list[str] = [type(batch).__module__]  # joblib's own (BatchedCalls), which unpickling imports
        for item in getattr(batch, "items", ()):
            if not isinstance(item, tuple) or len(item) != 3:
                continue
            wrapped, args, kwargs = item
            fn = cast(Callable[..., Any], getattr(wrapped, "function", wrapped))  # scikit-learn's delayed() wraps it
            found = [_importable_module_of(fn)] + [type(a).__module__ for a in (*args, *kwargs.values())]
            modules += [m for m in found if m and m not in modules]
        extra = tuple(m for m in modules if preloadable(m) and m not in options.preload)
        if not extra:
            return batch
        call = IsolatedFunction(batch, options.changed({"preload": options.preload + extra}))
        if call._options.preload not in self._warm:
            # The first batch of its kind: more follow, so its pool starts now and the batch waits
            # for a worker forked from it, rather than each of the first batches start an
            # interpreter that imports the estimator's modules afresh beside the zygote doing so.
            self._warm.add(call._options.preload)
            _core.fill_standby(call._options.launch(), self._executor._admission)
        return call

    def retrieve_result_callback(self, future: IsolatedFuture) -> Any:
        """The batch's results, or what it raised."""
        return future.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """A batch failed: the others stop (running ones too) and are waited for."""
        if self._executor is not None:
            for f in self._executor._in_flight():
                f.cancel()
            self._executor.shutdown(wait=True)
            self._executor = None
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel)

    def terminate(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self.reset_batch_stats()

    def get_nested_backend(self) -> Any:
        # A batch runs in a worker limited to its share of the cores: a joblib call inside it runs
        # sequentially rather than start threads (or processes) past that share.
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None


def register() -> None:
    """Registers the backend as ``"isorun"`` (importing this module does)."""
    joblib.register_parallel_backend(NAME, IsorunBackend)


register()
