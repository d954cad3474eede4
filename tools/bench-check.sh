#!/usr/bin/env bash
# The performance guard: the key benchmarks in their quick form, each figure against its goal
# (benchmarks print `guard: NAME VALUE OP GOAL` lines; each value is a ratio to a floor measured
# in the same run, or a difference from one). A figure worse than twice its goal fails, or, for
# a figure that already misses its goal, worse than twice the value bench/README.md records for
# it (bench/guard-baseline.txt): far enough that a noisy machine passes, near enough that a
# regression of several times (a per-trial cost going from 2 ms to 12 ms) cannot land unseen.
# A benchmark with a failing figure runs once more and is judged by that run, so one unlucky
# run does not fail CI and a real regression, which repeats, does.
#
# Usage: tools/bench-check.sh            (the build in build/, or $ISORUN_BUILD_DIR)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ISORUN_BUILD_DIR:-$root/build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

names=(core sweep calls python scale)
declare -A cmds=(
  [core]="$build/bin/bench_core --quick --resident-gib 1"
  [sweep]="$build/bin/bench_sweep --reps 2"
  [calls]="$build/bin/bench_calls --quick"
  [python]="env PYTHONPATH=$build/python python3 $root/bench/bench_python.py --reps 10 --big-reps 2 --gib 0.25 --settle 0.3"
  [scale]="env PYTHONPATH=$build/python python3 $root/bench/bench_scale.py --queued 20000 --imap 0 --sweep 20000 --isorun $build/bin/isorun"
)

# Runs benchmark $1 into $out/$1.txt; exits 2 if it fails to run (a broken benchmark is not a pass).
run() {
  if ! ${cmds[$1]} > "$out/$1.txt" 2>&1; then
    echo "bench-check: the $1 benchmark failed to run (${cmds[$1]}):" >&2
    tail -20 "$out/$1.txt" >&2
    exit 2
  fi
}

# Prints benchmark $1's figures as table rows; returns 1 if any is past its limit.
judge() {
  awk -v bench="$1" '
    FNR == NR { if ($0 !~ /^#/ && NF == 2) recorded[$1] = $2 + 0; next }
    $1 == "guard:" {
      name = $2; value = $3 + 0; op = $4; goal = $5 + 0
      base = goal
      if (name in recorded) base = (op == "<=") ? (recorded[name] > goal ? recorded[name] : goal) \
                                                : (recorded[name] < goal ? recorded[name] : goal)
      limit = (op == "<=") ? 2 * base : base / 2
      bad = (op == "<=") ? value > limit : value < limit
      printf "%-48s %9.3f   goal %s %-6g recorded %-7s limit %s %-7g %s\n", name, value, op, goal,
             (name in recorded) ? recorded[name] : "-", op, limit, bad ? "FAIL" : "ok"
      seen++; failed += bad
    }
    END {
      if (!seen) { printf "%-48s no figures printed\n", bench; exit 1 }
      exit failed ? 1 : 0
    }' "$root/bench/guard-baseline.txt" "$out/$1.txt"
}

status=0
for b in "${names[@]}"; do
  run "$b"
  if ! judge "$b" > "$out/$b.table"; then
    cat "$out/$b.table"
    echo "bench-check: $b: a figure is past twice its goal; running it once more" >&2
    run "$b"
    judge "$b" > "$out/$b.table" || status=1
  fi
  cat "$out/$b.table"
done
if [ "$status" -ne 0 ]; then
  echo "bench-check: FAILED: a figure is worse than twice its goal in two runs (the table above; bench/README.md has each benchmark's full output and figures)" >&2
else
  echo "bench-check: every figure within its limit"
fi
exit "$status"
