#!/usr/bin/env bash
# Builds and runs the whole test suite. `tools/test.sh --sanitize` builds with ASan+UBSan into
# build-asan/ and runs everything but the multi-GiB tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--sanitize" ]; then
  export ISORUN_BUILD_DIR=$root/build-asan ISORUN_BUILD_TYPE=Debug
  "$root/tools/build.sh" -DISORUN_SANITIZE=ON -DISORUN_BUILD_BENCH=OFF
  exclude=(-LE "large|gpu|install")
else
  "$root/tools/build.sh"
  exclude=()
fi
cd "${ISORUN_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j 2 "${exclude[@]}"
