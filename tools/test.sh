#!/usr/bin/env bash
# Builds and runs the whole test suite.
#   tools/test.sh                      build into build/, run every test (ctest -j2)
#   tools/test.sh --sanitize           build with ASan+UBSan into build-asan/, run all but the multi-GiB tests
#   tools/test.sh --repeat N [ARGS]    build, then run the suite N times in a row under -j2, stopping at
#                                      the first failing run; ARGS go to ctest (default: -LE
#                                      "large|install|slurm|browser"). Every failing run's full log
#                                      is kept in build/test-logs/. See docs/testing.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repeat=0
if [ "${1:-}" = "--sanitize" ]; then
  export ISORUN_BUILD_DIR=$root/build-asan ISORUN_BUILD_TYPE=Debug
  "$root/tools/build.sh" -DISORUN_SANITIZE=ON -DISORUN_BUILD_BENCH=OFF
  exclude=(-LE "large|gpu|install")
elif [ "${1:-}" = "--repeat" ]; then
  repeat=${2:?--repeat N: how many runs}
  [[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: --repeat takes a whole number of runs, not '$repeat'" >&2; exit 2; }
  shift 2
  "$root/tools/build.sh" --quiet
  exclude=("$@")
  [ $# -gt 0 ] || exclude=(-LE "large|install|slurm|browser")
else
  "$root/tools/build.sh"
  exclude=()
fi
build=${ISORUN_BUILD_DIR:-$root/build}
cd "$build"
if [ "$repeat" -eq 0 ]; then
  ctest --output-on-failure -j 2 "${exclude[@]}"
  exit
fi

# Whole-suite runs, as CI has them (ctest's own --repeat would rerun each test alone, away from
# the load its neighbours make). A failing run's console output and ctest's LastTest.log (every
# test's full output and time) are kept together, named by date and run.
logs=$build/test-logs
mkdir -p "$logs"
for i in $(seq 1 "$repeat"); do
  start=$SECONDS
  console=$(mktemp "$logs/.run-XXXXXX")
  if ctest --output-on-failure -j 2 "${exclude[@]}" > "$console" 2>&1; then
    printf 'run %d of %d: passed in %ds\n' "$i" "$repeat" $((SECONDS - start))
    rm -f "$console"
  else
    kept=$logs/failed-$(date +%Y%m%d-%H%M%S)-run$i
    mv "$console" "$kept.console.log"
    cp Testing/Temporary/LastTest.log "$kept.LastTest.log" 2> /dev/null || true
    printf 'run %d of %d: FAILED in %ds; kept %s.console.log and %s.LastTest.log\n' "$i" "$repeat" \
      $((SECONDS - start)) "$kept" "$kept"
    grep -E '^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)' "$kept.console.log" || true
    exit 1
  fi
done
echo "$repeat of $repeat runs passed"
