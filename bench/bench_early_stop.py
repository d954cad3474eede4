#!/usr/bin/env python3
"""Early stopping on synthetic learning curves (tests/helpers/curve.py): steps used and the best
configuration found by isorun's sweeps with no scheduler (the full grid), ASHA and the median
rule, next to Optuna's SuccessiveHalvingPruner and MedianPruner on the same curves (Optuna is
pip-installed into a venv of its own; skipped where that cannot be done); and the time from a
trial's stop decision to its slot running the next trial.

    python3 bench/bench_early_stop.py [--isorun build/bin/isorun] [--sleep-ms 1] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURVE = os.path.join(ROOT, "tests", "helpers", "curve.py")
XS = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
YS = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
ASHA = "{type: asha, max_t: %d, grace_period: 1, reduction_factor: 3}"
MEDIAN = "{type: median, grace_period: 5, min_samples: 3, max_t: %d}"


def loss(x, y, t):
    return (x - 0.3) ** 2 + (y - 0.6) ** 2 + (1 + abs(x - 0.3) + abs(y - 0.6)) * 2.0 / (t + 1)


def isorun_sweep(isorun, scheduler, max_t, sleep_ms, slots, xs=XS, ys=YS, stamp=False, order=None):
    """Runs one sweep (the grid xs × ys, x outer, or the configurations `order` in that order);
    returns (steps, best params, best loss, wall seconds, pruned, folder). With `stamp`, each
    report carries the wall clock it was printed at, each trial notes when it started (in
    FOLDER/starts) and when a SIGTERM reached it (in FOLDER/stopped)."""
    d = tempfile.mkdtemp(prefix="isorun-bench-es-")
    curve = "python3 %s --x {x} --y {y} --max-t %d --sleep-ms %s%s" % (
        CURVE, max_t, sleep_ms, " --stamp --stopped %s/stopped" % d if stamp else "")
    # With --stamp each trial says when it started (bash's clock, before Python starts).
    command = ("[bash, -c, 'echo \"$EPOCHREALTIME\" >> %s/starts; exec %s']" % (d, curve)) if stamp else \
        "[" + ", ".join('"%s"' % w for w in curve.split()) + "]"
    params = "params:\n  x: %s\n  y: %s\n" % (json.dumps(xs), json.dumps(ys)) if order is None else \
        "zip:\n  - {x: %s, y: %s}\n" % (json.dumps([c[0] for c in order]), json.dumps([c[1] for c in order]))
    spec = "command: %s\nmetric: {name: loss, goal: minimize}\n%s%sresources: {cpu_slots: %d}\nout: %s/out\n" % (
        command, "scheduler: %s\n" % scheduler if scheduler else "", params, slots, d)
    with open(os.path.join(d, "spec.yaml"), "w") as f:
        f.write(spec)
    t0 = time.monotonic()
    r = subprocess.run([isorun, "sweep", os.path.join(d, "spec.yaml"), "--no-progress"], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit("isorun sweep failed (%d): %s" % (r.returncode, r.stderr))
    steps, pruned, best = 0, 0, None
    with open(os.path.join(d, "out", "results.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            steps += rec.get("step", 0)
            pruned += rec["outcome"] == "pruned"
            if rec["outcome"] == "success" and (best is None or rec["result"]["loss"] < best[1]):
                best = (rec["params"], rec["result"]["loss"])
    return steps, best[0], best[1], wall, pruned, d


OPTUNA_PART = r'''
import json, sys
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
xs, ys, max_t = json.loads(sys.argv[1])
def loss(x, y, t):
    return (x - 0.3) ** 2 + (y - 0.6) ** 2 + (1 + abs(x - 0.3) + abs(y - 0.6)) * 2.0 / (t + 1)
out = {}
for name, pruner in [("SuccessiveHalvingPruner", optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)),
                     ("MedianPruner", optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=4))]:
    steps = [0]
    def objective(trial):
        x = trial.suggest_categorical("x", xs)
        y = trial.suggest_categorical("y", ys)
        for t in range(1, max_t + 1):
            steps[0] += 1
            trial.report(loss(x, y, t), t)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return loss(x, y, max_t)
    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"x": xs, "y": ys}, seed=1), pruner=pruner)
    study.optimize(objective, n_trials=len(xs) * len(ys))
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    order = [[t.params["x"], t.params["y"]] for t in study.trials]
    out[name] = {"steps": steps[0], "best": study.best_params, "loss": study.best_value, "pruned": pruned,
                 "order": order}
print(json.dumps(out))
'''


def optuna_figures(max_t, xs=XS, ys=YS):
    """Optuna's pruners on the same curves (sequential, in its grid sampler's order), or None."""
    python = sys.executable
    try:
        import optuna  # noqa: F401
    except ImportError:
        venv = os.path.join(tempfile.gettempdir(), "isorun-bench-optuna-venv")
        python = os.path.join(venv, "bin", "python3")
        if not os.path.exists(python):
            ok = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True).returncode == 0 and \
                 subprocess.run([python, "-m", "pip", "install", "--quiet", "optuna"], capture_output=True).returncode == 0
            if not ok:
                print("optuna: skipped (pip install optuna failed)")
                return None
    r = subprocess.run([python, "-c", OPTUNA_PART, json.dumps([xs, ys, max_t])], capture_output=True, text=True)
    if r.returncode != 0:
        print("optuna: skipped (%s)" % r.stderr.strip().splitlines()[-1:])
        return None
    return json.loads(r.stdout)


def stop_latency(isorun, sleep_ms):
    """Stop decision to the next trial running, on one slot: from the report that got a trial
    pruned (its wall clock, printed with it) to the next trial's start (bash's clock as its
    first command). An upper bound: it includes the pipe, the report's fsync and bash's start."""
    xs = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    ys = [0.2, 0.4, 0.6, 0.8, 1.0]
    _, _, _, _, pruned, d = isorun_sweep(isorun, ASHA % 27, 27, sleep_ms, 1, xs, ys, stamp=True)
    starts = sorted(float(l.replace(",", ".")) for l in open(os.path.join(d, "starts")))
    last = {}
    for line in open(os.path.join(d, "out", "reports.jsonl")):
        r = json.loads(line)
        last[r["trial"]] = r
    gaps = []
    for line in open(os.path.join(d, "out", "results.jsonl")):
        rec = json.loads(line)
        if rec["outcome"] != "pruned":
            continue
        decided = last[rec["id"]]["metrics"]["t"]
        later = [s for s in starts if s > decided]
        if later:
            gaps.append((later[0] - decided) * 1000)
    return gaps


def stop_delivery(isorun, sleep_ms, slots):
    """Report written -> stop delivered: for each pruned trial, from the wall clock its deciding
    report was printed at to the wall clock its SIGTERM handler ran at (the pipe, the report's
    append, the follower's wake-up, the rule's verdict, the signal and Python's handler)."""
    _, _, _, _, _, d = isorun_sweep(isorun, ASHA % 27, 27, sleep_ms, slots, stamp=True)
    stopped = {}
    if os.path.exists(os.path.join(d, "stopped")):
        for line in open(os.path.join(d, "stopped")):
            x, y, t = line.split()
            stopped[(float(x), float(y))] = float(t)
    last = {}
    for line in open(os.path.join(d, "out", "reports.jsonl")):
        r = json.loads(line)
        last[r["trial"]] = r["metrics"]["t"]
    gaps = []
    for line in open(os.path.join(d, "out", "results.jsonl")):
        rec = json.loads(line)
        key = (float(rec["params"]["x"]), float(rec["params"]["y"]))
        if rec["outcome"] == "pruned" and key in stopped and rec["id"] in last:
            gaps.append((stopped[key] - last[rec["id"]]) * 1000)
    return sorted(gaps)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--isorun", default=os.path.join(ROOT, "build", "bin", "isorun"))
    p.add_argument("--sleep-ms", type=float, default=1.0)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--max-t", type=int, default=81)
    a = p.parse_args()
    n = len(XS) * len(YS)
    full = n * a.max_t
    grid_best = min(((x, y) for x in XS for y in YS), key=lambda c: loss(c[0], c[1], a.max_t))
    print("%d configurations, max_t %d: the full grid is %d steps; its best is x=%s y=%s (loss %.4f)" %
          (n, a.max_t, full, grid_best[0], grid_best[1], loss(grid_best[0], grid_best[1], a.max_t)))
    print("%-44s %8s %8s %8s  %-18s %s" % ("", "steps", "of grid", "pruned", "best found", "wall"))

    def row(name, steps, pruned, best, value, wall):
        print("%-44s %8d %7.1f%% %8d  x=%-4s y=%-4s %.4f  %s" %
              (name, steps, 100.0 * steps / full, pruned, best["x"], best["y"], value, wall))

    def isorun_row(name, sched, slots, order=None):
        steps, best, value, wall, pruned, _ = isorun_sweep(a.isorun, sched, a.max_t, a.sleep_ms, slots, order=order)
        row(name, steps, pruned, best, value, "%.1f s" % wall)

    print("-- the grid in spec order (x outer), %d slots:" % a.slots)
    for name, sched in [("isorun, no scheduler (grid)", None), ("isorun, asha", ASHA % a.max_t),
                        ("isorun, median", MEDIAN % a.max_t)]:
        isorun_row(name, sched, a.slots)
    o = optuna_figures(a.max_t)
    if o:
        # Early stopping depends on the order trials come in: Optuna's grid sampler shuffles the
        # grid, so isorun runs the same configurations in Optuna's order here, sequentially as
        # Optuna did (1 slot) and on 2 slots.
        for pruner, sched in [("SuccessiveHalvingPruner", ASHA % a.max_t), ("MedianPruner", MEDIAN % a.max_t)]:
            f = o[pruner]
            print("-- in Optuna's order for its %s:" % pruner)
            row("optuna " + pruner, f["steps"], f["pruned"], f["best"], f["loss"], "(in-process, 1 at a time)")
            for slots in (1, 2):
                isorun_row("isorun, %s, %d slot%s" % (sched.split(",")[0][7:], slots, "s" if slots > 1 else ""), sched,
                           slots, order=f["order"])
    for slots in (1, 2):
        gaps = stop_delivery(a.isorun, a.sleep_ms, slots)
        if gaps:
            print("report written -> stop delivered (%d slot%s, %d stops): median %.2f ms, p90 %.2f, max %.2f" %
                  (slots, "s" if slots > 1 else "", len(gaps), statistics.median(gaps), gaps[(len(gaps) * 9) // 10],
                   gaps[-1]))
    gaps = stop_latency(a.isorun, a.sleep_ms)
    if gaps:
        gaps.sort()
        print("stop decision -> next trial running (1 slot, %d stops): median %.2f ms, p10 %.2f, p90 %.2f, max %.2f" %
              (len(gaps), statistics.median(gaps), gaps[len(gaps) // 10], gaps[(len(gaps) * 9) // 10], gaps[-1]))


if __name__ == "__main__":
    main()
