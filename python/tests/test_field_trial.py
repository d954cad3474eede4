"""The edges a Python user's field trial met (issue 62): functions of modules the worker cannot
import, concurrent.futures' max_workers, PBT populations larger than the slots, the sweep's table
and trials, the thread limits against env=, and what a result cannot be."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import isorun

_PACKAGE_PATH = os.path.dirname(os.path.dirname(os.path.abspath(isorun.__file__)))


def _run_script(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """Runs ``source`` as a script (its own __main__) with this test's isorun on its path."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_PACKAGE_PATH, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


# B2: by value or by reference is decided by whether the worker can import the module.

def test_a_script_function_called_in_a_spawn_child_runs(tmp_path):
    for method in ("spawn", "forkserver"):
        done = _run_script(tmp_path, f"""
            import multiprocessing as mp
            import isorun

            def double(x):
                return 2 * x

            def child():
                print("child:", isorun.isolated(double)(21), isorun.isolated(double, standby=1)(4), flush=True)
                isorun.stop_standby()

            if __name__ == "__main__":
                p = mp.get_context({method!r}).Process(target=child)
                p.start(); p.join()
                print("exit", p.exitcode)
            """)
        assert done.stdout.splitlines() == ["child: 42 8", "exit 0"], (method, done.stdout, done.stderr)


def test_a_function_of_a_module_loaded_by_file_path_runs(tmp_path):
    plugins = tmp_path / "plugin_dir"
    plugins.mkdir()
    (plugins / "my_plugin.py").write_text("OFFSET = 1\n\ndef score(x):\n    return x * 3 + OFFSET\n")
    spec = importlib.util.spec_from_file_location("my_plugin", plugins / "my_plugin.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_plugin"] = module
    try:
        spec.loader.exec_module(module)
        assert isorun.isolated(module.score)(2) == 7
        assert [r.value for r in isorun.map(module.score, [1, 2])] == [4, 7]
    finally:
        sys.modules.pop("my_plugin", None)


def test_a_module_the_worker_imports_is_still_sent_by_reference():
    from isorun import _payload

    assert _payload.importable("os") and _payload.importable("isorun._payload")
    assert not _payload.importable("__main__") and not _payload.importable("__mp_main__")
