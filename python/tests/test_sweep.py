"""Python functions in sweeps: ``python: module:function`` in a spec, and :func:`isorun.sweep`.
Each trial is a call of the function in a fresh interpreter, run by the C++ sweep (packing,
standby interpreters, the journal, resume, the report)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import isorun

TRIALS = textwrap.dedent('''
    import math
    import os
    import sys

    CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls")

    def train(lr, hidden):
        with open(CALLS, "a") as f:  # one line per call: what resume must not run again
            f.write(f"{lr} {hidden}\\n")
        return {"loss": (lr - 0.01) ** 2 + 1.0 / hidden, "pid": os.getpid()}

    def curve(x, y, clean):
        # tests/helpers/curve.py's learning curve, reported step by step
        import time
        import isorun
        with open(CALLS, "a") as f:
            f.write(f"{x} {y}\\n")
        if clean:
            isorun.should_stop()  # asked before the first report: any stop is a clean one
        loss = 0.0
        for t in range(1, 28):
            loss = (x - 0.3) ** 2 + (y - 0.6) ** 2 + (1 + abs(x - 0.3) + abs(y - 0.6)) * 2.0 / (t + 1)
            isorun.report(step=t, loss=loss)
            time.sleep(0.001)
            if clean and isorun.should_stop():
                with open(CALLS, "a") as f:
                    f.write(f"stopped {x} {y}\\n")
                return {"loss": loss}
        return {"loss": loss}

    def preloaded():
        import isorun._worker
        return {"numpy_at_entry": "numpy" in isorun._worker.modules_at_entry}

    def fails(kind):
        if kind == "raise":
            raise ValueError("no good")
        if kind == "nan":
            return {"loss": math.nan}
        return ["not", "a", "dict"]

    def allocate(block_mib):
        from driver_alloc import allocate_until_refused
        blocks, rc = allocate_until_refused(block_mib)
        if block_mib >= 512:
            raise MemoryError(f"CUDA out of memory (error {rc})")
        return {"blocks": blocks, "rc": rc}

    def children(count):
        # Children started with an environment of their own before any CUDA call of the trial's,
        # each holding 64 MiB blocks until refused, alive together.
        import subprocess
        import driver_alloc
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"],
               "PYTHONPATH": os.path.dirname(driver_alloc.__file__), "PYTHONDONTWRITEBYTECODE": "1"}
        holder = ("import sys, driver_alloc; n, rc = driver_alloc.allocate_until_refused(64); print(n, flush=True); "
                  "sys.stdin.read()")
        kids = [subprocess.Popen([sys.executable, "-c", holder], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for _ in range(count)]
        blocks = [int(k.stdout.readline() or -1) for k in kids]
        for k in kids:
            k.stdin.close()
            k.wait()
        return {"blocks": sum(blocks), "least": min(blocks)}
''')


@pytest.fixture
def trials(tmp_path):
    """trials.py in a folder of its own; the path of the file."""
    path = tmp_path / "trials.py"
    path.write_text(TRIALS)
    return path


def calls(trials) -> list[str]:
    path = trials.parent / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_a_python_sweep_runs_each_trial_and_resumes_without_running_any_again(trials, tmp_path):
    spec = {
        "python": f"{trials}:train",
        "params": {"lr": [0.1, 0.01], "hidden": [16, 64]},
        "metric": {"name": "loss", "goal": "minimize"},
        "resources": {"cpu_slots": 2},
        "out": str(tmp_path / "out"),
    }
    records = isorun.sweep(spec)
    assert records.out == str(tmp_path / "out")
    assert len(records) == 4 and all(r["outcome"] == "success" for r in records)
    by_params = {(r["params"]["lr"], r["params"]["hidden"]): r["result"] for r in records}
    assert by_params[(0.01, 64)]["loss"] == pytest.approx(1 / 64)
    assert len({r["pid"] for r in by_params.values()}) == 4  # a fresh interpreter each
    assert sorted(calls(trials)) == sorted(["0.1 16", "0.1 64", "0.01 16", "0.01 64"])
    # The same sweep again: everything is journaled, nothing runs, the records come back.
    again = isorun.sweep(spec)
    assert len(calls(trials)) == 4
    assert sorted(r["id"] for r in again) == sorted(r["id"] for r in records)
    assert (tmp_path / "out" / "report.html").exists()


def test_a_function_object_is_found_by_its_module_and_name(trials, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(trials.parent))
    import trials as module  # noqa: PLC0415 - the file this test wrote

    records = isorun.sweep({"python": module.train, "params": {"lr": [0.5], "hidden": [2]}},
                           out=tmp_path / "out")
    assert [r["outcome"] for r in records] == ["success"]
    assert records[0]["result"]["loss"] == pytest.approx(0.49 ** 2 + 0.5)
    with open(tmp_path / "out" / "sweep.json") as f:
        assert json.load(f)["task"] == "python:trials:train"


def test_the_records_as_a_data_frame(trials, tmp_path):
    pytest.importorskip("pandas")
    records = isorun.sweep({"python": f"{trials}:train", "params": {"lr": [0.5, 0.1], "hidden": [2]}},
                           out=tmp_path / "out")
    frame = records.frame()
    assert sorted(frame["params.lr"]) == [0.1, 0.5] and "result.loss" in frame.columns


def test_the_data_frame_without_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # (an import of it raises ImportError)
    with pytest.raises(ImportError, match="pip install pandas"):
        isorun.SweepResults([{"id": "1", "outcome": "success"}], out="out").frame()


def test_standby_interpreters_import_the_preloads_before_their_trial(trials, tmp_path):
    # A function of another file of the folder: a file's folder comes first on sys.path.
    (tmp_path / "probe.py").write_text("from trials import preloaded\n\ndef probe(i):\n    return preloaded()\n")
    spec = {"python": f"{tmp_path / 'probe.py'}:probe", "params": {"i": [1, 2, 3]}, "out": str(tmp_path / "out"),
            "resources": {"cpu_slots": 1, "standby": 1, "preload": ["numpy"]}}
    records = isorun.sweep(spec)
    assert [r["outcome"] for r in records] == ["success"] * 3
    assert all(r["result"]["numpy_at_entry"] for r in records)
    spec["resources"] = {"cpu_slots": 1, "standby": 1}
    records = isorun.sweep(spec, out=tmp_path / "without")
    assert not any(r["result"]["numpy_at_entry"] for r in records)


WHERE = textwrap.dedent('''
    import os

    IMPORTED_IN = os.getpid()

    def where(i):
        import isorun._worker
        return {"pid": os.getpid(), "imported_in": IMPORTED_IN, "ahead": __name__ in isorun._worker.modules_at_entry}
''')


@pytest.mark.parametrize("target", ["file", "module"])
def test_interpreters_launched_ahead_import_the_trial_s_module_before_their_trial(tmp_path, monkeypatch, target):
    (tmp_path / "where.py").write_text(WHERE)
    monkeypatch.chdir(tmp_path)  # modules are found from the folder isorun runs in
    python = f"{tmp_path / 'where.py'}:where" if target == "file" else "where:where"
    spec = {"python": python, "params": {"i": [1, 2, 3, 4]}, "resources": {"cpu_slots": 1, "standby": 1}}
    records = isorun.sweep(spec, out=tmp_path / "standby")
    assert [r["outcome"] for r in records] == ["success"] * 4
    # Each interpreter imported it itself, before its call: none imported it during the call.
    assert all(r["result"]["ahead"] and r["result"]["imported_in"] == r["result"]["pid"] for r in records)
    spec["resources"] = {"cpu_slots": 1, "standby": 0}
    records = isorun.sweep(spec, out=tmp_path / "no-standby")
    assert not any(r["result"]["ahead"] for r in records)  # launched for its trial: imported in it


@pytest.mark.parametrize("standby", [0, 1])
def test_start_zygote_forks_every_trial_from_one_interpreter_that_imported_the_preloads(tmp_path, monkeypatch,
                                                                                       standby):
    (tmp_path / "marker.py").write_text("import os\n\nPID = os.getpid()\n")
    (tmp_path / "where.py").write_text(WHERE + "\n\ndef marked(i):\n    import marker\n"
                                       "    return {**where(i), 'marker_in': marker.PID}\n")
    monkeypatch.chdir(tmp_path)
    spec = {"python": "where:marked", "params": {"i": list(range(6))},
            "resources": {"cpu_slots": 2, "standby": standby, "start": "zygote", "preload": ["marker"]}}
    records = isorun.sweep(spec, out=tmp_path / "out")
    assert [r["outcome"] for r in records] == ["success"] * 6
    results = [r["result"] for r in records]
    # One zygote imported the preloads; every trial is a process of its own forked from it, which
    # imports the trial's own module itself (its import-time code runs where the trial runs).
    zygotes = {r["marker_in"] for r in results}
    assert len(zygotes) == 1 and not zygotes & {r["pid"] for r in results}
    assert len({r["pid"] for r in results}) == 6
    assert all(r["imported_in"] == r["pid"] and not r["ahead"] for r in results)


@pytest.mark.parametrize("start", ["exec", "zygote"])
def test_what_the_trial_s_module_prints_at_import_goes_to_each_trial_s_log(tmp_path, monkeypatch, capfd, start):
    (tmp_path / "noisy.py").write_text("print('printed at import')\n\ndef f(i):\n    return {'i': i}\n")
    monkeypatch.chdir(tmp_path)
    spec = {"python": "noisy:f", "params": {"i": [1, 2, 3]},
            "resources": {"cpu_slots": 1, "standby": 1, "start": start}}
    records = isorun.sweep(spec, out=tmp_path / "out")
    assert [r["outcome"] for r in records] == ["success"] * 3
    # Imported ahead of each trial (or once, in the zygote), as each trial used to import it.
    for r in records:
        assert (tmp_path / "out" / "logs" / f"{r['id']}.out").read_text().count("printed at import") == 1
    seen = capfd.readouterr()
    assert "printed at import" not in seen.out + seen.err


def test_start_zygote_is_for_python_trials_and_takes_exec_or_zygote(tmp_path):
    with pytest.raises(isorun.UsageError, match="start is exec .* or zygote"):
        isorun.sweep({"python": "where:where", "params": {"i": [1]}, "resources": {"start": "fork"}},
                     out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_interrupting_a_sweep_whose_zygote_is_still_importing_stops_it(tmp_path):
    fifo = tmp_path / "importing"
    os.mkfifo(fifo)
    importing = os.open(fifo, os.O_RDWR)
    # The module's import never ends in a worker (the check that finds the function imports it
    # too, without isorun._worker).
    (tmp_path / "stuck.py").write_text(textwrap.dedent(f'''
        import os, sys, threading
        if "isorun._worker" in sys.modules:
            fd = os.open({str(fifo)!r}, os.O_WRONLY)
            os.write(fd, b"%d\\n" % os.getpid())
            threading.Event().wait()

        def f(i):
            return {{"i": i}}
    '''))
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import isorun
        isorun.sweep({{"python": {str(tmp_path / "stuck.py") + ":f"!r}, "params": {{"i": [1, 2]}},
                      "resources": {{"cpu_slots": 1, "start": "zygote"}}, "out": {str(tmp_path / "out")!r}}})
    ''')], stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    with os.fdopen(importing) as reader:
        zygote = int(reader.readline())  # the zygote is importing the module
        caller.send_signal(signal.SIGINT)
        _, err = caller.communicate()
    assert caller.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err
    journal = tmp_path / "out" / "results.jsonl"
    assert not journal.exists() or journal.read_text() == ""
    assert not os.path.exists(f"/proc/{zygote}") or open(f"/proc/{zygote}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_what_a_function_raises_or_returns_wrong_is_the_trial_s_task_error(trials, tmp_path):
    records = isorun.sweep({"python": f"{trials}:fails", "params": {"kind": ["raise", "list", "nan"]},
                            "out": str(tmp_path / "out")})
    by_kind = {r["params"]["kind"]: r for r in records}
    assert by_kind["raise"]["outcome"] == "task_error"
    assert by_kind["raise"]["error"] == "task_error: ValueError: no good"
    assert by_kind["list"]["outcome"] == "task_error"
    assert "TypeError: a sweep's function returns a dict of its results" in by_kind["list"]["error"]
    assert by_kind["nan"]["outcome"] == "success" and by_kind["nan"]["result"] == {"loss": None}
    # The traceback is in the trial's log.
    err = (tmp_path / "out" / "logs" / f"{by_kind['raise']['id']}.err").read_text()
    assert 'raise ValueError("no good")' in err


def test_a_spec_isorun_refuses_is_a_usage_error_and_starts_nothing(trials, tmp_path, capsys):
    out = tmp_path / "out"
    # Said once, in the exception, of "spec" (not of the file written for the command, nor its lines).
    with pytest.raises(isorun.UsageError, match="^spec: unknown key 'bogus'"):
        isorun.sweep({"python": f"{trials}:train", "params": {"lr": [1]}, "bogus": 1, "out": str(out)})
    assert "bogus" not in capsys.readouterr().err
    with pytest.raises(isorun.UsageError, match="no_such_module:train is not found .*No module named 'no_such_module'"):
        isorun.sweep({"python": "no_such_module:train", "params": {"lr": [1]}, "out": str(out)})
    with pytest.raises(isorun.UsageError, match="not a lambda"):
        isorun.sweep({"python": lambda lr: {"x": lr}, "params": {"lr": [1]}, "out": str(out)})
    assert not out.exists()


def two(x, y=1):
    return {"loss": x * y}


def test_parameters_the_function_cannot_take_are_refused_before_any_trial_runs(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(isorun.UsageError, match=r"parameter 'z' is not a parameter of two\(x, y=1\)"):
        isorun.sweep({"python": two, "params": {"x": [1], "z": [1]}, "out": str(out)})
    with pytest.raises(isorun.UsageError, match="'w', 'z' are not parameters"):  # zip's, random's too
        isorun.sweep({"python": two, "params": {"x": [1]}, "zip": [{"w": [1, 2], "y": [3, 4]}],
                      "random": {"count": 2, "params": {"z": {"uniform": [0, 1]}}}, "out": str(out)})
    with pytest.raises(isorun.UsageError, match=r"two\(x, y=1\) has no default for 'x'"):
        isorun.sweep({"python": two, "params": {"y": [1]}, "out": str(out)})
    assert not out.exists()


def sweep_command(spec, cwd) -> subprocess.CompletedProcess:
    """``isorun sweep SPEC`` as a user runs it, its trials in this interpreter (an installed
    package's, whatever python3 is on PATH)."""
    program = os.path.join(os.path.dirname(isorun.__file__), "bin", "isorun")
    return subprocess.run([program, "sweep", str(spec), "--no-progress"], capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, ISORUN_PYTHON=sys.executable))


