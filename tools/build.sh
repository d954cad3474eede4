#!/usr/bin/env bash
# Configures and builds into build/ (or $ISORUN_BUILD_DIR). Extra arguments go to cmake.
#   tools/build.sh [--quiet] [CMAKE ARGS...]   --quiet: one progress line; the log only on failure
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
quiet=0
if [ "${1:-}" = "--quiet" ]; then quiet=1; shift; fi
"$root/tools/setup.sh"
build=${ISORUN_BUILD_DIR:-$root/build}
if [ $quiet -eq 0 ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${ISORUN_BUILD_TYPE:-RelWithDebInfo} "$@" > /dev/null
  cmake --build "$build" -j "$(nproc)"
  exit 0
fi
log=$(mktemp /tmp/isorun-build-XXXXXX.log)
start=$SECONDS
printf 'building isorun in %s (%s cores; a first build takes a few minutes)...' "$build" "$(nproc)"
if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${ISORUN_BUILD_TYPE:-RelWithDebInfo} "$@" > "$log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" >> "$log" 2>&1; then
  printf ' done in %ds\n' $((SECONDS - start))
  rm -f "$log"
else
  printf ' failed; the end of the log (%s):\n' "$log"
  tail -40 "$log"
  exit 1
fi
