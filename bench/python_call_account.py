"""Where a spaced Python standby call's time goes, step by step (issue: the Python standby call
≤ 1 ms): CLOCK_MONOTONIC stamps in the caller (around the public call, and at the private steps
it passes through) and in the worker (a preloaded probe, bench/python_tasks/call_account_probe.py),
for a module-level function on a standby interpreter with ``early_result``, calls spaced by
``--gap-ms``; each step's median beside the same caller step run back to back (hot caches).

    PYTHONPATH=build/python python3 bench/python_call_account.py [--calls 60] [--gap-ms 300]

It wraps private functions of isorun's Python package as they are now: a measuring tool, not an
API."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_tasks"))

import executor_tasks  # noqa: E402

import isorun  # noqa: E402
import isorun._api as api  # noqa: E402
import isorun._payload as payload  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--gap-ms", type=float, default=300.0)
    a = p.parse_args()
    log = tempfile.NamedTemporaryFile(prefix="isorun-account-", suffix=".jsonl", delete=False).name
    os.environ["ISORUN_ACCOUNT_LOG"] = log  # the standby interpreters inherit it
    stamps: dict[str, int] = {}
    start, finish = api._core.start, api._finish

    def start_stamped(*args):
        stamps["start"] = time.monotonic_ns()
        job = start(*args)
        stamps["started"] = time.monotonic_ns()
        return job

    def finish_stamped(job):
        stamps["finish"] = time.monotonic_ns()
        value = finish(job)
        stamps["finished"] = time.monotonic_ns()
        return value

    api._core.start, api._finish = start_stamped, finish_stamped
    f = isorun.isolated(executor_tasks.with_numpy, standby=2, preload=["numpy", "call_account_probe"],
                        early_result=True)
    f.warm_up()
    f()
    calls = []
    for _ in range(a.calls):
        time.sleep(a.gap_ms / 1e3)
        stamps.clear()
        t0 = time.monotonic_ns()
        f()
        calls.append((t0, dict(stamps), time.monotonic_ns()))
    isorun.stop_standby()
    with open(log) as lines:
        worker = [json.loads(line) for line in lines][-a.calls:]
    os.unlink(log)
    steps: dict[str, list[float]] = {}
    for (t0, c, t1), w in zip(calls, worker):
        for name, us in [
            ("caller: call to _core.start (encode_call, options)", c["start"] - t0),
            ("caller: _core.start (admission, take, request, assign)", c["started"] - c["start"]),
            ("to the worker's Python entry (wake, assignment, GIL)", w["entry"] - c["started"]),
            ("worker: entry to its first step", w["environ"] - w["entry"]),
            ("worker: os.environ brought up to date", w["environ_done"] - w["environ"]),
            ("worker: stdout check", w["stdout_done"] - w["environ_done"]),
            ("worker: request unpickled, sys.path", w["unpickle"] - w["stdout_done"]),
            ("worker: function unpickled", w["unpickle_done"] - w["unpickle"]),
            ("worker: the function, its result pickled", w["flush"] - w["unpickle_done"]),
            ("worker: output flushed", w["flush_done"] - w["flush"]),
            ("worker's entry returns -> the caller's result (done, wake; probe's write)",
             c["finish"] - w["entry_done"]),
            ("caller: result decoded, outcome", c["finished"] - c["finish"]),
            ("total", t1 - t0),
        ]:
            steps.setdefault(name, []).append(us / 1e3)
    print(f"{a.calls} calls {a.gap_ms:.0f} ms apart, µs: median [p10, p90]")
    for name, us in steps.items():
        q = statistics.quantiles(us, n=10)
        print(f"  {name:78s} {statistics.median(us):8.1f}  [{q[0]:7.1f}, {q[-1]:7.1f}]")
    # The same caller-side code with hot caches, and after the gap: what an idle wait costs.
    fn = executor_tasks.with_numpy
    for gap in (0.0, a.gap_ms / 1e3):
        ts = []
        for _ in range(min(a.calls, 40)):
            time.sleep(gap)
            t = time.monotonic_ns()
            payload.encode_call(fn, (), {})
            ts.append((time.monotonic_ns() - t) / 1e3)
        print(f"  encode_call alone, {gap * 1e3:.0f} ms after the last: {statistics.median(ts):.1f} µs")


if __name__ == "__main__":
    main()
