"""Bad input is refused with isorun.UsageError naming the option or the argument, before anything
starts; a large call warns once, naming what made it large."""

from __future__ import annotations

import io
import socket
import threading
import warnings

import pytest

import isorun


def touch(path, *args, **kwargs):
    open(path, "w").close()


@pytest.mark.parametrize("option", ["timeout", "grace"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1, 0, "0s"])
def test_timeout_and_grace_must_be_finite_and_positive(option, value):
    with pytest.raises(isorun.UsageError, match=option) as info:
        isorun.isolated(touch, **{option: value})
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("option, value, said", [("timeout", "10 minutes", "invalid duration"),
                                                  ("grace", "soon", "invalid duration"),
                                                  ("host_mem_limit", "lots", "invalid size")])
def test_a_size_or_duration_that_does_not_parse_is_refused_naming_its_option(option, value, said):
    with pytest.raises(isorun.UsageError, match=f"^{option}: {said} '{value}'"):
        isorun.isolated(touch, **{option: value})


@pytest.mark.parametrize("option", ["mem_limit", "host_mem_limit"])
@pytest.mark.parametrize("value", [0, "0", "0G"])
def test_a_cap_of_zero_is_refused_not_taken_as_no_cap(option, value):
    # As the command line's --mem-limit 0 and a spec's mem_limit: 0 are.
    with pytest.raises(isorun.UsageError, match=f"^{option} must be greater than zero.*None, for no cap"):
        isorun.isolated(touch, gpu=0, **{option: value})


def test_a_timeout_below_a_millisecond_is_not_none():
    f = isorun.isolated(touch, timeout=0.0001)
    assert f._options.timeout_ms == 1


def test_options_keeps_no_timeout_as_none():
    f = isorun.isolated(touch, grace=1).options(env={"A": "1"})
    assert f._options.timeout_ms == 0 and f._options.grace_ms == 1000


def test_isolated_shows_every_option_as_a_keyword_with_its_default():
    import inspect

    params = inspect.signature(isorun.isolated).parameters
    assert list(params)[0] == "fn"
    keywords = {name: p.default for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords["mem_limit"] is None and keywords["start"] == "auto" and keywords["echo_stderr"] is True
    # Each is accepted by isolated() and by options(), and nothing else is.
    for name in keywords:
        isorun.isolated(touch, **{name: keywords[name]}).options(**{name: keywords[name]})
    with pytest.raises(isorun.UsageError, match="unknown option 'colour'.*its options are: gpu, gpus"):
        isorun.isolated(touch, colour="red")
    with pytest.raises(isorun.UsageError, match=r"'n_jobs' \(n_jobs: use max_workers\)"):
        isorun.isolated(touch, n_jobs=2)


@pytest.mark.parametrize(("options", "says"), [
    ({"cpu": True, "gpu": 0}, "cpu=True excludes gpu"),
    ({"capture_output": True, "early_result": True}, "capture_output=True excludes early_result"),
    ({"start": "zygote", "warm_context": True}, "start='zygote' excludes warm_context"),
    ({"alloc_conf": None}, "alloc_conf takes"),
    ({"standby": -1}, "standby takes a number of workers"),
])
def test_options_that_cannot_work_together_or_at_all_are_refused(options, says):
    with pytest.raises(isorun.UsageError, match=says):
        isorun.isolated(touch, **options)


def test_options_gives_a_new_placement_as_a_whole():
    f = isorun.isolated(touch, gpus=[0], mem_limit="1G").options(cpu=True)
    assert not f._options.on_gpu and f._options.mem_limit == 1 << 30


@pytest.mark.parametrize("gpus", [3, "some", [0.5], [True], {0: 1}])
def test_gpus_takes_a_list_of_indices_or_all(gpus):
    with pytest.raises(isorun.UsageError, match="gpus"):
        isorun.isolated(touch, gpus=gpus)


def visible_devices():
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_gpus_all_runs_on_every_gpu():
    # conftest: one simulated GPU.
    assert isorun.isolated(visible_devices, gpus="all")() == "GPU-sim-0"


def _refused(tmp_path, *args, **kwargs):
    marker = tmp_path / "started"
    with pytest.raises(isorun.UsageError) as info:
        isorun.isolated(touch)(str(marker), *args, **kwargs)
    assert not marker.exists()  # refused before anything started
    return str(info.value)


def test_an_open_file_among_the_arguments_is_refused_naming_it(tmp_path):
    with open(tmp_path / "data.txt", "w+") as f:
        assert "argument 2 is an open file" in _refused(tmp_path, f)
        assert "cannot be pickled" not in _refused(tmp_path, f)
        assert "keyword argument 'log' is an open file" in _refused(tmp_path, log=f)
        assert "argument 2 is an open file" in _refused(tmp_path, [{"nested": f}])


def test_sockets_locks_and_generators_are_refused_naming_them(tmp_path):
    with socket.socket() as s:
        assert "argument 2 is a socket" in _refused(tmp_path, s)
    assert "keyword argument 'lock' is a lock" in _refused(tmp_path, lock=threading.Lock())
    assert "argument 3 is a lock" in _refused(tmp_path, 1, threading.RLock())
    assert "argument 2 is a generator" in _refused(tmp_path, (i for i in range(3)))


def test_an_open_file_the_function_captures_is_refused(tmp_path):
    with open(tmp_path / "log.txt", "w") as log:
        def write_log():
            log.write("x")

        with pytest.raises(isorun.UsageError, match="the function .* is an open file"):
            isorun.isolated(write_log)()


def test_in_memory_streams_still_travel():
    assert isorun.isolated(lambda b: b.getvalue())(io.BytesIO(b"abc")) == b"abc"


def length(text):
    return len(text)


def test_a_call_over_64_mib_of_plain_arguments_warns_naming_the_argument():
    # A module-level function given a string: the standard pickler's path, which warns as well.
    with pytest.warns(isorun.LargeCallWarning, match="its largest argument is argument 1"):
        assert isorun.isolated(length)("x" * ((64 << 20) + 1)) == (64 << 20) + 1


def test_a_call_over_64_mib_warns_once_naming_the_largest_global():
    # A function of __main__ (a script, a notebook) travels by value, with the globals it uses.
    ns = {"__name__": "__main__", "BIG_TABLE": b"\0" * ((64 << 20) + 1), "SMALL": 1}
    exec("def size_of_table():\n    return len(BIG_TABLE) + SMALL\n", ns)
    f = isorun.isolated(ns["size_of_table"])
    with pytest.warns(isorun.LargeCallWarning, match="global 'BIG_TABLE'") as record:
        assert f() == (64 << 20) + 2
    assert issubclass(isorun.LargeCallWarning, UserWarning)
    assert record[0].filename == __file__  # pointed at the caller's line
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        f()
    assert not [w for w in again if issubclass(w.category, isorun.LargeCallWarning)]


def test_a_gpu_that_does_not_exist_is_refused_with_the_python_way_out(monkeypatch, tmp_path):
    monkeypatch.setenv("ISORUN_SIMULATE_GPUS", "1x16G")
    with pytest.raises(isorun.UsageError, match=r"GPU 3 does not exist; available: 0\.\.0 .*cpu=True in Python"):
        isorun.isolated(touch, gpu=3)(str(tmp_path / "touched"))
    assert not (tmp_path / "touched").exists()
