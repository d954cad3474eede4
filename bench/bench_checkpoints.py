#!/usr/bin/env python3
"""What checkpoints save, and what a commit costs, in one run (docs/sweeps.md#checkpoints;
bench/README.md "Checkpoints").

  resume: a sweep of --trials command trials of --steps steps of --step-ms each (2 slots), killed
    with SIGKILL at --kills points drawn at random in its work and resumed each time, until it
    ends: the steps done again, with `checkpoints:` (a checkpoint every --every steps, committed by
    printing {"checkpoint": STEP}) and without (each interrupted trial starts from nothing). The
    same kill points for both, counted in the trials' own logs.
  commit: a checkpoint of --mib MiB (10 files) through isorun.checkpoint(step) (written, every
    file and the folder fsync'ed, renamed, the parent fsync'ed), beside writing the same bytes
    (the floor: what the trial writes anyway) and writing them with an fsync of each file.

Run from the repository root with the build's CLI and package:

    PYTHONPATH=build/python python3 bench/bench_checkpoints.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import isorun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A trial of STEPS steps of STEP_S seconds that saves every EVERY steps where the sweep keeps
# checkpoints, and resumes from the latest; it logs each step it does (its own count of its work).
TRIAL = r"""
log=$1 steps=$2 every=$3 step_s=$4
step=0
if [ -n "$ISORUN_RESUME_FROM" ]; then step=$(cat "$ISORUN_RESUME_FROM/state"); fi
while [ "$step" -lt "$steps" ]; do
  step=$((step + 1))
  sleep "$step_s"
  echo "$ISORUN_TRIAL $step" >> "$log"
  if [ -n "$ISORUN_CHECKPOINT_DIR" ] && [ $((step % every)) -eq 0 ]; then
    mkdir "$ISORUN_CHECKPOINT_DIR/tmp-$step" && echo "$step" > "$ISORUN_CHECKPOINT_DIR/tmp-$step/state"
    echo "{\"checkpoint\": $step}"
  fi
done
echo "{\"steps\": $step}"
"""


def cli() -> str:
    for where in (os.environ.get("ISORUN_CLI", ""), os.path.join(ROOT, "build", "bin", "isorun")):
        if where and os.path.exists(where):
            return where
    sys.exit("bench_checkpoints: no build/bin/isorun (build first, or set ISORUN_CLI)")


def lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def wait_for(path: str, n: int, proc: subprocess.Popen) -> None:
    # The sweep's progress is the trials' log: poll it (a benchmark, not a test).
    while lines(path) < n and proc.poll() is None:
        time.sleep(0.01)


def resume_run(args, checkpoints: bool, kills: list[int]) -> dict:
    work = tempfile.mkdtemp(prefix="isorun-bench-ckpt-")
    try:
        script, log, out = f"{work}/trial.sh", f"{work}/steps", f"{work}/out"
        with open(script, "w") as f:
            f.write(TRIAL)
        open(log, "w").close()
        step_s = f"{args.step_ms / 1000:.3f}"
        spec = {
            "command": ["sh", script, log, str(args.steps), str(args.every), step_s, "{i}"],
            "params": {"i": list(range(args.trials))},
            "resources": {"cpu_slots": 2},
            "out": out,
        }
        if checkpoints:
            spec["checkpoints"] = {"keep": 2}
        with open(f"{work}/spec.yaml", "w") as f:
            json.dump(spec, f)  # (the command's last word, {i}, makes each trial its own)
        command = [cli(), "sweep", f"{work}/spec.yaml", "--no-progress"]
        start = time.perf_counter()
        for at in kills:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(log, at, proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            time.sleep(0.2)  # (the trials go with their supervisor)
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall = time.perf_counter() - start
        done = lines(log)
        return {"redone": done - args.trials * args.steps, "wall": wall}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_files(folder: str, mib: int, sync: bool) -> None:
    block = os.urandom(1 << 20)
    for k in range(10):
        with open(os.path.join(folder, f"part{k}"), "wb") as f:
            for _ in range(mib // 10):
                f.write(block)
            if sync:
                f.flush()
                os.fsync(f.fileno())


def commit_figures(args) -> None:
    reps = args.reps
    work = tempfile.mkdtemp(prefix="isorun-bench-commit-", dir=args.dir)
    try:
        os.environ["ISORUN_CHECKPOINT_DIR"] = work
        os.environ["ISORUN_CHECKPOINT_KEEP"] = "1"
        plain, synced, committed = [], [], []
        for rep in range(reps):
            folder = os.path.join(work, f"plain-{rep}")
            os.mkdir(folder)
            t = time.perf_counter()
            write_files(folder, args.mib, sync=False)
            plain.append((time.perf_counter() - t) * 1e3)
            shutil.rmtree(folder)
            folder = os.path.join(work, f"synced-{rep}")
            os.mkdir(folder)
            t = time.perf_counter()
            write_files(folder, args.mib, sync=True)
            synced.append((time.perf_counter() - t) * 1e3)
            shutil.rmtree(folder)
            t = time.perf_counter()
            with isorun.checkpoint(rep + 1) as folder:
                write_files(str(folder), args.mib, sync=False)
            committed.append((time.perf_counter() - t) * 1e3)
        med = statistics.median
        floor = med(plain)
        print(f"commit of a {args.mib} MiB checkpoint (10 files), {reps} reps, in {args.dir or tempfile.gettempdir()}:")
        for label, ms in (("write the bytes (floor)", plain), ("write + fsync each file", synced),
                          ("isorun.checkpoint(): write, commit", committed)):
            print(f"  {label:<40} {med(ms):8.1f} ms  (min {min(ms):7.1f}, max {max(ms):7.1f})  "
                  f"{med(ms) / floor:5.2f}x")
        print(f"  commit overhead over writing: {med(committed) - floor:.1f} ms; over fsync'ed writes: "
              f"{med(committed) - med(synced):.1f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5, help="kill-point draws, each run with and without")
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the commit figures write (default: the temp folder)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.steps, args.seeds, args.mib, args.reps = 6, 40, 1, 20, 3

    total = args.trials * args.steps
    print(f"resume: {args.trials} trials x {args.steps} steps of {args.step_ms:g} ms on 2 slots, a checkpoint every "
          f"{args.every}, {args.kills} kill -9 + resume, {args.seeds} draws of kill points")
    ratios, redone_with, redone_without = [], 0, 0
    for seed in range(args.seeds):
        rng = random.Random(seed)
        kills = sorted(rng.randrange(total // 20, total * 19 // 20) for _ in range(args.kills))
        with_ck = resume_run(args, True, kills)
        without = resume_run(args, False, kills)
        ratio = with_ck["redone"] / without["redone"] if without["redone"] else float("nan")
        ratios.append(ratio)
        redone_with += with_ck["redone"]
        redone_without += without["redone"]
        print(f"  kills at {kills} of {total} steps: redone with checkpoints {with_ck['redone']:5d} "
              f"({with_ck['wall']:.1f} s), without {without['redone']:5d} ({without['wall']:.1f} s): {ratio:.1%}")
    print(f"  steps redone with checkpoints / without, all draws: {redone_with} / {redone_without} = "
          f"{redone_with / max(1, redone_without):.1%} (per draw: median {statistics.median(ratios):.1%}, "
          f"min {min(ratios):.1%}, max {max(ratios):.1%}); goal <= 10%")
    commit_figures(args)


if __name__ == "__main__":
    main()
