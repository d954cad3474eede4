#!/usr/bin/env python3
"""A small classifier trained the way a sweep trial usually is: hyperparameters as flags,
progress on stdout, and the result as the last line of stdout, one JSON object.

    python3 train.py --lr 0.1 --hidden 32 --epochs 60

Runs on NumPy; with PyTorch and a visible GPU it trains there instead (under isorun's
--mem-limit, PyTorch sees the cap as the GPU's size). The data is made up here, with a fixed
seed: two interleaved spirals, which a linear model cannot separate and a small MLP can.
"""
import argparse
import json
import sys

import numpy as np


def spirals(n, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.random(n)) * 3 * np.pi
    label = rng.integers(0, 2, n)
    r = t / (3 * np.pi)
    angle = t + label * np.pi
    x = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1) + rng.normal(0, 0.03, (n, 2))
    return x.astype(np.float32), label


def train_numpy(args, x, y, xt, yt):
    rng = np.random.default_rng(args.seed)
    w1 = rng.normal(0, 1 / np.sqrt(2), (2, args.hidden)).astype(np.float32)
    b1 = np.zeros(args.hidden, np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(args.hidden), (args.hidden, 2)).astype(np.float32)
    b2 = np.zeros(2, np.float32)
    onehot = np.eye(2, dtype=np.float32)[y]
    for epoch in range(args.epochs):
        for i in range(0, len(x), args.batch):
            xb, tb = x[i:i + args.batch], onehot[i:i + args.batch]
            h = np.tanh(xb @ w1 + b1)
            logits = h @ w2 + b2
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            g = (p - tb) / len(xb)
            gh = (g @ w2.T) * (1 - h * h)
            w2 -= args.lr * h.T @ g
            b2 -= args.lr * g.sum(0)
            w1 -= args.lr * xb.T @ gh
            b1 -= args.lr * gh.sum(0)
        if epoch % 20 == 0:
            print(f"epoch {epoch}", flush=True)
    h = np.tanh(xt @ w1 + b1)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(yt)), yt] + 1e-9).mean())
    return float((logits.argmax(1) == yt).mean()), loss, "cpu"


def train_torch(args, x, y, xt, yt, torch):
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(2, args.hidden), torch.nn.Tanh(),
                                torch.nn.Linear(args.hidden, 2)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = torch.tensor(x, device=dev), torch.tensor(y, device=dev)
    for epoch in range(args.epochs):
        for i in range(0, len(x), args.batch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i:i + args.batch]), y[i:i + args.batch]).backward()
            opt.step()
        if epoch % 20 == 0:
            print(f"epoch {epoch}", flush=True)
    with torch.no_grad():
        logits = model(torch.tensor(xt, device=dev))
        yt = torch.tensor(yt, device=dev)
        loss = float(torch.nn.functional.cross_entropy(logits, yt))
        return float((logits.argmax(1) == yt).float().mean()), loss, "cuda"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--numpy", action="store_true", help="train with NumPy even where PyTorch has a GPU")
    args = ap.parse_args()
    if args.lr <= 0 or args.hidden <= 0:
        sys.exit(f"train.py: --lr and --hidden must be positive (got {args.lr}, {args.hidden})")
    x, y = spirals(1500, seed=1)
    xt, yt = spirals(500, seed=2)
    torch = None
    if not args.numpy:
        try:
            import torch as torch_module
            torch = torch_module if torch_module.cuda.is_available() else None
        except ImportError:
            pass
    accuracy, loss, device = (train_torch(args, x, y, xt, yt, torch) if torch
                              else train_numpy(args, x, y, xt, yt))
    print(json.dumps({"accuracy": accuracy, "loss": loss, "device": device}))


if __name__ == "__main__":
    main()