def test_a_spec_file_s_parameter_the_function_cannot_take_is_refused_at_its_line(trials, tmp_path):
    # The command line checks as isorun.sweep does: a module named as module:function, too.
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"python: trials:train\nparams:\n  lr: [1]\n  batch: [2]\nout: {tmp_path / 'out'}\n")
    p = sweep_command(spec, trials.parent)
    assert p.returncode == 2
    assert f"isorun: error: {spec}: line 4: python: the sweep's parameter 'batch' is not a parameter of train(" \
        in p.stderr, p.stderr
    assert not (tmp_path / "out").exists() and calls(trials) == []


CHECKED = textwrap.dedent('''
    import atexit, functools, sys
    print("printed at import")
    atexit.register(lambda: print("printed at exit", file=sys.stderr) or print("and on stdout"))

    def with_device(fn):
        @functools.wraps(fn)
        def wrapper(**kw):
            return fn(device="cpu", **kw)
        return wrapper

    @with_device
    def decorated(lr, device):
        return {"loss": lr}

    class Big:
        def __repr__(self):
            return "Big(\\n  1)"

    def big_default(lr, w=Big()):
        return {"loss": lr}

    def by_position(lr, /, b=1):
        return {"loss": lr}

    class Model:
        def fit(self, lr):
            return {"loss": lr}
''')


