#!/usr/bin/env python3
"""joblib through isorun's backend against loky, side by side in one program (bench/README.md):
GridSearchCV(SVC(), a 3x3 grid, cv=3, n_jobs=2) on load_digits, twice each (the first pays the
workers' start), the same search with n_jobs=1, and 100 tiny tasks through joblib.Parallel.

    python3 bench/bench_joblib.py [--rounds 2]      # needs scikit-learn
"""

from __future__ import annotations

import argparse
import time

import joblib
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import isorun.joblib  # noqa: F401 - registers "isorun"

GRID = {"C": [0.1, 1, 10], "gamma": [1e-4, 1e-3, 1e-2]}


def tiny(i):
    return i


def search(X, y, backend=None):
    t = time.perf_counter()
    if backend is None:
        g = GridSearchCV(SVC(), GRID, cv=3, n_jobs=1).fit(X, y)
    else:
        with joblib.parallel_backend(backend, n_jobs=2):
            g = GridSearchCV(SVC(), GRID, cv=3, n_jobs=2).fit(X, y)
    return time.perf_counter() - t, g.best_params_, round(g.best_score_, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    X, y = load_digits(return_X_y=True)
    for r in range(args.rounds):
        for backend in ("loky", "isorun"):
            s, best, score = search(X, y, backend)
            print(f"round {r + 1}: GridSearchCV, {backend:<6} {s:6.2f} s  best {best} {score}", flush=True)
    s, best, score = search(X, y)
    print(f"GridSearchCV, n_jobs=1      {s:6.2f} s  best {best} {score}")
    for r in range(args.rounds):
        for backend in ("loky", "isorun"):
            t = time.perf_counter()
            with joblib.parallel_backend(backend, n_jobs=2):
                joblib.Parallel()(joblib.delayed(tiny)(i) for i in range(100))
            print(f"round {r + 1}: 100 tiny tasks, {backend:<6} {time.perf_counter() - t:6.3f} s", flush=True)


if __name__ == "__main__":
    main()
