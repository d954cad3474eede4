"""The caller's pool of shared-memory segments: :func:`set_segment_pool`, :func:`segment_pool_stats`.

A result arrives in a segment (memfd, tmpfs pages: resident memory of this process). Once the
result is dropped, the segment goes back to a pool for the next call, whose result then lands on
pages already faulted in; beyond the pool's limit, segments are closed and their memory goes
back to the OS. The C++ runner keeps up to 2 GiB idle; a Python caller (a notebook kept open for
hours) keeps :data:`DEFAULT_MAX_IDLE_BYTES` unless told otherwise, and beyond it, by default, the
segments released in the last ``ISORUN_IDLE`` seconds (10) up to :data:`DEFAULT_LINGER_BYTES` in
all: a program that makes a large result again and again finds its pages warm, and one that
stops gets the memory back within those seconds.
"""

from __future__ import annotations

import os
import threading
from typing import Union

from . import _core
from .errors import UsageError

__all__ = ["set_segment_pool", "segment_pool_stats", "DEFAULT_MAX_IDLE_BYTES", "DEFAULT_LINGER_BYTES"]

#: The most bytes of idle segments a Python caller keeps by default.
DEFAULT_MAX_IDLE_BYTES = 256 << 20
#: The most bytes of idle segments kept for the idle seconds after their release, by default.
DEFAULT_LINGER_BYTES = 2 << 30

IDLE_ENV = "ISORUN_IDLE"
_DEFAULT_IDLE_S = 10.0


def idle_ms() -> int:
    """How long start="auto" keeps its zygote and waiting worker with no call running, and a
    released segment lingers: ISORUN_IDLE seconds, else 10 s."""
    text = os.environ.get(IDLE_ENV, "")
    try:
        seconds = float(text) if text else _DEFAULT_IDLE_S
    except ValueError:
        raise UsageError(f"{IDLE_ENV}={text!r} is not a number of seconds (e.g. 10 or 0.5)") from None
    if not seconds > 0:
        raise UsageError(f"{IDLE_ENV}={text!r}: give a number of seconds above 0 (start='exec' keeps no pool)")
    return max(1, int(seconds * 1000))


_lock = threading.Lock()
_max_idle: Union[int, None] = None  # None: the default not applied yet


def set_segment_pool(*, max_idle_bytes: Union[int, str]) -> None:
    """Keeps at most ``max_idle_bytes`` (bytes, or a size such as ``"512M"``; 0: none) of idle
    result and request segments for reuse; idle segments beyond it are closed at once, and their
    memory goes back to the OS. More makes repeated large results faster (no page faults);
    less keeps this process smaller between calls. Default 256 MiB, and up to 2 GiB for the idle
    seconds after a release; once set, nothing is kept beyond ``max_idle_bytes``."""
    global _max_idle
    if isinstance(max_idle_bytes, bool) or not isinstance(max_idle_bytes, (int, str)):
        raise UsageError(f"max_idle_bytes takes bytes (an int) or a size such as '256M', not {max_idle_bytes!r}")
    size = _core.parse_size(max_idle_bytes) if isinstance(max_idle_bytes, str) else max_idle_bytes
    if size < 0:
        raise UsageError(f"max_idle_bytes cannot be negative ({size})")
    with _lock:
        _max_idle = size
        _core.set_segment_idle_limit(size)


def segment_pool_stats() -> dict[str, int]:
    """The pool now: ``idle_bytes`` (segments kept for reuse, resident) and ``max_idle_bytes``."""
    apply_default()
    return {"idle_bytes": int(_core.segment_idle_bytes()), "max_idle_bytes": int(_max_idle or 0)}


def apply_default() -> None:
    """The caller's default limit, unless one was set (called before the first call)."""
    global _max_idle
    with _lock:
        if _max_idle is None:
            _max_idle = DEFAULT_MAX_IDLE_BYTES
            _core.set_segment_idle_limit(DEFAULT_MAX_IDLE_BYTES)
            try:
                linger_ms = idle_ms()
            except UsageError:  # (refused at the first call that starts a pool)
                linger_ms = int(_DEFAULT_IDLE_S * 1000)
            _core.set_segment_linger(DEFAULT_LINGER_BYTES, linger_ms)