@pytest.mark.parametrize("spec, line, said", [
    # The wrapper the trial calls takes lr; what it wraps also needs device, which it gives.
    ("python: checked:decorated\nparams:\n  lr: [1]\n", None, None),
    # Said whole on one line, whatever the module prints at exit after the check.
    ("python: checked:big_default\nparams:\n  lr: [1]\n  lx: [2]\n", 4,
     "the sweep's parameter 'lx' is not a parameter of big_default(lr, w=Big( 1)): rename it in the spec"),
    ("python: checked:by_position\nparams:\n  lr: [1]\n", 3,
     "by_position(lr, /, b=1) takes 'lr' by position only (before '/'), and a trial passes its parameters as "
     "keyword arguments"),
    ("python: checked:Model.fit\nparams:\n  lr: [1]\n", 1, "Model.fit(self, lr) is a method of a class"),
    ("python: checked:big_default\nmetric: {name: loss, goal: minimize}\nsearch:\n  type: command\n"
     "  command: [python3, searcher.py]\n  trials: 1\n  params:\n    - lr\n    - zz\n", 9,
     "the sweep's parameter 'zz' is not a parameter"),
])
def test_what_the_check_of_a_function_s_parameters_says_and_where(tmp_path, spec, line, said):
    (tmp_path / "checked.py").write_text(CHECKED)
    (tmp_path / "spec.yaml").write_text(spec + "out: out\n")
    p = sweep_command("spec.yaml", tmp_path)
    if said is None:
        assert p.returncode == 0, p.stderr
        return
    assert p.returncode == 2 and f"isorun: error: spec.yaml: line {line}: python: {said}" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_searcher_that_fails_is_an_error_naming_it(trials, tmp_path):
    # The command exits 1 for it, as for failed trials: its failure record tells them apart.
    out = tmp_path / "out"
    searcher = [sys.executable, "-c", "import sys; sys.exit(5)"]
    with pytest.raises(isorun.Error, match=r"the searcher \(.*\) exited \(status 5\).*search\.err") as raised:
        isorun.sweep({"python": f"{trials}:train", "params": {"hidden": 8},
                      "metric": {"name": "loss", "goal": "minimize"},
                      "search": {"type": "command", "command": searcher, "params": ["lr"], "trials": 2},
                      "out": str(out)})
    assert not isinstance(raised.value, isorun.UsageError)
    assert "exit code" not in str(raised.value)  # the record's message, not the last lines scraped


