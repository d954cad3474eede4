"""What travels: the call (function and arguments, by value with cloudpickle) and the result
(pickle protocol 5, its out-of-band buffers placed in the result segment by the worker).

The result payload's layout is written down in ``python/src/payload.hpp``; the runner has checked
its checksum and bounds before :func:`decode_result` sees it, and the parse here checks every
offset again against the payload's size.
"""

from __future__ import annotations

import atexit
import io
import linecache
import os
import pickle
import reprlib
import struct
import sys
import traceback
import types
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, Callable, NoReturn, Optional

import cloudpickle

from .errors import InvalidResult, LargeCallWarning, UsageError

__all__ = ["encode_call", "run_call", "decode_result", "VALUE", "RAISED", "LARGE_CALL_BYTES"]

VALUE = 0  #: the payload holds the function's return value
RAISED = 1  #: the payload holds the exception it raised, with its traceback

_MAGIC = 0x59505349  # "ISPY"
_HEAD = struct.Struct("<IIQQQQ")  # magic, tag, buffers, table offset, pickle offset, its size
_ENTRY = struct.Struct("<QQ")

#: A pickled call larger than this warns (LargeCallWarning): it is copied to every worker.
LARGE_CALL_BYTES = 64 << 20


def _refused_types() -> dict[type, str]:
    """What cannot travel to another process, though pickle (or cloudpickle, which reads an open
    file into a StringIO) would make something of it: the worker would get a copy that is no
    longer the thing (a file at another position, a lock no one else holds). Built on first use:
    the worker imports this module on every call's path and needs none of it."""
    global _REFUSED
    if _REFUSED is None:
        import socket
        import threading

        _REFUSED = {
            **dict.fromkeys([io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom,
                             io.BufferedRWPair, io.TextIOWrapper], "an open file"),
            socket.socket: "a socket",
            type(threading.Lock()): "a lock",
            type(threading.RLock()): "a lock",
            types.GeneratorType: "a generator",
            types.AsyncGeneratorType: "an async generator",
            types.CoroutineType: "a coroutine",
        }
    return _REFUSED


_REFUSED: Optional[dict[type, str]] = None


class _Refused(Exception):
    def __init__(self, what: str, obj: object) -> None:
        super().__init__(what)
        self.what = what
        self.type_name = type(obj).__qualname__


_importable_modules: dict[tuple[str, int], bool] = {}  # (name, id(module)) -> importable


def importable(name: Optional[str]) -> bool:
    """Whether the worker finds module ``name`` by importing it from the caller's ``sys.path`` (it
    gets that path): not ``__main__``, not a script's ``__mp_main__`` in a multiprocessing spawn
    or forkserver child, not a module loaded from a file path that no finder knows. Asked of the
    finders themselves (``sys.meta_path``), not of ``sys.modules``; remembered per module."""
    if not name or name in ("__main__", "__mp_main__"):
        return False
    module = sys.modules.get(name)
    if module is None:
        return True  # not loaded here: cloudpickle sends nothing of it by reference
    key = (name, id(module))
    known = _importable_modules.get(key)
    if known is None:
        known = _found_by_import(name, module)
        _importable_modules[key] = known
    return known


