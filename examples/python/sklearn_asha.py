#!/usr/bin/env python3
"""A scikit-learn sweep with early stopping: a linear classifier (SGD) on the digits data,
trained epoch by epoch, reporting its validation loss after each epoch; ASHA stops the trials
that fall behind at each rung (epochs 1, 3, 9), and the rest run to 27 epochs.

    python3 examples/python/sklearn_asha.py [OUT]      # results in OUT (default runs/sklearn-asha)

Each trial is a call of train() in a fresh interpreter (this script imported as a module: hence
the __main__ guard); `isorun report OUT` draws the sweep. Needs scikit-learn (tools/setup.sh).
"""
import collections
import sys

import isorun


def train(alpha, eta0, epochs=27):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import log_loss
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    x_train, y_train, x_val, y_val = X[:1200], y[:1200], X[1200:], y[1200:]
    classes = np.unique(y)
    model = SGDClassifier(loss="log_loss", alpha=alpha, learning_rate="constant", eta0=eta0, random_state=0)
    for epoch in range(1, epochs + 1):
        model.partial_fit(x_train, y_train, classes=classes)
        loss = log_loss(y_val, model.predict_proba(x_val), labels=classes)
        isorun.report(step=epoch, loss=loss)  # ASHA judges the trial at its rungs
    return {"loss": loss, "accuracy": model.score(x_val, y_val)}


def main(out: str) -> None:
    records = isorun.sweep({
        "python": train,
        "params": {"alpha": {"range": [1e-5, 1e-1], "num": 4, "scale": "log"}, "eta0": [0.001, 0.01, 0.1]},
        "metric": {"name": "loss", "goal": "minimize"},
        "scheduler": {"type": "asha", "max_t": 27, "grace_period": 1, "reduction_factor": 3},
        "out": out,
    })
    print("outcomes:", dict(collections.Counter(r["outcome"] for r in records)))
    done = [r for r in records if r["outcome"] == "success"]
    best = min(done, key=lambda r: r["result"]["loss"])
    print(f"best of {len(records)}: {best['params']} -> loss {best['result']['loss']:.3f}, "
          f"accuracy {best['result']['accuracy']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/sklearn-asha")