FAKE_CUDA_DIR = os.environ.get("ISORUN_TEST_FAKE_CUDA_DIR", "")


@pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")),
                    reason="the stand-in libcuda.so.1 (ISORUN_TEST_FAKE_CUDA_DIR) is not built")
def test_a_python_trial_on_a_gpu_is_capped_and_its_framework_s_oom_is_out_of_memory(trials, tmp_path, monkeypatch):
    # The simulated GPU of conftest, and the stand-in driver the trials' interpreters load.
    monkeypatch.setenv("LD_LIBRARY_PATH", FAKE_CUDA_DIR)
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
    records = isorun.sweep({"python": f"{trials}:allocate", "params": {"block_mib": [256, 512]},
                            "resources": {"gpus": [0], "mem_limit": "1G", "per_gpu": 1},
                            "out": str(tmp_path / "out")})
    by_block = {r["params"]["block_mib"]: r for r in records}
    counted = by_block[256]
    assert counted["outcome"] == "success", counted.get("error")
    assert counted["result"]["rc"] == 2 and 1 <= counted["result"]["blocks"] <= 4  # 1 GiB, less the context
    oom = by_block[512]
    assert oom["outcome"] == "out_of_memory"
    assert "reached its mem_limit of 1.00 GiB" in oom["error"] and "MemoryError" in oom["error"]


@pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")),
                    reason="the stand-in libcuda.so.1 (ISORUN_TEST_FAKE_CUDA_DIR) is not built")
def test_a_python_trial_s_children_with_a_clean_environment_share_its_cap(trials, tmp_path, monkeypatch):
    # The trial's region is pinned before its function runs, so children it starts with an
    # environment of their own share its 256 MiB (four 64 MiB blocks among them, not each).
    monkeypatch.setenv("LD_LIBRARY_PATH", FAKE_CUDA_DIR)
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
    records = isorun.sweep({"python": f"{trials}:children", "params": {"count": [3]},
                            "resources": {"gpus": [0], "mem_limit": "256M", "per_gpu": 1},
                            "out": str(tmp_path / "out")})
    (record,) = records
    assert record["outcome"] == "success", record.get("error")
    assert record["result"]["least"] >= 0 and record["result"]["blocks"] <= 4, record["result"]


def test_a_misspelled_function_is_refused_before_any_trial_runs(trials, tmp_path):
    with pytest.raises(isorun.UsageError, match="has no attribute 'trian'"):
        isorun.sweep({"python": f"{trials}:trian", "params": {"lr": [1]}, "out": str(tmp_path / "out")})
    assert not (tmp_path / "out").exists()
    assert calls(trials) == []


def test_a_script_that_sweeps_its_own_function_without_a_main_guard_is_told_so(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f'''
        import isorun

        def train(lr):
            return {{"loss": lr}}

        isorun.sweep({{"python": train, "params": {{"lr": [1, 2]}}, "out": {str(tmp_path / "out")!r}}})
    '''))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 1
    assert "UsageError" in p.stderr and "if __name__ == '__main__'" in p.stderr
    assert not (tmp_path / "out").exists()


