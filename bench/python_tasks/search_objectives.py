"""Test functions for bench/bench_search.py: Branin, Hartmann-6 and a 5-parameter synthetic
"training" objective with learning curves, each with noise drawn from the trial's own parameters
and seed (the same trial gives the same value, in isorun's worker and in Optuna's process)."""

from __future__ import annotations

import math
import random
from typing import Any

NOISE = 0.02


def _noise(seed: int, *params: Any) -> float:
    return random.Random(hash((seed, *(round(p, 12) if isinstance(p, float) else p for p in params)))).gauss(0, NOISE)


def branin(x1: float, x2: float, seed: int = 0) -> dict[str, float]:
    """Branin on [-5, 10] x [0, 15]; its minimum is 0.397887."""
    a, b, c, r, s, t = 1.0, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6.0, 10.0, 1 / (8 * math.pi)
    value = a * (x2 - b * x1 ** 2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s
    return {"loss": value + _noise(seed, x1, x2)}


_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
_P = [[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
      [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]]
_ALPHA = [1.0, 1.2, 3.0, 3.2]


def hartmann6(x1: float, x2: float, x3: float, x4: float, x5: float, x6: float, seed: int = 0) -> dict[str, float]:
    """Hartmann-6 on [0, 1]^6; its minimum is -3.32237."""
    x = [x1, x2, x3, x4, x5, x6]
    value = -sum(_ALPHA[i] * math.exp(-sum(_A[i][j] * (x[j] - _P[i][j] * 1e-4) ** 2 for j in range(6)))
                 for i in range(4))
    return {"loss": value + _noise(seed, *x)}


def training(lr: float, momentum: float, width: int, dropout: float, batch: int, seed: int = 0,
             steps: int = 20) -> dict[str, float]:
    """A synthetic training run: a validation loss that falls along a learning curve whose speed
    and floor depend on the five settings (best near lr=0.01, momentum 0.9, width 256,
    dropout 0.2, batch 64)."""
    speed = math.exp(-(math.log10(lr) + 2) ** 2) * (0.5 + momentum) / (1 + abs(math.log2(batch / 64)) * 0.3)
    floor = 0.1 + 0.3 * abs(dropout - 0.2) + 0.2 * abs(math.log2(width / 256)) / 4 + 0.2 * (1 - momentum) ** 2
    loss = 1.0
    for step in range(1, steps + 1):
        loss = floor + (1.0 - floor) * math.exp(-speed * step / 4)
    return {"loss": loss + _noise(seed, lr, momentum, width, dropout, batch)}


SPACES: dict[str, dict[str, Any]] = {
    "branin": {"x1": {"float": [-5, 10]}, "x2": {"float": [0, 15]}},
    "hartmann6": {f"x{i}": {"float": [0, 1]} for i in range(1, 7)},
    "training": {"lr": {"float": [1e-4, 1.0], "log": True}, "momentum": {"float": [0.0, 0.99]},
                 "width": {"int": [16, 1024], "log": True}, "dropout": {"float": [0.0, 0.6]},
                 "batch": {"categorical": [16, 32, 64, 128, 256]}},
}
FUNCTIONS = {"branin": branin, "hartmann6": hartmann6, "training": training}
