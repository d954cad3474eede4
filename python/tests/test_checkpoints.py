"""Python trials that keep their progress: ``isorun.checkpoint(step)``, ``isorun.latest_checkpoint()``
and ``isorun.should_checkpoint()`` in a sweep with ``checkpoints:`` (docs/sweeps.md#checkpoints)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

import isorun

TRIALS = textwrap.dedent('''
    import json
    import os
    import signal

    import isorun

    STEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "steps")

    def train(i, steps, crash_at, wait_warned=False):
        """Resumes from its latest checkpoint, logs each step it does, saves every 10 steps; the
        first time a trial reaches crash_at it kills itself. With wait_warned it asks
        should_checkpoint() and, after its first checkpoint, waits for the warning, then saves
        the step it reached + 1 and returns."""
        latest = isorun.latest_checkpoint()
        step = json.loads((latest.path / "state.json").read_text())["step"] if latest else 0
        if wait_warned:
            isorun.should_checkpoint()  # from now on the warning is ours to handle
        while step < steps:
            step += 1
            with open(STEPS, "a") as f:
                f.write(f"{i} {step} {os.getpid()}\\n")
            isorun.report(step=step, loss=1.0 / step)
            marker = f"{STEPS}.crashed.{i}"
            if step == crash_at and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            if step % 10 == 0:
                with isorun.checkpoint(step) as folder:
                    (folder / "state.json").write_text(json.dumps({"step": step}))
                if wait_warned:
                    while not isorun.should_checkpoint():
                        signal.pause()
                    with isorun.checkpoint(step + 1) as folder:
                        (folder / "state.json").write_text(json.dumps({"step": step, "warned": True}))
                    return {"steps": step, "warned": True}
        return {"steps": step}
''')


@pytest.fixture
def trials(tmp_path):
    path = tmp_path / "trials.py"
    path.write_text(TRIALS)
    return path


def steps_done(trials) -> dict[int, list[int]]:
    done: dict[int, list[int]] = {}
    path = trials.parent / "steps"
    for line in path.read_text().splitlines() if path.exists() else []:
        i, step, _ = line.split()
        done.setdefault(int(i), []).append(int(step))
    return done


@pytest.mark.parametrize("standby", [0, 1])
def test_a_crash_retry_resumes_from_the_trial_s_checkpoint(trials, tmp_path, standby):
    spec = {
        "python": f"{trials}:train",
        "params": {"i": [0, 1], "steps": [35], "crash_at": [23]},
        "resources": {"cpu_slots": 2, "standby": standby},
        "policy": {"retries": {"crashed": 1}},
        "checkpoints": {"keep": 2},
        "out": str(tmp_path / "out"),
    }
    records = isorun.sweep(spec)
    assert [r["outcome"] for r in records] == ["success", "success"]
    for r in records:
        assert r["result"] == {"steps": 35}
        assert r["attempts"] == 2
        assert r["checkpoint"] == 30
        assert r["resumes"] == [{"run": 1, "attempt": 2, "from": 20, "redone": 3}]
    expected = list(range(1, 24)) + list(range(21, 36))  # 21-23 done again, after the crash at 23
    assert steps_done(trials) == {0: expected, 1: expected}
    # The latest two are kept, nothing staged is left behind.
    for r in records:
        kept = sorted(p.name for p in (tmp_path / "out" / "checkpoints" / r["id"]).iterdir())
        assert kept == ["resumes.jsonl", "step-000000000020", "step-000000000030", "tmp"]
    # Each commit is an event for the trackers, with the attempt that made it.
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    for r in records:
        committed = [(e["attempt"], e["step"]) for e in events if e["trial"] == r["id"] and e["event"] == "checkpoint"]
        assert committed == [(1, 10), (1, 20), (2, 30)]


def test_a_timeout_warns_the_function_which_saves_before_it_is_stopped(trials, tmp_path):
    spec = {
        "python": f"{trials}:train",
        "params": {"i": [0], "steps": [100], "crash_at": [-1], "wait_warned": [True]},
        "policy": {"timeout": "2s"},
        "checkpoints": True,
        "out": str(tmp_path / "out"),
    }
    records = isorun.sweep(spec)
    (r,) = records
    # It returned within the grace period, after the warning; the timeout still stands.
    assert r["outcome"] == "timeout"
    assert r["checkpoint"] == 11
    state = tmp_path / "out" / "checkpoints" / r["id"] / "step-000000000011" / "state.json"
    assert json.loads(state.read_text()) == {"step": 10, "warned": True}


def test_outside_a_sweep_there_is_no_checkpoint_and_saving_one_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv("ISORUN_CHECKPOINT_DIR", raising=False)
    assert isorun.latest_checkpoint() is None
    assert isorun.should_checkpoint() is False
    with pytest.raises(RuntimeError, match="checkpoints"):
        with isorun.checkpoint(1):
            pass


def test_a_step_that_goes_back_is_refused_and_a_failed_block_commits_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("ISORUN_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("ISORUN_CHECKPOINT_KEEP", "2")
    with isorun.checkpoint(5) as folder:
        (folder / "x").write_text("5")
    with pytest.raises(ValueError, match="checkpoint step 3 is not after the latest committed one, 5"):
        with isorun.checkpoint(3):
            pass
    with pytest.raises(OSError):
        with isorun.checkpoint(7) as folder:
            raise OSError("disk full")
    latest = isorun.latest_checkpoint()
    assert latest is not None and latest.step == 5 and (latest.path / "x").read_text() == "5"
    assert sorted(os.listdir(tmp_path)) == ["step-000000000005"]  # nothing half written is left
    with pytest.raises(TypeError):
        with isorun.checkpoint("6"):  # type: ignore[arg-type]
            pass


def test_only_folders_the_supervisor_lists_are_checkpoints(monkeypatch, tmp_path):
    # The supervisor reads step-N with N in ASCII digits, at most 2**63 - 1 (checkpoint.cpp).
    monkeypatch.setenv("ISORUN_CHECKPOINT_DIR", str(tmp_path))
    for name in ("step-²", "step-٣٣", "step-9223372036854775808", "step-", "step-5"):
        (tmp_path / name).mkdir()
    latest = isorun.latest_checkpoint()
    assert latest is not None and latest.step == 5 and latest.path == tmp_path / "step-5"
    (tmp_path / "step-9223372036854775807").mkdir()
    latest = isorun.latest_checkpoint()
    assert latest is not None and latest.step == 2**63 - 1
    with pytest.raises(ValueError, match=f"checkpoint step {2**63} is larger than the largest step"):
        with isorun.checkpoint(2**63):
            pass
