"""isorun.joblib: a joblib backend that runs each batch in a fresh isolated interpreter."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

joblib = pytest.importorskip("joblib")

import isorun  # noqa: E402


def pid_and_parent(i):
    return i, os.getpid(), os.getppid()


@pytest.mark.parametrize("config", ["parallel_backend", "parallel_config"])
def test_batches_run_in_fresh_interpreters_of_other_processes(config):
    import isorun.joblib  # noqa: F401 - registers "isorun"

    context = (joblib.parallel_backend("isorun", n_jobs=2, timeout="1m") if config == "parallel_backend"
               else joblib.parallel_config(backend="isorun", n_jobs=2, timeout="1m"))
    with context:
        out = joblib.Parallel()(joblib.delayed(pid_and_parent)(i) for i in range(4))
    assert [i for i, _, _ in out] == [0, 1, 2, 3]
    pids = {pid for _, pid, _ in out}
    assert os.getpid() not in pids
    assert len(pids) == 4  # a batch of one each at first: each in a fresh interpreter
    # Workers are this process's children (exec'd, or forked from its zygote), no pool of another process.
    assert {ppid for _, _, ppid in out} == {os.getpid()}


def test_grid_search_gives_the_default_backend_s_results():
    pytest.importorskip("sklearn")
    import isorun.joblib  # noqa: F401
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    X, y = load_iris(return_X_y=True)

    def search(n_jobs):
        return GridSearchCV(LogisticRegression(max_iter=500), {"C": [0.01, 1.0]}, cv=2, n_jobs=n_jobs).fit(X, y)

    default = search(None)  # joblib's default backend, in this process
    with joblib.parallel_backend("isorun", n_jobs=2, timeout="2m"):
        isolated = search(2)
    assert isolated.best_params_ == default.best_params_
    assert list(isolated.cv_results_["mean_test_score"]) == list(default.cv_results_["mean_test_score"])


LOKY_SCORES = """
import json, joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
X, y = load_iris(return_X_y=True)
with joblib.parallel_backend("loky", n_jobs=2):
    print(json.dumps(list(cross_val_score(LogisticRegression(max_iter=500), X, y, cv=3, n_jobs=2))))
"""


def test_cross_val_score_equals_loky_s_and_batches_preload_the_search_s_modules():
    pytest.importorskip("sklearn")
    import json
    import subprocess

    import isorun.joblib  # noqa: F401
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    # loky in a program of its own: its workers and helpers outlive its executor's shutdown.
    loky = json.loads(subprocess.run([sys.executable, "-c", LOKY_SCORES], capture_output=True, text=True,
                                     check=True).stdout)
    X, y = load_iris(return_X_y=True)
    isorun.stop_standby()
    with joblib.parallel_backend("isorun", n_jobs=2):
        isolated = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=3, n_jobs=2)
    assert list(isolated) == loky
    # The default's workers (forked from a zygote) import joblib's module, scikit-learn's
    # function and the estimator's module while they wait, not on each batch's path.
    (pool,) = [p for p in isorun.pool_stats() if "joblib.parallel" in p.preload]
    assert "sklearn.model_selection._validation" in pool.preload
    assert "sklearn.linear_model._logistic" in pool.preload
    assert pool.start == "zygote" and pool.adaptive


def fail_on(i):
    if i == 1:
        raise KeyError("batch 1")
    return i


def test_what_a_batch_raises_is_raised():
    import isorun.joblib  # noqa: F401

    with joblib.parallel_backend("isorun", n_jobs=2), pytest.raises(KeyError, match="batch 1"):
        joblib.Parallel()(joblib.delayed(fail_on)(i) for i in range(3))


def test_bad_options_are_a_usage_error():
    import isorun.joblib  # noqa: F401

    with pytest.raises(isorun.UsageError, match="cpu_slots"):
        with joblib.parallel_backend("isorun", n_jobs=2, cpu_slots=3):
            pass
    with pytest.raises(isorun.UsageError, match="mem_limit"):
        with joblib.parallel_backend("isorun", n_jobs=2, mem_limit="1G"):  # a GPU cap without GPUs
            pass


def test_without_joblib_the_import_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "joblib", None)
    monkeypatch.delitem(sys.modules, "isorun.joblib", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'isorun\[joblib\]'"):
        importlib.import_module("isorun.joblib")


def marked(_):
    return os.environ.get("ISORUN_TEST_MARK"), os.environ.get("OMP_NUM_THREADS")


def test_the_backend_s_options_reach_the_workers():
    import isorun.joblib  # noqa: F401

    with joblib.parallel_backend("isorun", n_jobs=2, env={"ISORUN_TEST_MARK": "batch"}, cpus_per_call=2):
        out = joblib.Parallel()(joblib.delayed(marked)(i) for i in range(2))
    assert out == [("batch", "2")] * 2


def square_with_pid(i):
    return i * i, os.getpid()


def nested_sum(i):
    # A joblib call inside a batch: it runs in the batch's own process, its results as loky's.
    inner = joblib.Parallel(n_jobs=2)(joblib.delayed(square_with_pid)(i + k) for k in range(3))
    return sum(v for v, _ in inner), {pid for _, pid in inner} == {os.getpid()}


@pytest.mark.parametrize("return_as", ["list", "generator", "generator_unordered"])
def test_n_jobs_pre_dispatch_and_return_as_behave_as_with_loky(return_as):
    import isorun.joblib  # noqa: F401

    with joblib.parallel_backend("isorun"):
        parallel = joblib.Parallel(n_jobs=-1, pre_dispatch="n_jobs", return_as=return_as)
        out = parallel(joblib.delayed(square_with_pid)(i) for i in range(12))
        if return_as != "list":
            assert not isinstance(out, list)  # results as they come, not a list built first
        values = [v for v, _ in out]
        assert joblib.effective_n_jobs(-1) == (os.cpu_count() or 1)  # one slot per core
    expected = [i * i for i in range(12)]
    assert (sorted(values) if return_as == "generator_unordered" else values) == expected


def test_a_nested_parallel_runs_inside_its_batch_s_process():
    import isorun.joblib  # noqa: F401

    with joblib.parallel_backend("isorun", n_jobs=2):
        out = joblib.Parallel()(joblib.delayed(nested_sum)(i) for i in range(4))
    assert out == [(sum((i + k) ** 2 for k in range(3)), True) for i in range(4)]
