"""Standby interpreters: launched ahead of the call, their preload modules imported while they
wait; each still serves exactly one call. These are exec'd ones (start="exec"); forked ones are
test_zygote.py's and the default's test_auto_start.py's."""

from __future__ import annotations

import os
import sys

import pytest

import isorun

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")


def report():
    import isorun._worker as worker

    probe = sys.modules.get("preload_probe")
    return {
        "at_entry": "preload_probe" in worker.modules_at_entry,
        "pid": os.getpid(),
        "imported_by": probe.imported_by if probe else None,
    }


@pytest.fixture(autouse=True)
def helpers_on_path(monkeypatch):
    """preload_probe is importable here, from this process's sys.path (not the environment)."""
    monkeypatch.syspath_prepend(HELPERS)


def test_a_preloaded_module_is_in_sys_modules_when_the_call_begins():
    f = isorun.isolated(report, preload=["preload_probe"], standby=1, start="exec")
    f.warm_up()
    first = f()
    assert first["at_entry"]
    assert first["imported_by"] == first["pid"]  # imported by the worker itself, before the call


def test_each_standby_interpreter_serves_one_call():
    f = isorun.isolated(report, preload=["preload_probe"], standby=2, start="exec")
    f.warm_up()
    results = [f() for _ in range(4)]
    assert all(r["at_entry"] for r in results)
    assert len({r["pid"] for r in results}) == 4


def late_report():
    import isorun._worker as worker

    return "late_probe" in worker.modules_at_entry


def test_a_folder_put_on_sys_path_after_a_call_is_where_the_next_call_preloads_from(tmp_path, monkeypatch):
    # The call's launch (its interpreters' environment) is made once per sys.path: a changed path
    # is seen by the next call, whose interpreters are launched anew.
    (tmp_path / "late_probe.py").write_text("")
    f = isorun.isolated(late_report, preload=["late_probe"], standby=1, echo_stderr=False, start="exec")
    assert f() is False  # not found: it is not on the path yet
    monkeypatch.syspath_prepend(str(tmp_path))
    assert f() is True


def test_without_preload_the_module_is_not_there():
    f = isorun.isolated(report, standby=1, start="exec")
    f.warm_up()
    assert not f()["at_entry"]


def test_a_warm_interpreter_prepares_its_gpu_through_the_first_preloaded_framework(monkeypatch):
    # What the worker does at launch, with stand-ins for the frameworks (no GPU here): only a
    # real device is prepared, and only through the first preloaded framework that has a context.
    import types

    from isorun import _worker

    calls = []
    for name in ("torch", "cupy"):
        module = types.ModuleType(name)
        module.zeros = lambda *a, _name=name, **k: calls.append((_name, a, k))
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("ISORUN_WARM", "0;sim;17179869184;1073741824;GPU-sim-0;")
    _worker._warm_up(["numpy", "cupy", "torch"])
    assert calls == []  # a simulated device has no context to make
    monkeypatch.setenv("ISORUN_WARM", "0;cuda;85899345920;2147483648;GPU-abc;")
    _worker._warm_up(["numpy", "cupy", "torch"])
    assert calls == [("cupy", (1,), {})]
    monkeypatch.delenv("ISORUN_WARM")
    _worker._warm_up(["torch"])
    assert len(calls) == 1  # not a warm worker