def test_a_script_s_function_under_its_main_guard_is_refused_naming_the_guard(tmp_path):
    # Its trials import the script, where the guarded block does not run.
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent(f'''
        import isorun

        if __name__ == "__main__":
            def train(lr):
                return {{"loss": lr}}

            isorun.sweep({{"python": train, "params": {{"lr": [1, 2]}}, "out": {str(tmp_path / "out")!r}}})
    '''))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 1
    assert "train() is defined under 'if __name__ == \"__main__\":'" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_interrupting_the_calling_process_alone_stops_the_sweep(tmp_path):
    # As Jupyter interrupts a kernel: SIGINT to the Python process, not to its process group.
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    started = os.open(fifo, os.O_RDWR)  # a reader from now on: the trials' opens do not block
    (tmp_path / "blocking.py").write_text(textwrap.dedent(f'''
        import os, threading

        def wait(i):
            fd = os.open({str(fifo)!r}, os.O_WRONLY)
            os.write(fd, b"%d\\n" % os.getpid())
            threading.Event().wait()
    '''))
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import isorun
        isorun.sweep({{"python": {str(tmp_path / "blocking.py") + ":wait"!r}, "params": {{"i": [1, 2, 3, 4, 5, 6]}},
                      "resources": {{"cpu_slots": 2, "standby": 0}}, "out": {str(tmp_path / "out")!r}}})
    ''')], stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    with os.fdopen(started) as reader:
        workers = [int(reader.readline()), int(reader.readline())]  # two trials run
        caller.send_signal(signal.SIGINT)
        _, err = caller.communicate()
    assert caller.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err  # Python's way to end by it
    journal = tmp_path / "out" / "results.jsonl"
    assert not journal.exists() or journal.read_text() == ""  # stopped trials are not journaled
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("clean", [False, True])
def test_a_python_trial_reports_and_asha_prunes_it(trials, tmp_path, clean):
    spec = {"python": f"{trials}:curve", "metric": {"name": "loss", "goal": "minimize"},
            "scheduler": {"type": "asha", "max_t": 27, "grace_period": 1, "reduction_factor": 3},
            "params": {"x": [0, 0.3, 0.6, 0.8], "y": [0.2, 0.6, 1.0], "clean": [clean]},
            "resources": {"cpu_slots": 2}, "out": str(tmp_path / "out")}
    records = isorun.sweep(spec)  # (a stop's grace: 5 s, for a clean stop)
    assert len(records) == 12
    pruned = [r for r in records if r["outcome"] == "pruned"]
    # (a decision that reached a trial late, on a busy machine, finds it at its last step)
    assert pruned and any(r["step"] < 27 for r in pruned)
    best = min((r for r in records if r["outcome"] == "success"), key=lambda r: r["result"]["loss"])
    assert (best["params"]["x"], best["params"]["y"]) == (0.3, 0.6)
    started = [c for c in calls(trials) if not c.startswith("stopped")]
    # Asked, each pruned function saw should_stop() and returned within the grace (one that
    # reached its last step before the stop came did not need to).
    stopped_early = [r for r in pruned if r["step"] < 27]
    assert len(calls(trials)) - len(started) == (len(stopped_early) if clean else 0)
    assert len(started) == 12
    isorun.sweep(spec)
    assert len([c for c in calls(trials) if not c.startswith("stopped")]) == 12  # nothing reruns


def test_report_and_should_stop_outside_a_sweep(capfd):
    isorun.report(step=2, loss=float("nan"), acc=0.5)
    assert json.loads(capfd.readouterr().out) == {"step": 2, "loss": None, "acc": 0.5}
    assert isorun.should_stop() is False
    with pytest.raises(TypeError):
        isorun.report(step="3", loss=1.0)


def test_on_record_sees_every_record_as_journaled_and_progress_shows_the_trials(trials, tmp_path, monkeypatch,
                                                                               capfd):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # isorun's own line
    seen = []
    spec = {"python": f"{trials}:train", "params": {"lr": [0.1, 0.01], "hidden": [16, 64]},
            "resources": {"cpu_slots": 2}, "out": str(tmp_path / "out")}
    records = isorun.sweep(spec, progress=True, on_record=seen.append)
    journal = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert seen == journal == list(records) and len(seen) == 4  # every record, in journal order
    err = capfd.readouterr().err
    assert "isorun: 4/4 trials, 0 failed, " in err
    # Resumed: the journaled records come again, and the bar starts where the sweep is.
    again = []
    isorun.sweep(spec, progress=True, on_record=again.append)
    assert again == journal and len(calls(trials)) == 4
    assert capfd.readouterr().err.count("isorun: 4/4 trials") == 1


GATE = textwrap.dedent('''
    import os

    def gate(i, fifo):
        # Trial 1 waits until the test writes to the FIFO: it ends only after the test has
        # received trial 0's record.
        if i == 1:
            with open(fifo) as f:
                return {"released": f.readline().strip() == "go", "pid": os.getpid()}
        return {"released": False, "pid": os.getpid()}
