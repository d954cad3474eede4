"""The toy problem of the PBT paper (Jaderberg et al. 2017, section 4): maximize
Q(theta) = 1.2 - (theta0^2 + theta1^2) by gradient ascent on a surrogate
Q^(theta | h) = 1.2 - (h0 theta0^2 + h1 theta1^2), from theta = (0.9, 0.9). A member with
h = (1, 0) or (0, 1) alone shrinks one coordinate and stops at Q = 0.39; exploiting the other's
theta and exploring h gets both down. Each trial keeps theta in its checkpoints, reports Q each
step, and returns the Q it reached (for bench/bench_pbt.py and python/tests/test_pbt.py).

The math (START, quality, descend) needs nothing but Python: bench/python_tasks/ray_pbt_toy.py
runs the same steps under Ray Tune, in an interpreter that may not have isorun."""

from __future__ import annotations

import json
import time

START = (0.9, 0.9)
"""theta at the start of every member of the first population."""
CHECKPOINT_EVERY = 4
"""A member keeps theta in a checkpoint every this many steps."""


def quality(theta: list[float]) -> float:
    """Q(theta) = 1.2 - |theta|^2, the objective (its maximum: 1.2, at theta = 0)."""
    return 1.2 - (theta[0] ** 2 + theta[1] ** 2)


def descend(theta: list[float], h0: float, h1: float, lr: float) -> list[float]:
    """One gradient ascent step on the surrogate 1.2 - (h0 theta0^2 + h1 theta1^2)."""
    return [theta[0] - lr * 2 * h0 * theta[0], theta[1] - lr * 2 * h1 * theta[1]]


def toy(h0: float, h1: float, steps: int = 40, lr: float = 0.05, every: int = CHECKPOINT_EVERY,
        step_s: float = 0.0, member: int = 0) -> dict[str, float]:
    """`step_s`: the seconds each step takes (a real trial's work); `member`: its place in the
    first population (two members may share h)."""
    import isorun  # here, so that the math above imports where isorun is not installed

    theta, start = list(START), 0
    latest = isorun.latest_checkpoint()
    if latest is not None:
        theta = json.loads((latest.path / "theta.json").read_text())
        start = latest.step
    q = quality(theta)
    for step in range(start + 1, steps + 1):
        if step_s:
            time.sleep(step_s)  # the step's work
        theta = descend(theta, h0, h1, lr)
        q = quality(theta)
        isorun.report(step=step, q=q)
        if step % every == 0:
            with isorun.checkpoint(step) as folder:
                (folder / "theta.json").write_text(json.dumps(theta))
    return {"q": q, "start": start}
