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


# B3: max_workers as concurrent.futures has it; an unknown keyword is a UsageError naming the valid ones.

def test_executor_takes_max_workers_by_keyword_and_by_position():
    for make in (lambda: isorun.Executor(max_workers=3), lambda: isorun.Executor(3)):
        with make() as ex:
            assert ex.plan.startswith("3 CPU slots"), ex.plan
            assert list(ex.map(abs, [-1, -2])) == [1, 2]


def test_executor_still_takes_its_gpus_first():
    with isorun.Executor("all", per_gpu=1) as ex:
        assert "GPU" in ex.plan
    with isorun.Executor([0], per_gpu=1) as ex:
        assert "GPU" in ex.plan


def test_map_takes_max_workers():
    assert [r.value for r in isorun.map(abs, [-1, -2, -3], max_workers=2)] == [1, 2, 3]
    assert [r.value for r in isorun.imap(abs, [-4], max_workers=1)] == [4]


@pytest.mark.parametrize("call", [
    lambda: isorun.Executor(n_jobs=4),
    lambda: isorun.map(abs, [1], n_jobs=4),
    lambda: isorun.isolated(abs, n_jobs=4),
    lambda: isorun.isolated(abs).options(n_jobs=4),
])
def test_an_unknown_keyword_is_a_usage_error(call):
    with pytest.raises(isorun.UsageError, match="n_jobs"):
        call()


def test_the_refusal_lists_the_valid_options():
    with pytest.raises(isorun.UsageError) as caught:
        isorun.map(abs, [1], n_jobs=4)
    assert "use max_workers" in str(caught.value)
    assert "cpu_slots" in str(caught.value) and "host_mem_limit" in str(caught.value)


def test_max_workers_conflicts_are_refused():
    with pytest.raises(isorun.UsageError, match="same"):
        isorun.Executor(max_workers=2, cpu_slots=2)
    with pytest.raises(isorun.UsageError, match="per_gpu"):
        isorun.Executor(max_workers=2, gpus="all")
    with pytest.raises(isorun.UsageError, match="max_workers"):
        isorun.Executor(max_workers=0)


# B5: the sweep's rank table goes through sys.stdout, after the records; quiet=True drops it.

def squared_distance(x):
    return {"loss": (x - 3) ** 2}


def _sweep_spec(out):
    return {"python": squared_distance, "params": {"x": [1, 3]}, "metric": {"name": "loss", "goal": "minimize"},
            "out": str(out)}


def test_the_sweep_table_goes_through_sys_stdout(tmp_path, capfd):
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        isorun.sweep(_sweep_spec(tmp_path / "a"))
    assert buffer.getvalue().startswith("rank") and "x=3" in buffer.getvalue()
    assert capfd.readouterr().out == ""  # nothing on fd 1 past sys.stdout


def test_quiet_sweeps_print_no_table(tmp_path, capfd):
    assert len(isorun.sweep(_sweep_spec(tmp_path / "a"), quiet=True)) == 2
    assert [r["outcome"] for r in isorun.sweep_iter(_sweep_spec(tmp_path / "b"), quiet=True)] == ["success"] * 2
    assert capfd.readouterr().out == ""
    with pytest.raises(isorun.UsageError, match="quiet"):
        isorun.sweep(_sweep_spec(tmp_path / "c"), quiet="yes")


def test_the_table_of_sweep_iter_comes_after_the_loops_output(tmp_path, capsys):
    for record in isorun.sweep_iter(_sweep_spec(tmp_path / "a")):
        print("got", record["params"]["x"])
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines[:2]) == ["got 1", "got 3"] and lines[2].startswith("rank"), lines


# What a result cannot be: refused with InvalidResult saying why, as arguments are.

def _open_file():
    return open(__file__)


def _a_lock():
    import threading

    return threading.Lock()


def test_a_returned_open_file_is_refused():
    with pytest.raises(isorun.InvalidResult, match="returned an open file"):
        isorun.isolated(_open_file)()


