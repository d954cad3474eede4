"""isorun.sweep() for benchmarks whose report is their own output: the command's lines (its
start, its table) go to /dev/null, at the descriptor level, since the command inherits them."""

from __future__ import annotations

import os
import sys
from typing import Any

import isorun


def sweep(spec: dict[str, Any]) -> list[dict[str, Any]]:
    sys.stdout.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        return list(isorun.sweep(spec))
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
