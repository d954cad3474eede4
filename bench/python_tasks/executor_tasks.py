"""Functions the executor benchmark calls: module-level, so a worker imports them by name (and a
standby interpreter preloads this module)."""

import os


def trivial():
    return 1


def square(x):
    """A trivial function of its input: what a map calls a million times."""
    return x * x


def with_numpy():
    import numpy

    return float(numpy.ones(4).sum())


def sweep_trial(x, y):
    """A trivial trial: what a sweep's own cost is measured with."""
    return {"loss": (x - 0.3) ** 2 + y}


def fit(c):
    """One scikit-learn fit on the digits bundled with scikit-learn: a small, CPU-bound task."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    model = LogisticRegression(C=c, max_iter=300).fit(x / 16.0, y)
    return float(model.score(x / 16.0, y))


def pid():
    return os.getpid()