''')


def test_sweep_iter_yields_records_while_the_sweep_runs(tmp_path):
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    (tmp_path / "gated.py").write_text(GATE)
    spec = {"python": f"{tmp_path / 'gated.py'}:gate", "params": {"i": [0, 1], "fifo": [str(fifo)]},
            "resources": {"cpu_slots": 2, "standby": 0}, "out": str(tmp_path / "out")}
    stream = isorun.sweep_iter(spec)
    first = next(stream)
    assert first["params"]["i"] == 0 and first["outcome"] == "success"
    # Trial 1 is still running (waiting for this write): the record came while the sweep ran.
    with open(fifo, "w") as f:
        f.write("go\n")
    rest = list(stream)
    assert [r["params"]["i"] for r in rest] == [1]
    assert rest[0]["outcome"] == "success" and rest[0]["result"]["released"] is True


def test_serve_shows_the_live_report_while_the_sweep_runs(tmp_path, capsys):
    import re
    import urllib.error
    import urllib.request

    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    (tmp_path / "gated.py").write_text(GATE)
    spec = {"python": f"{tmp_path / 'gated.py'}:gate", "params": {"i": [0, 1], "fifo": [str(fifo)]},
            "resources": {"cpu_slots": 2, "standby": 0}, "out": str(tmp_path / "out")}
    with pytest.raises(isorun.UsageError, match="serve takes True"):
        isorun.sweep(spec, serve="yes")
    stream = isorun.sweep_iter(spec, serve=True)
    try:
        assert next(stream)["params"]["i"] == 0  # trial 1 waits at the gate: the sweep runs
        url = re.search(r"isorun: the report, live: (\S+)", capsys.readouterr().err).group(1)
        with urllib.request.urlopen(url) as page:
            assert page.status == 200 and "gated.py:gate" in page.read().decode()
        with open(fifo, "w") as f:
            f.write("go\n")
        assert [r["params"]["i"] for r in stream] == [1]
    finally:
        stream.close()
    with pytest.raises(urllib.error.URLError):  # gone with the sweep
        urllib.request.urlopen(url)


def test_leaving_sweep_iter_early_stops_the_sweep(tmp_path):
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    (tmp_path / "gated.py").write_text(GATE)
    spec = {"python": f"{tmp_path / 'gated.py'}:gate", "params": {"i": [0, 1], "fifo": [str(fifo)]},
            "resources": {"cpu_slots": 2, "standby": 0}, "out": str(tmp_path / "out")}
    for record in isorun.sweep_iter(spec):
        assert record["params"]["i"] == 0
        break  # trial 1 still waits: the sweep is stopped, and waited for
    journal = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["params"]["i"] for line in journal] == [0]  # the stopped trial is not journaled
    # Stopped, not left waiting: a writer now finds no reader (ENXIO) rather than a trial.
    with pytest.raises(OSError):
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)


def test_an_on_record_that_raises_stops_the_sweep(tmp_path):
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    (tmp_path / "gated.py").write_text(GATE)
    spec = {"python": f"{tmp_path / 'gated.py'}:gate", "params": {"i": [0, 1], "fifo": [str(fifo)]},
            "resources": {"cpu_slots": 2, "standby": 0}, "out": str(tmp_path / "out")}

    def refuse(record):
        raise LookupError(f"no thanks: {record['params']['i']}")

    with pytest.raises(LookupError, match="no thanks: 0"):
        isorun.sweep(spec, on_record=refuse)
    with pytest.raises(OSError):
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # trial 1 is not waiting any more
    with pytest.raises(isorun.UsageError, match="on_record"):
        isorun.sweep(spec, on_record="print")
    with pytest.raises(isorun.UsageError, match="progress"):
        isorun.sweep_iter(spec, progress=None)
