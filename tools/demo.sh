#!/usr/bin/env bash
# The main job: build isorun, run a task in a fresh isolated worker, then a hyperparameter sweep
# of the digits classifier (CPU slots when there is no GPU) and print its top-5 table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
bin=${ISORUN_BUILD_DIR:-$root/build}/bin
cd "$root"
echo "== isorun gpus"
"$bin/isorun" gpus
echo "== isorun --cpu --mem-limit 2G --timeout 30s hello name=isorun"
"$bin/isorun" --cpu --mem-limit 2G --timeout 30s hello name=isorun
echo "== isorun sweep examples/digits/digits_sweep.yaml   (re-running resumes; results in runs/digits/)"
"$bin/isorun" sweep examples/digits/digits_sweep.yaml
