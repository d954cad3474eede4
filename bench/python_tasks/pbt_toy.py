"""The toy problem of the PBT paper (Jaderberg et al. 2017, section 4): maximize
Q(theta) = 1.2 - (theta0^2 + theta1^2) by gradient ascent on a surrogate
Q^(theta | h) = 1.2 - (h0 theta0^2 + h1 theta1^2), from theta = (0.9, 0.9). A member with
h = (1, 0) or (0, 1) alone shrinks one coordinate and stops at Q = 0.39; exploiting the other's
theta and exploring h gets both down. Each trial keeps theta in its checkpoints, reports Q each
step, and returns the Q it reached (for bench/bench_pbt.py and python/tests/test_pbt.py)."""

from __future__ import annotations

import json
import time

import isorun


def toy(h0: float, h1: float, steps: int = 40, lr: float = 0.05, every: int = 4, step_s: float = 0.0,
        member: int = 0) -> dict[str, float]:
    """`step_s`: the seconds each step takes (a real trial's work); `member`: its place in the
    first population (two members may share h)."""
    theta, start = [0.9, 0.9], 0
    latest = isorun.latest_checkpoint()
    if latest is not None:
        theta = json.loads((latest.path / "theta.json").read_text())
        start = latest.step
    q = 1.2 - (theta[0] ** 2 + theta[1] ** 2)
    for step in range(start + 1, steps + 1):
        if step_s:
            time.sleep(step_s)  # the step's work
        theta = [theta[0] - lr * 2 * h0 * theta[0], theta[1] - lr * 2 * h1 * theta[1]]
        q = 1.2 - (theta[0] ** 2 + theta[1] ** 2)
        isorun.report(step=step, q=q)
        if step % every == 0:
            with isorun.checkpoint(step) as folder:
                (folder / "theta.json").write_text(json.dumps(theta))
    return {"q": q, "start": start}
