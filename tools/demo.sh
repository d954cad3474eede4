#!/usr/bin/env bash
# What isorun is for, in two minutes: build quietly, run a task in a fresh isolated worker, show
# that a crash, a hang and a memory hog are each contained and reported while the supervisor
# carries on, then run a 48-trial hyperparameter sweep of the digits classifier (CPU slots when
# there is no GPU; re-running resumes) and print its top-5 table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh" --quiet
bin=${ISORUN_BUILD_DIR:-$root/build}/bin
cd "$root"

show() {  # show CMD...: print the command, run it, print its exit status
  printf '\n$ isorun %s\n' "$*"
  set +e
  "$bin/isorun" "$@"
  local code=$?
  set -e
  printf '(exit %d)\n' "$code"
}

echo; echo "== The GPU inventory"
"$bin/isorun" gpus
echo; echo "== A task in a fresh worker process, under a 2 GiB cap and a 30 s timeout"
show --cpu --mem-limit 2G --timeout 30s hello name=isorun
echo; echo "== Containment: each failure stays in its worker, is classified, and the supervisor carries on"
show --cpu segfault
show --cpu --timeout 1s --grace 200ms nap arg0=60
show --cpu --mem-limit 256M fill_memory arg0=1024
echo; echo "== A sweep: 48 isolated, capped trials of a digits classifier (re-running resumes; results in runs/digits/)"
"$bin/isorun" sweep examples/digits/digits_sweep.yaml
