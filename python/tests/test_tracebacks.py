"""The worker's tracebacks show the caller's source (a notebook cell is in no file), and a worker
killed by a fatal signal leaves its Python stack in the WorkerCrashed it raises."""

from __future__ import annotations

import linecache
import os
import signal
import subprocess
import sys

import pytest

import isorun

CELL = '''\
def train(lr):
    loss = 1 / lr
    raise ValueError(f"diverged at lr={lr}")
'''


def test_a_traceback_of_a_main_function_shows_the_caller_s_source_lines():
    # As IPython runs a cell: compiled under a name no file has, its lines in linecache.
    name = "<ipython-input-7-cafe>"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(keepends=True), name)
    ns = {"__name__": "__main__"}
    exec(compile(CELL, name, "exec"), ns)
    with pytest.raises(ValueError) as info:
        isorun.isolated(ns["train"])(0.5)
    tb = info.value.remote_traceback
    assert f'File "{name}", line 3, in train' in tb
    assert 'raise ValueError(f"diverged at lr={lr}")' in tb


def test_a_traceback_of_a_script_s_function_names_the_script_s_file_and_line(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(
        "import isorun\n"
        "\n"
        "def train(lr):\n"
        "    raise ValueError(f'diverged at lr={lr}')\n"
        "\n"
        "try:\n"
        "    isorun.isolated(train)(0.5)\n"
        "except ValueError as e:\n"
        "    print(e.remote_traceback)\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0, p.stderr
    assert f'File "{script}", line 4, in train' in p.stdout
    assert "raise ValueError(f'diverged at lr={lr}')" in p.stdout
    assert "<dynamic-code>" not in p.stdout


def crash_in_native_code():
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


def test_a_segfault_s_python_stack_is_in_the_stderr_tail_and_the_message():
    with pytest.raises(isorun.WorkerCrashed) as info:
        isorun.isolated(crash_in_native_code, echo_stderr=False)()
    e = info.value
    assert e.signal == signal.SIGSEGV
    assert any("crash_in_native_code" in line for line in e.stderr_tail)
    assert "Fatal Python error: Segmentation fault" in str(e)
    assert "in crash_in_native_code" in str(e)
