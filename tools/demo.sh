#!/usr/bin/env bash
# The main job: build isorun and run an example task in a fresh, isolated worker.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
bin=${ISORUN_BUILD_DIR:-$root/build}/bin
echo "== isorun gpus"
"$bin/isorun" gpus
echo "== isorun --cpu --mem-limit 2G --timeout 30s hello name=isorun"
"$bin/isorun" --cpu --mem-limit 2G --timeout 30s hello name=isorun
echo "== the C++ API (examples/isolated_demo.cpp)"
"$bin/isolated_demo"
