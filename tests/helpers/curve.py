#!/usr/bin/env python3
"""A synthetic learning curve for early-stopping tests and benchmarks.

The loss of configuration (x, y) at step t is known:
    loss(t) = (x - 0.3)^2 + (y - 0.6)^2 + (1 + |x - 0.3| + |y - 0.6|) * 2 / (t + 1)
so the best configuration at every step, and at the end, is x=0.3, y=0.6, while the others'
curves cross. Each step prints a report line, {"step": t, "loss": ...}, sleeps a little (the
work a step stands for), and the last line is the final result, {"loss": ...}.
"""
import argparse
import json
import os
import sys
import time


def loss(x, y, t):
    return (x - 0.3) ** 2 + (y - 0.6) ** 2 + (1 + abs(x - 0.3) + abs(y - 0.6)) * 2.0 / (t + 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, required=True)
    p.add_argument("--y", type=float, required=True)
    p.add_argument("--max-t", type=int, default=81)
    p.add_argument("--sleep-ms", type=float, default=1.0)
    p.add_argument("--runs", help="append a line per start to this file (to count starts)")
    p.add_argument("--metric", default="loss", help="the name the reports give the loss")
    p.add_argument("--stamp", action="store_true", help="each report carries the wall clock it was printed at, as t")
    a = p.parse_args()
    if a.runs:
        fd = os.open(a.runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, ("%s %s\n" % (a.x, a.y)).encode())
        os.close(fd)
    for t in range(1, a.max_t + 1):
        report = {"step": t, a.metric: loss(a.x, a.y, t)}
        if a.stamp:
            report["t"] = time.time()
        print(json.dumps(report), flush=True)
        time.sleep(a.sleep_ms / 1000.0)
    print(json.dumps({"loss": loss(a.x, a.y, a.max_t)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
