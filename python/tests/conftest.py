"""Shared checks for the isorun Python tests: every test leaves no worker process behind."""

from __future__ import annotations

import os
import signal

import pytest

# The GPU inventory is read once per process, at the first call: the simulated one the C++ tests
# use (no GPU needed), unless the environment names another.
os.environ.setdefault("ISORUN_SIMULATE_GPUS", "1x16G")

# Ctrl-C as at a terminal, in this process and the programs the tests start (a handled signal is
# the default again after exec), whatever the suite's parent did: a shell's background job starts
# it with SIGINT ignored, Python then keeps it so, and the tests that stop a call or a caller with
# SIGINT would wait for ever.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _children() -> set[int]:
    """The pids of this process's live children (workers are its children: exec'd, never
    forked). A zombie has ended: reaping it is the runner's business, not a process left running."""
    me = os.getpid()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state not in ("Z", "X"):
            out.add(int(entry))
    return out


@pytest.fixture(autouse=True)
def no_worker_left_behind():
    """After each test, no worker of it is still running (standby ones stopped first)."""
    before = _children()
    yield
    import isorun
    from isorun import _api

    _api._wait_all()  # a cancelled call's worker may still be stopping
    isorun.stop_standby()
    _api._wait_early_exits()  # and one that handed its result over early, exiting
    left = _children() - before
    assert not left, f"processes left behind: {sorted(left)}"
