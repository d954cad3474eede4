#!/usr/bin/env python3
"""A synthetic learning curve for early-stopping tests and benchmarks.

The loss of configuration (x, y) at step t is known:
    loss(t) = (x - 0.3)^2 + (y - 0.6)^2 + (1 + |x - 0.3| + |y - 0.6|) * 2 / (t + 1)
so the best configuration at every step, and at the end, is x=0.3, y=0.6, while the others'
curves cross. Each step prints a report line, {"step": t, "loss": ...}, sleeps a little (the
work a step stands for), and the last line is the final result, {"loss": ...}.

For the tests of when a stop lands, a trial can wait after a step's report (--hold-at): for a
stop, which nothing else ends (a step after it would prove the stop came late), or, with
--release, reporting that step again until a line comes through a FIFO.
"""
import argparse
import json
import os
import select
import signal
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
    p.add_argument("--stopped", help="on SIGTERM, append the wall clock it came at to this file, then die of it")
    p.add_argument("--hold-at", type=int, default=0, help="after this step's report, wait for a stop (0: never)")
    p.add_argument("--release", help="with --hold-at: report the step again every --sleep-ms until a line comes "
                   "through this FIFO, then go on")
    a = p.parse_args()
    release = os.open(a.release, os.O_RDWR) if a.release else -1  # read-write: never an end of file
    if a.stopped:
        def on_term(signum, frame):
            fd = os.open(a.stopped, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, ("%s %s %r\n" % (a.x, a.y, time.time())).encode())
            os.close(fd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # ended by it, as without this option
        signal.signal(signal.SIGTERM, on_term)
    if a.runs:
        fd = os.open(a.runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, ("%s %s\n" % (a.x, a.y)).encode())
        os.close(fd)
    for t in range(1, a.max_t + 1):
        report = {"step": t, a.metric: loss(a.x, a.y, t)}
        if a.stamp:
            report["t"] = time.time()
        print(json.dumps(report), flush=True)
        if t == a.hold_at and release < 0:
            while True:
                signal.pause()  # until a signal ends it: no step after this one comes by itself
        if t == a.hold_at:
            while not select.select([release], [], [], a.sleep_ms / 1000.0)[0]:
                print(json.dumps(report), flush=True)
            continue
        time.sleep(a.sleep_ms / 1000.0)
    print(json.dumps({"loss": loss(a.x, a.y, a.max_t)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
