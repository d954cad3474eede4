"""A sweep's trial in the worker: the function named by the spec's ``python:``, called with the
trial's parameters as keyword arguments; its returned dict is the trial's JSON result."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Callable, Optional

__all__ = ["run_trial", "resolve", "check", "ImportFailed", "Refused"]


class ImportFailed(Exception):
    """The trial's module was found, and importing it raised (``__cause__``): a missing package it
    imports, a ``SystemExit`` from its module-level ``argparse``, ..."""


class Refused(Exception):
    """The function is found, and its trials could not run as the spec asks: it does not take a
    parameter of the spec as a keyword, it needs one the spec does not give, or it is defined only
    when its file runs as the main script. ``parameter``: the spec's parameter at fault, where
    one is (the first, in the spec's order)."""

    def __init__(self, message: str, parameter: Optional[str] = None):
        super().__init__(message)
        self.parameter = parameter


#: Set in a sweep trial's interpreter (sweep/src/trials/python_trials.hpp, trial_env).
TRIAL_ENV = "ISORUN_SWEEP_TRIAL"


def is_file(where: str) -> bool:
    """Whether ``where`` (a target's part before ``:``) names a file rather than a module."""
    return where.endswith(".py") or os.sep in where


def file_module_name(where: str) -> str:
    """The name the module of the file ``where`` is loaded under: its file's name."""
    return os.path.splitext(os.path.basename(where))[0]


def load_file(where: str) -> ModuleType:
    """The module of the file ``where``, loaded as a script's (its folder first on ``sys.path``),
    under its file's name; once per interpreter (a worker that preloaded it keeps that one)."""
    folder = os.path.dirname(where)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_name = file_module_name(where)
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__file__", None) == where:
        return loaded
    spec = importlib.util.spec_from_file_location(module_name, where)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {where} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so that what it defines pickles by reference
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)  # as importlib does: no half-run module is found later
        raise
    return module


def resolve(target: str, path: list[str]) -> Callable[..., Any]:
    """The function ``target`` names: ``module:function`` (found from ``path``, then
    ``sys.path``) or ``/path/to/file.py:function`` (loaded from the file, its folder first on
    ``sys.path`` as for a script). ``function`` may be dotted (``Class.method``)."""
    where, _, name = target.rpartition(":")
    # Imported as the script would run with no arguments: module-level argparse sees none (not
    # the worker's own argv).
    sys.argv[:] = [where]
    if not is_file(where):
        for entry in reversed(path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
    try:
        module = load_file(where) if is_file(where) else importlib.import_module(where)
    except BaseException as e:  # noqa: BLE001 - said as the trial's error, SystemExit included
        missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
        if missing is not None and (where == missing or where.startswith(missing + ".")):
            raise  # the module itself (or its package) is not found
        raise ImportFailed(f"importing {where} raised {type(e).__name__}: {e}") from e
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part)
    # A function decorated with isorun.isolated runs here, in the trial's own isolated process,
    # not in yet another one. (Only a module that imported isorun._api can hold one: a trial of a
    # plain function does not import it.)
    api = sys.modules.get("isorun._api")
    if api is not None and isinstance(found, api.IsolatedFunction):
        found = found.__wrapped__
    if not callable(found):
        raise TypeError(f"{target} is not a function")
    return found


def check(target: str, path: list[str], names: list[str]) -> None:
    """What a sweep checks before its first trial (sweep/src/trials/python_trials.cpp runs it, for
    the command line and ``isorun.sweep`` alike): the function ``target`` names is found as a trial
    finds it, takes each of ``names`` (the spec's parameters) as a keyword argument, and needs no
    other. Raises Refused where it does not, ImportFailed where its module raises."""
    where, _, name = target.rpartition(":")
    try:
        fn = resolve(target, path)
    except AttributeError:
        module = sys.modules.get(file_module_name(where) if is_file(where) else where)
        source = getattr(module, "__file__", None)
        if source and name.split(".")[0] in _defined_under_main_guard(source):
            raise Refused(f"{name}() is defined under 'if __name__ == \"__main__\":' in {source}, which does not "
                          f"run when its trials import the file as a module; define the function at the top level "
                          f"of the file") from None
        raise
    _check_parameters(fn, name, names)


def _check_parameters(fn: Callable[..., Any], name: str, names: list[str]) -> None:
    """Refuses a function that cannot be called with ``names`` as keyword arguments alone."""
    import inspect  # (here: a trial itself does not need it)

    try:  # the signature the trial calls: a decorator's wrapper's own, not what it wraps
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return  # (a callable without one: its trials say what they find)
    takes = signature.parameters.values()
    named = " ".join(f"{name}{signature}".split())  # a default's repr may span lines (an array's)
    positional = [p.name for p in takes if p.kind == p.POSITIONAL_ONLY and (p.name in names or p.default is p.empty)]
    if positional:
        raise Refused(f"{named} takes {', '.join(map(repr, positional))} by position only (before '/'), and a "
                      f"trial passes its parameters as keyword arguments: make {_it(positional)} a keyword "
                      f"parameter", next((n for n in positional if n in names), None))
    keywords = {p.name for p in takes if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = [n for n in dict.fromkeys(names) if n not in keywords]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in takes):
        one = len(unknown) == 1
        raise Refused(f"the sweep's parameter{'' if one else 's'} {', '.join(map(repr, unknown))} "
                      f"{'is not a parameter' if one else 'are not parameters'} of {named}: rename "
                      f"{_it(unknown)} in the spec, or add {_it(unknown)} to the function", unknown[0])
    missing = [p.name for p in takes if p.name in keywords and p.default is p.empty and p.name not in names]
    if missing and "." in name and missing[0] in ("self", "cls"):
        raise Refused(f"{named} is a method of a class, called on no object: name a function, a staticmethod "
                      f"or a classmethod")
    if missing:
        raise Refused(f"{named} has no default for {', '.join(map(repr, missing))}, which the sweep's parameters "
                      f"do not give: add {_it(missing)} to the spec, or give {_it(missing)} a default")


def _it(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"


def _defined_under_main_guard(source: str) -> set[str]:
    """The names that the top-level ``if __name__ == "__main__":`` blocks of the file ``source``
    define (empty where it does not parse)."""
    import ast

    try:
        with open(source, encoding="utf-8") as f:
            tree = ast.parse(f.read(), source)
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(inner.name)
                elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                    names.add(inner.id)
    return names


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: NumPy scalars and arrays as numbers and lists, a float that
    is not finite (a diverged loss) as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # NumPy (and anything like it)
        return _plain(value.tolist())
    raise TypeError(f"the result holds a {type(value).__name__}, which has no JSON form")


def run_trial(request: str) -> str:
    """Runs the trial ``request`` describes and returns its result as the task's JSON."""
    call = json.loads(request)
    for key, value in call.get("variables", {}).items():
        os.environ[key] = value  # before the function runs: the cap's region
    from . import _core

    _core.bind_cap()  # pinned now, before any of the function's code (its imports included) runs
    fn = resolve(call["function"], call.get("path", []))
    value = fn(**call["kwargs"])
    if not isinstance(value, Mapping):
        raise TypeError(f"a sweep's function returns a dict of its results; {call['function']} returned "
                        f"{type(value).__name__}")
    return json.dumps({"result": _plain(value)})