def test_an_unpicklable_result_is_an_invalid_result_naming_its_type():
    with pytest.raises(isorun.InvalidResult, match="lock"):
        isorun.isolated(_a_lock)()

    class Local:  # noqa: B903 - a class pickle cannot find; its __reduce__ fails
        def __reduce__(self):
            raise TypeError("not today")

    with pytest.raises(isorun.InvalidResult, match="Local.*not today"):
        isorun.isolated(lambda: Local())()


def _where(i):
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_map_on_a_gpu_without_a_cap_names_the_python_arguments():
    with pytest.raises(isorun.UsageError) as caught:
        isorun.map(isorun.isolated(_where, gpu=0), range(2))
    assert "mem_limit=" in str(caught.value) and "per_gpu" in str(caught.value)
    assert "--mem-limit" not in str(caught.value)
    assert [r.value for r in isorun.map(isorun.isolated(_where, gpu=0), range(2), per_gpu=1)] == ["GPU-sim-0"] * 2


# F4: a sweep's trials import the calling script as it would run with no arguments.

_ARGV_SCRIPT = """
    import argparse, sys
    import isorun

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, {how})
    args = parser.parse_args()

    def objective(x):
        return {{"loss": (x - 1) ** 2, "argv": len(sys.argv)}}

    if __name__ == "__main__":
        try:
            records = isorun.sweep({{"python": objective, "params": {{"x": list(range(args.n))}},
                                    "metric": {{"name": "loss", "goal": "minimize"}}, "out": "out"}}, quiet=True)
            print(sorted((r["params"]["x"], r["result"]["argv"]) for r in records))
        except isorun.UsageError as e:
            print("UsageError:", e)
"""


def test_a_sweep_script_that_parses_its_command_line_at_module_level_runs_its_trials(tmp_path):
    done = _run_script(tmp_path, _ARGV_SCRIPT.format(how="default=3"), "--n", "3")
    assert done.stdout.strip() == "[(0, 1), (1, 1), (2, 1)]", done.stderr  # each trial: argv is [its file]


def test_a_trial_module_that_fails_to_import_says_why(tmp_path):
    done = _run_script(tmp_path, _ARGV_SCRIPT.format(how="required=True"), "--n", "3")
    said = done.stdout
    assert said.startswith("UsageError:") and "fails to import in a trial" in said, (said, done.stderr)
    assert "the following arguments are required: --n" in said  # argparse's own words
    assert "raised SystemExit: 2" in said and 'under if __name__ == "__main__"' in said
    assert "is not found" not in said


# B4: a PBT population larger than the slots evolves (its members run in turns).

def test_a_pbt_population_larger_than_the_slots_makes_children(tmp_path):
    done = _run_script(tmp_path, """
        import json
        import isorun

        def train(x, steps=6):
            score, start = 0.0, 0
            ck = isorun.latest_checkpoint()
            if ck is not None:
                score, start = json.loads((ck.path / "s.json").read_text())["score"], ck.step
            for step in range(start + 1, steps + 1):
                score -= x  # each later member is worse
                with isorun.checkpoint(step) as d:
                    (d / "s.json").write_text(json.dumps({"score": score}))
                isorun.report(step=step, score=score)
            return {"score": score}

        if __name__ == "__main__":
            records = isorun.sweep({"python": train, "metric": {"name": "score", "goal": "maximize"}, "out": "out",
                                    "params": {"x": [1, 2, 3, 4, 5, 6]}, "resources": {"cpu_slots": 2},
                                    "checkpoints": {"keep": 2},
                                    "scheduler": {"type": "pbt", "interval": 2, "quantile": 0.25, "seed": 0,
                                                  "mutations": {"x": "perturb"}}}, quiet=True)
            members = [r for r in records if not r.get("origin")]
            print(len(members), sum(1 for r in records if r.get("origin")),
                  sum(r["outcome"] == "pruned" for r in members))
        """)
    members, children, pruned = map(int, done.stdout.split())
    # x=3 onwards start only as a slot frees; each, at step 2, is below x=1 (and x=2): replaced.
    assert members == 6 and children >= 3 and pruned >= 3, done.stderr
