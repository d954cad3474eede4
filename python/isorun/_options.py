"""isolated()'s options, each declared once.

An option is a line of :class:`Options`: its name and type, what users and type checkers see,
annotated with its row (its default, its check and the ``CallOptions`` field it sets, which
runner/option_table.hpp binds by name). From these come isolated()'s keywords, the check of
option names, the resolved options a call is launched with, ``IsolatedFunction.options()`` and
the C++ options (``_api._Options.core``).
What one option's value forbids in another is a rule of ``_RULES``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Callable, Optional, TypedDict, Union, get_type_hints

from . import _core
from .errors import UsageError

Size = Union[int, str]
Duration = Union[int, float, str]
STARTS = ("auto", "exec", "zygote")


def size(value: Optional[Size], what: str) -> int:
    """Bytes of a cap given as an int or a size such as "2G", more than 0 (None: 0, no cap)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"{what} takes bytes (an int) or a size such as '2G', not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise UsageError(f"{what} cannot be negative ({value})")
        given = value
    else:
        try:
            given = _core.parse_size(value)
        except UsageError as e:
            raise UsageError(f"{what}: {e}") from None
    if given == 0:  # as the command line's --mem-limit 0: a cap of nothing is a mistake, not "no cap"
        raise UsageError(f"{what} must be greater than zero, not {value!r} (leave it out, or None, for no cap)")
    return given


