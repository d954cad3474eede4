"""Standby interpreters: launched ahead of the call, their preload modules imported while they
wait; each still serves exactly one call."""

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
    f = isorun.isolated(report, preload=["preload_probe"], standby=1)
    f.warm_up()
    first = f()
    assert first["at_entry"]
    assert first["imported_by"] == first["pid"]  # imported by the worker itself, before the call


def test_each_standby_interpreter_serves_one_call():
    f = isorun.isolated(report, preload=["preload_probe"], standby=2)
    f.warm_up()
    results = [f() for _ in range(4)]
    assert all(r["at_entry"] for r in results)
    assert len({r["pid"] for r in results}) == 4


def test_without_preload_the_module_is_not_there():
    f = isorun.isolated(report, standby=1)
    f.warm_up()
    assert not f()["at_entry"]