def _found_by_import(name: str, module: types.ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    if spec is None or spec.name != name:
        return name in sys.builtin_module_names
    top = name.partition(".")[0]
    top_module = sys.modules.get(top)
    top_spec = getattr(top_module, "__spec__", None)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            found = find(top, None)
        except Exception:  # noqa: BLE001 - a finder that fails cannot be what imports it
            continue
        if found is not None:
            # The same file (or no file: a builtin, a namespace package) as the one loaded here.
            return top_spec is None or getattr(found, "origin", None) == getattr(top_spec, "origin", None)
    return False


def _send_by_value_if_not_importable(obj: Any) -> None:
    """A function or class of a module the worker cannot import travels by value, as those of
    ``__main__`` do (cloudpickle's register_pickle_by_value: no process can import it by name)."""
    name = getattr(obj, "__module__", None)
    if isinstance(name, str) and name != "__main__" and not importable(name):
        module = sys.modules.get(name)
        if module is not None and name not in _registered_by_value:
            cloudpickle.register_pickle_by_value(module)
            _registered_by_value.add(name)


_registered_by_value: set[str] = set()


class _CallPickler(cloudpickle.Pickler):
    """cloudpickle, refusing what cannot travel (_REFUSED) wherever it lies in the call."""

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is types.FunctionType or isinstance(obj, type):
            _send_by_value_if_not_importable(obj)
        what = _verdicts.get(kind, _UNSEEN)
        if what is _UNSEEN:  # once per type: this runs for every object of the call
            what = next((text for base, text in _refused_types().items() if issubclass(kind, base)), None)
            _verdicts[kind] = what
        if what is not None:
            raise _Refused(what, obj)
        return super().reducer_override(obj)


_UNSEEN = object()
_verdicts: dict[type, Any] = {}  # type -> what _REFUSED calls it, or None


def _dumps_call(obj: Any) -> bytes:
    out = io.BytesIO()
    _CallPickler(out, protocol=5).dump(obj)
    return out.getvalue()


def _refused_where(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """Which part of the call holds what _CallPickler refused (pickled again, part by part: only
    on this failure's path)."""
    parts = [(f"argument {i}", a) for i, a in enumerate(args, 1)]
    parts += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for where, value in parts:
        try:
            _dumps_call(value)
        except _Refused:
            return where
        except Exception:  # noqa: BLE001 - another failure: not this part's refusal
            pass
    return "the function (what it captures)"


def _by_value(fn: Any) -> bool:
    """Whether cloudpickle sends this function by value (its code, not its module and name)."""
    _send_by_value_if_not_importable(fn)
    check = getattr(getattr(cloudpickle, "cloudpickle", None), "_should_pickle_by_reference", None)
    if check is not None:
        try:
            return not check(fn)
        except Exception:  # noqa: BLE001 - cloudpickle's private helper changed: the fallback below
            pass
    return getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(fn, "__qualname__", "")


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and those nested in it (its functions, comprehensions, classes)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _functions_sent_by_value(fn: Any) -> Iterator[types.FunctionType]:
    """``fn`` and the functions it reaches through its globals and closure, where cloudpickle
    sends them by value (each once)."""
    seen: set[int] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        if not isinstance(f, types.FunctionType) or id(f) in seen or not _by_value(f):
            continue
        seen.add(id(f))
        yield f
        names = {n for c in _codes(f.__code__) for n in c.co_names}
        todo.extend(f.__globals__[n] for n in names if n in f.__globals__)
        for cell in f.__closure__ or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass


#: A function's code, as cloudpickle (3.0 and later) sends it by value, names no file.
_NO_FILE = "<dynamic-code>"


#: Where the code sent by value comes from (:func:`_origins`): files by code, lines by file.
_Origins = tuple[dict[tuple[str, int], str], dict[str, list[str]]]


def _origins(fn: Any) -> _Origins:
    """Where the code sent by value comes from, for the worker's tracebacks: the file of each
    code object (by name and first line; cloudpickle sends none), and the lines of those files
    that are in no file on disk (a notebook cell, ``python -c``) as linecache has them here."""
    files: dict[tuple[str, int], str] = {}
    sources: dict[str, list[str]] = {}
    for f in _functions_sent_by_value(fn):
        for code in _codes(f.__code__):
            files[(code.co_name, code.co_firstlineno)] = code.co_filename
        filename = f.__code__.co_filename
        if filename not in sources and not os.path.isfile(filename):  # a file the worker reads itself
            lines = linecache.getlines(filename, f.__globals__)
            if lines:
                sources[filename] = lines
    return files, sources


def _restore_origins(fn: Any, files: dict[tuple[str, int], str], sources: dict[str, list[str]]) -> None:
    """The worker's side of :func:`_origins`: each function sent by value gets its code's file
    names back, and linecache the lines of those in no file."""
    for filename, lines in sources.items():
        # No modification time: checkcache keeps them, where no such file exists here.
        linecache.cache[filename] = (sum(map(len, lines)), None, list(lines), filename)
    if not files:
        return

    def renamed(code: types.CodeType) -> types.CodeType:
        consts = tuple(renamed(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        name = files.get((code.co_name, code.co_firstlineno), code.co_filename)
        return code.replace(co_filename=name, co_consts=consts)

    for f in list(_functions_sent_by_value(fn)):
        if f.__code__.co_filename == _NO_FILE:
            f.__code__ = renamed(f.__code__)


_warned_large: set[tuple[str, str]] = set()


def code_names(code: types.CodeType) -> set[str]:
    """The global names (and imported modules) ``code`` and the functions nested in it use."""
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _captured(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """The globals and closure variables a function refers to (its nested functions' too)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    names = code_names(code)
    glb = getattr(fn, "__globals__", {})
    found = [(f"global {n!r}", glb[n]) for n in sorted(names) if n in glb]
    cells = getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, cells):
        try:
            found.append((f"closure variable {name!r}", cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    return [(n, v) for n, v in found if not isinstance(v, types.ModuleType)]


def _warn_large(fn: Callable[..., Any], args: tuple, kwargs: dict, size: int) -> None:
    key = (str(getattr(fn, "__module__", "")), str(getattr(fn, "__qualname__", id(fn))))
    if key in _warned_large:
        return
    _warned_large.add(key)

    def largest(parts: list[tuple[str, Any]]) -> Optional[tuple[int, str]]:
        sizes = []
        for name, value in parts:
            try:
                sizes.append((len(cloudpickle.dumps(value, protocol=5)), name))
            except Exception:  # noqa: BLE001 - this one is not the question
                pass
        return max(sizes) if sizes else None

    mib = 1 << 20
    what = [f"the call of {key[1]} pickles to {size / mib:.0f} MiB, copied to every worker"]
    captured = largest(_captured(fn))
    if captured:
        what.append(f"the largest global it captures is {captured[1]} ({captured[0] / mib:.1f} MiB)")
    arg = largest([(f"argument {i}", a) for i, a in enumerate(args, 1)] +
                  [(f"keyword argument {k!r}", v) for k, v in kwargs.items()])
    if arg:
        what.append(f"its largest argument is {arg[1]} ({arg[0] / mib:.1f} MiB)")
    what.append("load large data in the function (from a file) instead of sending it with each call")
    warnings.warn("; ".join(what), LargeCallWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of the first frame outside this package: the user's call."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame: Optional[types.FrameType] = sys._getframe(1)
    level = 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    return level


def encode_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """The request of one call: the caller's ``sys.path`` (so the worker imports what the caller
    would), the function and its arguments by value, and where the code sent by value comes from
    (:func:`_origins`).

    Raises :class:`UsageError` naming the argument for an open file, a socket, a lock or a
    generator among them; warns (:class:`LargeCallWarning`, once per function) past
    :data:`LARGE_CALL_BYTES`."""
    call = _plain_call(fn, args, kwargs)
    origins: _Origins = ({}, {})  # none sent by value
    if call is None:
        try:
            ahead = _pickled_ahead(fn)
            if ahead is None:
                call, origins = _dumps_call((fn, args, kwargs)), _origins(fn)
            else:
                head, origins = ahead
                call = (pickle.dumps if _plain_arguments(args, kwargs) else _dumps_call)((head, args, kwargs))
        except _Refused as exc:
            raise UsageError(f"{_refused_where(fn, args, kwargs)} is {exc.what} ({exc.type_name}), which cannot "
                             "travel to another process: pass what the worker needs to open or make it "
                             "(a path, the data) instead") from None
    if len(call) > LARGE_CALL_BYTES:
        _warn_large(fn, args, kwargs, len(call))
    return pickle.dumps((list(sys.path), call, origins), protocol=5)


class _Pickled:
    """A function pickled ahead, in a call's pickle: unpickled where the call is unpickled."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self) -> tuple[Callable[[bytes], Any], tuple[bytes]]:
        return pickle.loads, (self.data,)

#: Functions sent by value whose pickle nothing but their _fixed_state can change: that state,
#: the function pickled, and its origins, made once. Pickling a function by value is most of a
#: spaced call's own work in the caller (cloudpickle's Python, run cold after the caller's idle
#: wait), and a program calls the same function again and again.
_AHEAD: weakref.WeakKeyDictionary[types.FunctionType, tuple[tuple[Any, ...], _Pickled, _Origins]] = \
    weakref.WeakKeyDictionary()


def _pickled_ahead(fn: Any) -> Optional[tuple[_Pickled, _Origins]]:
    """``fn`` pickled (by value, as cloudpickle does) and its origins, made on its first call and
    kept while its _fixed_state stays the same; None for a function whose pickle depends on
    state the caller may change in place between calls."""
    state = _fixed_state(fn)
    if state is None:
        return None
    kept = _AHEAD.get(fn)
    if kept is None or kept[0] != state:
        kept = (state, _Pickled(_dumps_call(fn)), _origins(fn))
        _AHEAD[fn] = kept
    return kept[1], kept[2]


def _fixed_state(fn: Any) -> Optional[tuple[Any, ...]]:
    """All that cloudpickle's pickle of ``fn`` depends on, where each part is immutable: its code
    and names, defaults of plain types, annotations that are strings or builtin types, and the
    globals its code names that are modules sent by reference. None where anything else is part
    of it (a closure, attributes, a global list, function or class: the caller may change those in
    place between calls)."""
    by_reference = getattr(getattr(cloudpickle, "cloudpickle", None), "_should_pickle_by_reference", None)
    if by_reference is None or type(fn) is not types.FunctionType or fn.__closure__ or fn.__dict__:
        return None
    defaults, keywords = fn.__defaults__ or (), tuple((fn.__kwdefaults__ or {}).items())
    annotations = tuple(fn.__annotations__.items())
    if not _plain_arguments(defaults, dict(keywords)) or \
            not all(type(a) is str or isinstance(a, type) and a.__module__ == "builtins" for _, a in annotations):
        return None
    modules = []
    for name in sorted({n for code in _codes(fn.__code__) for n in code.co_names}):
        value = fn.__globals__.get(name, _UNSEEN)
        if value is _UNSEEN:
            continue  # a builtin, or an attribute's name
        if type(value) is not types.ModuleType or not by_reference(value):
            return None
        modules.append((name, value))
    return (fn.__code__, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__, defaults, keywords, annotations,
            tuple(modules))


#: Argument types the standard pickler writes as cloudpickle does, none of which is refused.
_PLAIN = frozenset({int, float, complex, bool, str, type(None)})


def _plain_arguments(args: tuple, kwargs: dict) -> bool:
    """Whether every argument is of a _PLAIN type (immutable, and pickled alike by either)."""
    return all(type(a) in _PLAIN for a in args) and all(type(v) in _PLAIN for v in kwargs.values())


def _plain_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Optional[bytes]:
    """The call pickled by the standard (C) pickler, where that is what cloudpickle would write: a
    function sent by reference, with arguments of plain types; else None. The common call, a
    module-level function given numbers or strings, then skips cloudpickle's per-object Python
    hooks and the search for code sent by value: each call runs them cold, after the caller's
    idle wait, at many times their warm cost."""
    if type(fn) is not types.FunctionType or not _plain_arguments(args, kwargs) or _by_value(fn):
        return None
    try:
        return pickle.dumps((fn, args, kwargs), protocol=5)
    except Exception:  # noqa: BLE001 - whatever it is, cloudpickle's path says it better
        return None


class _RaisedInWorker:
    """What the payload says about an exception: the exception itself when it unpickles here,
    else its type's name, text and attributes (reprs), and why it is not itself; and the
    traceback as text, always."""

    def __init__(self, exc: Optional[BaseException], type_name: str, message: str, tb: str,
                 attributes: dict[str, str], reason: str) -> None:
        self.exc = exc
        self.type_name = type_name
        self.message = message
        self.tb = tb
        self.attributes = attributes
        self.reason = reason


def _rebuild_exception(cls: type, args: tuple, state: dict[str, Any]) -> BaseException:
    """An exception made again from its type, ``args`` and ``__dict__``, without its
    ``__init__`` (which may take other arguments than ``args`` holds)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class _ByState:
    """Pickles as :func:`_rebuild_exception` of an exception (a reduce that never calls its
    ``__init__``)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple:
        return _rebuild_exception, (type(self.exc), self.exc.args, dict(getattr(self.exc, "__dict__", {})))


def _exception_pickle(exc: BaseException) -> tuple[Optional[bytes], str]:
    """The exception pickled so that it unpickles as itself (tried here, as the caller will):
    as it pickles by default (cloudpickle, its ``__reduce__``), else by its type and state.
    Returns (pickle, "") or (None, why neither works)."""
    why = []
    for how, obj in (("as it pickles", exc), ("by its type and attributes", _ByState(exc))):
        try:
            data = cloudpickle.dumps(obj, protocol=5)
            again = pickle.loads(data)
            if type(again) is not type(exc):
                raise TypeError(f"it unpickled as {type(again).__qualname__}")
            return data, ""
        except Exception as err:  # noqa: BLE001 - whatever pickling it meets, said in the reason
            why.append(f"{how}: {type(err).__name__}: {err}")
    return None, "it could not be rebuilt in the worker (" + "; ".join(why) + ")"


def _attribute_reprs(exc: BaseException) -> dict[str, str]:
    short = reprlib.Repr()
    short.maxstring = short.maxother = 200
    out = {}
    for name, value in getattr(exc, "__dict__", {}).items():
        try:
            out[name] = short.repr(value)
        except Exception as err:  # noqa: BLE001 - a __repr__ that fails
            out[name] = f"<repr failed: {type(err).__name__}>"
    return out


def _raised(exc: BaseException) -> tuple[int, bytes, list]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except Exception:  # a __str__ that fails
        message = repr(exc)
    exc.__traceback__ = None  # tracebacks do not pickle; the text carries it
    exc_bytes, reason = _exception_pickle(exc)
    # Strings first, the exception apart: the caller reads the description even where the
    # exception itself does not unpickle.
    body = pickle.dumps((type_name, message, tb, exc_bytes, _attribute_reprs(exc), reason), protocol=5)
    return RAISED, body, []


def _exit_as_python_would(exc: SystemExit) -> NoReturn:
    """``SystemExit`` from the function ends the worker as it ends a script: the status from its
    code (None: 0; an int; else the code printed to stderr and 1), ``atexit`` handlers run, the
    streams flushed. It is not handed to the caller as an exception: re-raised there, it would
    end the caller. The caller sees a worker that exited without a result (WorkerExited)."""
    code = exc.code
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF  # what the exit status holds of it, as for a script
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or replaced stream
                pass
        os._exit(status)


def run_call(request: bytes, before_call: Optional[Callable[[], object]] = None) -> tuple[int, bytes, list]:
    """The worker's side: runs the call in ``request`` and returns (tag, pickle, buffers) for the
    result segment. ``before_call`` runs once the call is unpickled (and what it needs imported),
    just before the function. Whatever the function raises is returned, never raised;
    ``SystemExit`` ends the worker (:func:`_exit_as_python_would`)."""
    try:
        path, call, (files, sources) = pickle.loads(request)
        sys.path[:] = path
        fn, args, kwargs = cloudpickle.loads(call)
        _restore_origins(fn, files, sources)
        if before_call is not None:
            before_call()
        value = fn(*args, **kwargs)
    except SystemExit as exc:
        _exit_as_python_would(exc)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt travels too
        return _raised(exc)
    buffers: list[pickle.PickleBuffer] = []
    try:
        body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception:
        try:
            buffers.clear()
            out = io.BytesIO()
            # Refusing as for arguments: cloudpickle would make an open file a StringIO, silently.
            _CallPickler(out, protocol=5, buffer_callback=buffers.append).dump(value)
            body = out.getvalue()
        except _Refused as exc:
            return _raised(InvalidResult(f"the function returned {exc.what} ({exc.type_name}), which cannot travel "
                                         "to another process: return what the caller needs to open or make it "
                                         "(a path, the data) instead"))
        except Exception as exc:
            err = InvalidResult(f"the function's result ({type(value).__module__}.{type(value).__qualname__}) "
                                f"could not be pickled: {exc}")
            err.__cause__ = exc
            return _raised(err)
    return VALUE, body, [b.raw() for b in buffers]


def decode_result(payload: Any) -> tuple[int, Any]:
    """The caller's side: (tag, object) from the payload, a read-only uint8 buffer over the
    mapped result segment. Out-of-band buffers become read-only memoryviews of that segment, so
    a large array arrives without a copy; the segment stays mapped while any of them lives.

    Raises ValueError for a payload that is not laid out as promised."""
    view = memoryview(payload).cast("B")
    size = view.nbytes
    if size < _HEAD.size:
        raise ValueError(f"payload of {size} bytes is shorter than its header")
    magic, tag, nbuf, table_at, body_at, body_size = _HEAD.unpack_from(view, 0)
    if magic != _MAGIC or tag not in (VALUE, RAISED):
        raise ValueError("payload has a wrong magic number or tag")

    def inside(offset: int, length: int) -> bool:
        return _HEAD.size <= offset <= size and length <= size - offset

    if nbuf > size or not inside(table_at, _ENTRY.size * nbuf):
        raise ValueError(f"payload's buffer table ({nbuf} entries) runs past its end")
    if not inside(body_at, body_size):
        raise ValueError("payload's pickle runs past its end")
    buffers = []
    for i in range(nbuf):
        offset, length = _ENTRY.unpack_from(view, table_at + _ENTRY.size * i)
        if not inside(offset, length):
            raise ValueError(f"payload's buffer {i} lies outside it")
        buffers.append(view[offset:offset + length])
    body = view[body_at:body_at + body_size]
    if tag == VALUE:
        return tag, pickle.loads(body, buffers=buffers)
    type_name, message, tb, exc_bytes, attributes, reason = pickle.loads(body)
    exc: Optional[BaseException] = None
    if exc_bytes is not None:
        try:
            loaded = pickle.loads(exc_bytes)
            if not isinstance(loaded, BaseException):
                reason = f"it unpickled as a {type(loaded).__qualname__}"
            elif not isinstance(loaded, Exception):
                # KeyboardInterrupt, GeneratorExit...: raised here, it would be taken for the
                # caller's own (SystemExit never comes: it ends the worker instead).
                reason = f"{type(loaded).__qualname__} is not raised in the caller, where it would end it"
            else:
                exc = loaded
        except Exception as err:  # noqa: BLE001 - its type does not unpickle here: a TaskError names it
            reason = f"it did not unpickle in the caller: {type(err).__name__}: {err}"
    return tag, _RaisedInWorker(exc, type_name, message, tb, attributes, reason)
