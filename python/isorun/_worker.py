"""The worker: ``python -m isorun._worker``, launched by isorun (never by hand) as a fresh
interpreter for exactly one call.

It imports what ``ISORUN_PY_PRELOAD`` names, from the caller's ``sys.path``
(``ISORUN_PY_PATH``): a standby interpreter does so while it waits for its call. Then it serves
isorun's worker protocol through the C++ worker: the assignment, the handshake, the call through
:func:`isorun._payload.run_call` (or, for a sweep's trial, :func:`isorun._trial.run_trial`), the
result written into the result segment, the report. It exits when the call is done, and dies with
its supervisor.

With ``ISORUN_PY_ZYGOTE=1`` it is a zygote instead (``start="zygote"``): it imports the preloads
and then forks a worker for each request of the supervisor (``_core.zygote_serve``); each child
restores the environment an exec'd worker would have and serves its one call.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import sys

# At import, not inside the functions a call runs: the call's path runs cold after the
# interpreter's idle wait, where an import statement's trip through importlib costs tens of µs.
from . import _core
from ._payload import run_call

PRELOAD_ENV = "ISORUN_PY_PRELOAD"
PATH_ENV = "ISORUN_PY_PATH"

#: The modules in sys.modules when the worker began to wait for its call, after its preloads:
#: those its call found imported (for tests and diagnostics). Taken before the wait, not on the
#: call's path, where a set of every module's name costs tens of µs cold.
modules_at_entry: frozenset[str] = frozenset()

#: A sweep trial's worker: what its preloads printed, held until the trial's log is its output.
_preload_output: tuple[str, str] = ("", "")


def _preload() -> None:
    names = os.environ.pop(PRELOAD_ENV, "")
    path = os.environ.pop(PATH_ENV, "")
    if path:
        sys.path[:] = path.split(os.pathsep)
    preloaded = list(filter(None, names.split(",")))
    from ._trial import TRIAL_ENV, is_file, load_file

    # A sweep's trial writes to its own log, which its worker gets with the assignment: what the
    # preloads (the trial function's own module among them) print at import goes there then,
    # as it did when the trial imported them itself, not to the sweep's terminal.
    held_out, held_err = io.StringIO(), io.StringIO()
    hold = os.environ.get(TRIAL_ENV) == "1"
    with contextlib.ExitStack() as holding:
        if hold:
            holding.enter_context(contextlib.redirect_stdout(held_out))
            holding.enter_context(contextlib.redirect_stderr(held_err))
        for name in preloaded:
            try:
                if is_file(name):  # a sweep's trial function's file
                    load_file(name)
                else:
                    importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - the call reports what it meets when it imports
                print(f"isorun worker: preloading {name!r} failed: {exc}", file=sys.stderr)
    global _preload_output
    _preload_output = (held_out.getvalue(), held_err.getvalue())
    _warm_up(preloaded)


# How a preloaded framework creates its CUDA context (and its allocator's first block), for a
# warm standby interpreter: the first preloaded one of these does it.
_WARM_UP = {
    "torch": lambda torch: torch.zeros(1, device="cuda"),
    "cupy": lambda cupy: cupy.zeros(1),
    "jax": lambda jax: jax.numpy.zeros(1).block_until_ready(),
}


def _warm_up(names: list[str]) -> None:
    """A warm worker (``ISORUN_WARM``, set at launch with its GPU visible) on a real GPU prepares
    it through the first preloaded framework that has a context; the C++ worker then finds the
    context there (else it creates it through the driver itself)."""
    warm = os.environ.get("ISORUN_WARM", "").split(";")
    if len(warm) < 2 or warm[1] != "cuda":  # not warm, or a simulated device: nothing to prepare
        return
    for name in names:
        root = name.split(".")[0]
        if root in _WARM_UP and root in sys.modules:
            try:
                _WARM_UP[root](sys.modules[root])
            except Exception as exc:  # noqa: BLE001 - the call will meet the same, and say so
                print(f"isorun worker: preparing the GPU through {root} failed: {exc}", file=sys.stderr)
            return


def _sync_environ() -> None:
    """os.environ as the process has it now: the C++ worker set the assignment's variables
    (CUDA_VISIBLE_DEVICES, ISORUN_GPU, ISORUN_MEM_LIMIT...) and removed its own with setenv and
    unsetenv, after Python's snapshot."""
    _core.sync_environ()


def _flush() -> None:
    """The C++ worker ends the process with _exit: what the function printed must be out of
    Python's buffers before then."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream
            pass


def _line_buffered_stdout() -> None:
    """A stdout that is a pipe (the caller forwards or captures it, isorun._output) is written
    line by line, as to a terminal: Python chose block buffering at startup, for what fd 1 was
    then, and the caller would see nothing before the function's end. (Asked of fd 1 in C: an
    os.fstat costs tens of µs on the call's cold path.) Not write-through, even under
    PYTHONUNBUFFERED: calls forwarding into one stream share a pipe, and a line written in one
    piece (up to PIPE_BUF) is not cut into by another call's."""
    if not _core.stdout_is_pipe():
        return
    try:
        out = sys.stdout
        if not out.line_buffering or out.write_through:  # type: ignore[union-attr]
            out.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):  # a closed pipe, or a stdout replaced by the preloads
        pass