def ms(value: Optional[Duration], what: str) -> int:
    """Milliseconds of a timeout or grace period (None: 0, not given); finite and positive."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"{what} takes seconds or a duration such as '30s', not {value!r}")
    if isinstance(value, str):
        try:
            given = _core.parse_duration_ms(value)
        except UsageError as e:
            raise UsageError(f"{what}: {e}") from None
    elif not math.isfinite(value):
        raise UsageError(f"{what} takes a finite number of seconds, not {value!r} (leave it out for none)")
    else:
        given = math.ceil(value * 1000)  # a positive fraction of a millisecond is not 0, "none"
    if given <= 0:
        raise UsageError(f"{what} must be positive, not {value!r}")
    return given


def gpu_indices(gpus: Union[str, Sequence[int], None]) -> Union[str, tuple[int, ...]]:
    """``gpus`` as given to isolated(): "all", or a list or tuple of GPU indices."""
    if gpus is None:
        return ()
    if isinstance(gpus, str):
        if gpus != "all":
            raise UsageError(f"gpus takes 'all' or a list of GPU indices, not {gpus!r}")
        return "all"
    if not isinstance(gpus, (list, tuple)) or any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
        raise UsageError(f"gpus takes 'all' or a list of GPU indices (ints), not {gpus!r}")
    return tuple(gpus)


def _count(what: str, least: int = 0) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"{what}, not {value!r}")
        return value
    return check


def _gpu(value: Any) -> Optional[int]:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise UsageError(f"gpu takes a GPU index, not {value!r}")
    return value


def _env(value: Any) -> tuple[str, ...]:
    entries = [f"{k}={v}" for k, v in value.items()] if isinstance(value, Mapping) else list(value or ())
    for entry in entries:
        if not isinstance(entry, str) or "=" not in entry or entry.startswith("="):
            raise UsageError(f"env entries are KEY=VALUE, not {entry!r}")
    return tuple(entries)


def _preload(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if not isinstance(name, str) or not name or "," in name:
            raise UsageError(f"preload takes module names, not {name!r}")
    return tuple(names)


def _python(value: Any) -> str:
    interpreter = value or sys.executable
    if not interpreter or not os.access(interpreter, os.X_OK):
        raise UsageError(f"python: {interpreter!r} is not an executable interpreter")
    return str(interpreter)


def _host_mem_limit(value: Any) -> int:
    cap = size(value, "host_mem_limit")
    if value is not None and cap < (16 << 20):
        raise UsageError(f"host_mem_limit {value!r} is below the smallest, 16M; give a larger cap (e.g. '1G')")
    return cap


def _cpus_per_call(value: Any) -> int:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"cpus_per_call takes a number of cores (1 or more), not {value!r}")
    return value or 0


def _alloc_conf(value: Any) -> str:
    if not isinstance(value, str):
        raise UsageError(f"alloc_conf takes the allocator's configuration as text, not {value!r}")
    return value


def _start(value: Any) -> str:
    if value not in STARTS:
        raise UsageError(f"start takes 'auto' (the default: workers forked from a zygote the first call starts, "
                         f"kept while calls come), 'exec' (each worker an exec'd interpreter) or 'zygote' "
                         f"(each worker forked from one interpreter that imported the preloads), not {value!r}")
    return str(value)


@dataclasses.dataclass(frozen=True)
class _Row:
    default: Any
    check: Callable[[Any], Any]  # the value given -> the value resolved; raises UsageError
    core: str = ""  # the CallOptions field the resolved value sets as it is ("": none, or computed)


class Options(TypedDict, total=False):
    """The options of :func:`isorun.isolated` (and ``IsolatedFunction.options``, ``map``,
    :class:`isorun.Executor`'s per-function defaults), by name and type. What each means is
    documented on :func:`isorun.isolated`. Each line is also the option's row: its default, its
    check and the ``CallOptions`` field it sets."""

    gpu: Annotated[Optional[int], _Row(None, _gpu, "gpu")]
    gpus: Annotated[Union[str, Sequence[int], None], _Row(None, gpu_indices)]  # "all": found as a call starts
    gpu_count: Annotated[int, _Row(0, _count("gpu_count takes a number of GPUs"), "gpu_count")]
    cpu: Annotated[bool, _Row(False, bool)]
    mem_limit: Annotated[Optional[Size], _Row(None, lambda v: size(v, "mem_limit"), "mem_limit")]
    timeout: Annotated[Optional[Duration], _Row(None, lambda v: ms(v, "timeout"), "timeout_ms")]
    grace: Annotated[Optional[Duration], _Row(None, lambda v: 5000 if v is None else ms(v, "grace"), "grace_ms")]
    env: Annotated[Union[Mapping[str, str], Sequence[str], None], _Row(None, _env, "env")]
    standby: Annotated[int, _Row(0, _count("standby takes a number of workers"), "standby")]
    warm_context: Annotated[bool, _Row(False, bool, "warm_context")]
    early_result: Annotated[bool, _Row(False, bool, "early_result")]
    alloc_conf: Annotated[str, _Row("", _alloc_conf, "alloc_conf")]
    preload: Annotated[Union[str, Sequence[str]], _Row((), _preload)]
    python: Annotated[Optional[str], _Row(None, _python)]
    echo_stderr: Annotated[bool, _Row(True, bool, "echo_stderr")]
    host_mem_limit: Annotated[Optional[Size], _Row(None, _host_mem_limit, "host_mem_limit")]
    cpus_per_call: Annotated[Optional[int], _Row(None, _cpus_per_call, "cpus_per_call")]
    capture_output: Annotated[bool, _Row(False, bool)]
    start: Annotated[str, _Row("auto", _start)]


_HINTS = get_type_hints(Options, include_extras=True)
_ROWS: dict[str, _Row] = {name: hint.__metadata__[0] for name, hint in _HINTS.items()}
NAMES = tuple(_ROWS)
CORE_FIELDS = tuple((name, row.core) for name, row in _ROWS.items() if row.core)
# The options that say where a call runs: given anew, they replace the old placement as a whole.
PLACEMENT = ("gpu", "gpus", "gpu_count", "cpu")

# What one option's value forbids in another: (applies, message).
_RULES: tuple[tuple[Callable[[dict[str, Any]], bool], str], ...] = (
    (lambda v: v["cpu"] and (v["gpu"] is not None or bool(v["gpus"]) or v["gpu_count"] > 0),
     "cpu=True excludes gpu, gpus and gpu_count"),
    (lambda v: v["capture_output"] and v["early_result"],
     "capture_output=True excludes early_result=True: the output is complete only once the worker has exited, "
     "after an early result"),
    (lambda v: v["start"] == "zygote" and v["warm_context"],
     "start='zygote' excludes warm_context=True: a zygote never initializes CUDA (its forked workers would "
     "inherit the driver's state), so no waiting worker has a context"),
)


def keywords() -> list[inspect.Parameter]:
    """The options as keyword-only parameters, with their defaults and types: the signature that
    help(), IDEs and Jupyter show for a function taking ``**options: Unpack[Options]``."""
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=row.default,
                              annotation=_HINTS[name].__origin__) for name, row in _ROWS.items()]


def resolve(given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option's value, checked and resolved from what was ``given`` (the rest at their
    defaults). Raises :class:`UsageError` naming the first option that cannot work."""
    values = {name: row.check(given.get(name, row.default)) for name, row in _ROWS.items()}
    for applies, message in _RULES:
        if applies(values):
            raise UsageError(message)
    return values


#: Keywords of other APIs that users bring along, and what isorun calls them.
_OPTION_HINTS = {"n_jobs": "max_workers", "max_tasks_per_child": None, "mp_context": None, "initializer": "preload",
                 "gpu_id": "gpu", "device": "gpu", "memory_limit": "mem_limit"}


def check_names(given: Iterable[str], where: str, own: Sequence[str] = ()) -> None:
    """Raises :class:`UsageError` for the names in ``given`` that are neither ``own`` (the caller's
    own options) nor isolated()'s, listing the valid ones: the one check of option names."""
    valid = list(dict.fromkeys([*own, *NAMES]))
    unknown = [name for name in given if name not in valid]
    if not unknown:
        return
    hints = [f"{name}: use {_OPTION_HINTS[name]}" for name in unknown if _OPTION_HINTS.get(name)]
    names = ", ".join(repr(name) for name in unknown)
    raise UsageError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} {names}"
                     f"{' (' + '; '.join(hints) + ')' if hints else ''}; its options are: {', '.join(valid)}")
