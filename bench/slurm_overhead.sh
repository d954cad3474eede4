#!/usr/bin/env bash
# What running a sweep's trials through Slurm costs per trial, next to running them here: 100
# trivial trials (plain_number) on 2 slots, the local backend and the Slurm backend (one trial
# per array task, and 10 per task) on a single-node cluster started for the purpose
# (tests/slurm/cluster.sh; needs root and Debian's slurmctld slurmd slurm-client munge). The three
# run in turn, ROUNDS times (default 3), so the machine's noise falls on all of them; medians and
# spread (min-max) are printed, and the overhead per trial against the local median.
#   bench/slurm_overhead.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
rounds=${2:-3}
work=$(mktemp -d /tmp/isorun-slurm-bench-XXXXXX)
chmod 755 "$work"
trap '"$root/tests/slurm/cluster.sh" stop "$work/cluster"; rm -rf "$work"' EXIT
out=$("$root/tests/slurm/cluster.sh" start "$work/cluster") || { echo "$out"; exit 1; }
export "${out##*$'\n'}"
isorun=("$build/bin/isorun" --tasks "$build/lib/sweep_test_tasks.so")
spec() {  # spec NAME BACKEND TRIALS_PER_TASK
  printf 'task: plain_number\nparams:\n  arg0: {range: [0, 99], step: 1}\nresources: {backend: %s, cpu_slots: 2, standby: 0, trials_per_task: %s}\nout: "%s"\n' \
    "$2" "$3" "$work/$1-out" | sed 's/, trials_per_task: -//' > "$work/$1.yaml"
}
spec local local -
spec slurm1 slurm 1
spec slurm10 slurm 10
declare -A times
for r in $(seq 1 "$rounds"); do
  for kind in local slurm1 slurm10; do
    rm -rf "$work/$kind-out"
    t0=$(date +%s.%N)
    "${isorun[@]}" sweep "$work/$kind.yaml" --no-progress > /dev/null 2> "$work/$kind.err" || { cat "$work/$kind.err"; exit 1; }
    t1=$(date +%s.%N)
    [ "$(wc -l < "$work/$kind-out/results.jsonl")" -eq 100 ] || { echo "$kind: not 100 trials journaled"; exit 1; }
    times[$kind]+="$(echo "$t1 - $t0" | bc) "
  done
done
python3 - "${times[local]}" "${times[slurm1]}" "${times[slurm10]}" << 'PY'
import statistics, sys
rows = [("local backend, 2 slots", sys.argv[1]), ("Slurm, 1 trial per array task", sys.argv[2]),
        ("Slurm, 10 trials per array task", sys.argv[3])]
local = statistics.median(float(x) for x in sys.argv[1].split())
print(f"100 trivial trials, {len(sys.argv[1].split())} rounds (median, min-max):")
for name, xs in rows:
    v = sorted(float(x) for x in xs.split())
    m = statistics.median(v)
    extra = "" if name.startswith("local") else f"   +{(m - local) / 100 * 1000:.0f} ms per trial, {m / local:.1f}x local"
    print(f"  {name:34s} {m:6.2f} s ({v[0]:.2f}-{v[-1]:.2f}){extra}")
PY