def _entry(request: bytes) -> tuple:
    _sync_environ()
    _line_buffered_stdout()
    try:
        # NumPy's large arrays made where the result goes: a returned one is not copied.
        return run_call(request, before_call=_core.place_numpy_arrays)
    finally:
        _flush()


def _sweep_entry(request: str) -> tuple[bool, str, str]:
    """A sweep's trial (``python: module:function`` in a spec): ``request`` is JSON naming the
    function, the folder modules are found from, the keyword arguments and the call's variables.
    Returns ``(True, "", '{"result": {...}}')`` with what the function returned, or
    ``(False, type name, message)`` for what it raised (its traceback goes to stderr, the trial's
    log)."""
    _sync_environ()
    out, err = _preload_output
    if out:
        sys.stdout.write(out)
    if err:
        sys.stderr.write(err)
    try:
        from ._trial import run_trial

        return True, "", run_trial(request)
    except BaseException as exc:  # noqa: BLE001 - the trial ends as the function's failure
        import traceback

        traceback.print_exc()
        return False, type(exc).__qualname__, str(exc)
    finally:
        _flush()


# A zygote's preloads run with one thread each: a thread pool started at import (OpenBLAS starts
# one when it loads) would be missing from every forked child, with whatever locks it held, and the
# zygote refuses to fork while it has more than one thread.
_THREAD_LIMITS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                  "NUMEXPR_NUM_THREADS")
ZYGOTE_ENV = "ISORUN_PY_ZYGOTE"
CHILD_PRELOAD_ENV = "ISORUN_ZYGOTE_LD_PRELOAD"
CAP_ZYGOTE_ENV = "ISORUN_CAP_ZYGOTE"


def _zygote_prepare() -> dict[str, object]:
    """In the zygote, before the preloads: the variables its children get back, and one thread
    for what the preloads load."""
    children: dict[str, object] = {name: os.environ.get(name) for name in _THREAD_LIMITS}
    for name in _THREAD_LIMITS:
        os.environ[name] = "1"
    preload = os.environ.pop(CHILD_PRELOAD_ENV, None)
    if preload is not None:  # the cap library was added for the zygote alone
        children["LD_PRELOAD"] = None if preload == "-" else preload
    return children


def _zygote_child(children: dict[str, object]) -> None:
    """In a child forked from the zygote, before it waits for its assignment: its environment as
    an exec'd worker's would be, CUDA allowed (under the deferred cap of a capped call), and the
    random state that a fork would otherwise share with its siblings drawn afresh."""
    for name, value in children.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    os.environ.pop(CAP_ZYGOTE_ENV, None)
    deferred = os.environ.get("ISORUN_CAP_DEFERRED", "")
    _core.cap_thaw(bool(deferred) and deferred != "0")
    # Python's own `random` reseeds itself after a fork (os.register_at_fork); NumPy's global
    # legacy generator, seeded from the OS when NumPy was imported, does not.
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except Exception:  # noqa: BLE001 - a stand-in module without seed()
            pass


def _rehearse() -> None:
    """The call's path run once on a call of nothing: in the zygote, so that what a first call
    makes once (pickle's and cloudpickle's caches) is made before the forks share it; in each
    forked worker before it waits, so that the pages the path writes (reference counts, the
    allocator's pools), shared with the zygote until written, are copied then rather than on the
    call's path. ``ISORUN_REHEARSE=0`` skips it, to compare."""
    if os.environ.get("ISORUN_REHEARSE") == "0":
        return
    from ._payload import encode_call

    run_call(encode_call(int, (), {}))


def main() -> None:
    import faulthandler

    # A fatal signal (a segfault in an extension) writes the Python stack to stderr: it lands in
    # the outcome's stderr tail and WorkerCrashed's message, where the caller looks.
    faulthandler.enable()
    zygote = os.environ.pop(ZYGOTE_ENV, "") == "1"
    children = _zygote_prepare() if zygote else {}
    _preload()
    global modules_at_entry
    if zygote:
        # A zygote: forks a worker per request and never returns but in each child, which then
        # serves its one call as an exec'd worker would. What the preloads printed leaves the
        # buffers first: else every child would write it again.
        _flush()
        _rehearse()
        # Taken here, once, rather than in each child: a set of every module's name writes each
        # name's reference count, and each child would copy those pages from the zygote.
        modules_at_entry = frozenset(sys.modules)
        # Every object the zygote holds is left out of the children's garbage collections: a
        # full collection in a child writes each object's header, and would copy every page
        # that holds one (with NumPy loaded, milliseconds on the call's path).
        gc.freeze()
        _core.zygote_serve()
        _zygote_child(children)
        _rehearse()
    else:
        modules_at_entry = frozenset(sys.modules)
    _core.serve(_entry, _sweep_entry)


if __name__ == "__main__":
    # Run as isorun._worker, not as __main__, so that what it records is found under its name.
    from isorun._worker import main as _main

    _main()
