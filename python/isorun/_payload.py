"""What travels: the call (function and arguments, by value with cloudpickle) and the result
(pickle protocol 5, its out-of-band buffers placed in the result segment by the worker).

The result payload's layout is written down in ``python/src/payload.hpp``; the runner has checked
its checksum and bounds before :func:`decode_result` sees it, and the parse here checks every
offset again against the payload's size.
"""

from __future__ import annotations

import pickle
import struct
import sys
import traceback
from typing import Any, Callable, Optional

import cloudpickle

__all__ = ["encode_call", "run_call", "decode_result", "VALUE", "RAISED"]

VALUE = 0  #: the payload holds the function's return value
RAISED = 1  #: the payload holds the exception it raised, with its traceback

_MAGIC = 0x59505349  # "ISPY"
_HEAD = struct.Struct("<IIQQQQ")  # magic, tag, buffers, table offset, pickle offset, its size
_ENTRY = struct.Struct("<QQ")


def encode_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """The request of one call: the caller's ``sys.path`` (so the worker imports what the caller
    would), then the function and its arguments by value."""
    call = cloudpickle.dumps((fn, args, kwargs), protocol=5)
    return pickle.dumps((list(sys.path), call), protocol=5)


class _RaisedInWorker:
    """What the payload says about an exception: the exception itself when it pickles, else its
    type's name and text; and the traceback as text, always."""

    def __init__(self, exc: Optional[BaseException], type_name: str, message: str, tb: str) -> None:
        self.exc = exc
        self.type_name = type_name
        self.message = message
        self.tb = tb


def _raised(exc: BaseException) -> tuple[int, bytes, list]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except Exception:  # a __str__ that fails
        message = repr(exc)
    exc.__traceback__ = None  # tracebacks do not pickle; the text carries it
    try:
        exc_bytes: Optional[bytes] = cloudpickle.dumps(exc, protocol=5)
    except Exception:
        exc_bytes = None
    # Strings first, the exception apart: the caller reads the description even where the
    # exception itself does not unpickle.
    body = pickle.dumps((type_name, message, tb, exc_bytes), protocol=5)
    return RAISED, body, []


def run_call(request: bytes, before_call: Optional[Callable[[], object]] = None) -> tuple[int, bytes, list]:
    """The worker's side: runs the call in ``request`` and returns (tag, pickle, buffers) for the
    result segment. ``before_call`` runs once the call is unpickled (and what it needs imported),
    just before the function. Whatever the function raises is returned, never raised."""
    try:
        path, call = pickle.loads(request)
        sys.path[:] = path
        fn, args, kwargs = cloudpickle.loads(call)
        if before_call is not None:
            before_call()
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt travel too
        return _raised(exc)
    buffers: list[pickle.PickleBuffer] = []
    try:
        body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception:
        try:
            buffers.clear()
            body = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        except Exception as exc:
            err = TypeError(f"the function's result could not be pickled: {exc}")
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
    type_name, message, tb, exc_bytes = pickle.loads(body)
    exc: Optional[BaseException] = None
    if exc_bytes is not None:
        try:
            loaded = pickle.loads(exc_bytes)
            exc = loaded if isinstance(loaded, BaseException) else None
        except Exception:  # noqa: BLE001 - its type does not unpickle here: a TaskError names it
            exc = None
    return tag, _RaisedInWorker(exc, type_name, message, tb)
