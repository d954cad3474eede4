#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each for SECONDS (default 30)
# on a copy of its committed seed corpus (tests/fuzz/corpus/TARGET). Exit 0 when none found a
# crash, a leak or a timeout; otherwise the failing input is saved as build-fuzz/crashes/TARGET-*.
#   tools/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
shift || true
build=$root/build-fuzz
log=$build/build.log
mkdir -p "$build"
"$root/tools/setup.sh"
if ! command -v clang++-14 > /dev/null; then
  echo "fuzz: clang++-14 is missing (apt-get install clang-14 libclang-rt-14-dev)"; exit 1
fi
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DISORUN_FUZZ=ON \
  -DISORUN_BUILD_TESTS=OFF -DISORUN_BUILD_BENCH=OFF -DISORUN_BUILD_EXAMPLES=OFF > "$log" 2>&1 ||
  { tail -30 "$log"; exit 1; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_result fuzz_request fuzz_control fuzz_spec fuzz_journal fuzz_words fuzz_report fuzz_cap_env)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >> "$log" 2>&1 || { tail -30 "$log"; exit 1; }
mkdir -p "$build/crashes"
failed=0
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  cp -r "$root/tests/fuzz/corpus/$t/." "$work/"
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: one over 2 GiB a memory blow-up.
  if "$build/bin/$t" "$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="$build/crashes/$t-" -print_final_stats=1 > "$build/$t.log" 2>&1; then
    echo "fuzz: $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$build/$t.log" | grep -o '[0-9]*$') runs in ${seconds}s, $(ls "$work" | wc -l) inputs in the corpus, $(grep -o 'cov: [0-9]*' "$build/$t.log" | tail -1), no crash"
  else
    echo "fuzz: $t FAILED:"; grep -A15 -m1 'ERROR\|==ERROR\|deadly signal\|timeout' "$build/$t.log" | head -30
    failed=1
  fi
  rm -rf "$work"
done
exit $failed
