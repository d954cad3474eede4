"""progress=True of isorun.map and isorun.Executor.map: a tqdm bar where tqdm is installed, else
isorun's own line on stderr."""

from __future__ import annotations

import sys

import pytest

import isorun
from isorun import _progress


def square(x):
    return x * x


def fails_on_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


@pytest.fixture(params=["tqdm", "own line"])
def bar(request, monkeypatch):
    """Each test twice: with tqdm (where installed), and as if it were not."""
    if request.param == "tqdm":
        pytest.importorskip("tqdm.auto")
    else:
        monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # `from tqdm.auto import tqdm` raises ImportError
        monkeypatch.setitem(sys.modules, "tqdm", None)
        assert _progress._tqdm() is None
    return request.param


def test_map_shows_progress_on_stderr(bar, capfd):
    results = isorun.map(fails_on_odd, range(4), cpu_slots=2, progress=True)
    assert [r.ok for r in results] == [True, False, True, False]
    err = capfd.readouterr().err
    assert "4/4" in err
    if bar == "own line":
        # stderr is not a terminal here: a line per tenth, not \r updates
        last = err.strip().splitlines()[-1]
        assert last.startswith("isorun: 4/4 calls, 2 failed, ") and last.endswith("/s")
        assert "\r" not in err
    else:
        assert "failed=2" in err


def test_map_without_progress_writes_none(capfd):
    assert [r.value for r in isorun.map(square, [1, 2])] == [1, 4]
    assert "isorun: 2/2" not in capfd.readouterr().err


def test_executor_map_shows_progress_and_keeps_its_order(bar, capfd):
    with isorun.Executor(cpu_slots=2) as ex:
        assert list(ex.map(square, range(5), progress=True)) == [0, 1, 4, 9, 16]
    err = capfd.readouterr().err
    assert "5/5" in err
    if bar == "own line":
        assert err.strip().splitlines()[-1].startswith("isorun: 5/5 calls, 0 failed, ")


def test_the_own_line_is_rewritten_in_place_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "_tqdm", lambda: None)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = _progress.Progress(3, "calls")
    for failed in (False, True, False):
        bar.advance(failed)
    err = capsys.readouterr().err
    assert err.count("\r") == 4 and err.endswith("\n")  # the start, three updates, a newline at the end
    assert "isorun: 3/3 calls, 1 failed, " in err.split("\r")[-1]


def test_a_log_gets_a_line_per_tenth(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "_tqdm", lambda: None)
    bar = _progress.Progress(100, "calls")
    for _ in range(100):
        bar.advance()
    lines = capsys.readouterr().err.splitlines()
    assert [l.split()[1] for l in lines] == [f"{n}/100" for n in range(0, 101, 10)]


def test_progress_takes_a_bool():
    with pytest.raises(isorun.UsageError, match="progress takes True or False"):
        isorun.map(square, [1], progress="yes")
    with isorun.Executor(cpu_slots=1) as ex, pytest.raises(isorun.UsageError, match="progress"):
        ex.map(square, [1], progress=1)
    with pytest.raises(isorun.UsageError, match="on_result"):
        isorun.map(square, [1], on_result=3)
