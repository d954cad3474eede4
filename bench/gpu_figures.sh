#!/usr/bin/env bash
# The figures the fast-path work still needs from a GPU machine, in one run (device time is
# scarce): results made on the GPU against a pinned cudaMemcpy (bench_gpu a, with the chunk
# hashes computed on the device and, interleaved, on the worker's CPU), the expandable
# strategy through the CUDA backend beside PyTorch's allocator (alloc_gpu_compare.sh), and the
# CPU result figures on that machine's cores (bench_core --quick). See bench/README.md.
#   bench/gpu_figures.sh [BUILD_DIR]      (default: build/)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bin
unset ISORUN_SIMULATE_GPUS
if ! "$bin/isorun" gpus | grep -q '^GPU inventory: NVML'; then
  echo "gpu_figures: no GPU found through NVML; nothing to measure here"; exit 77
fi
status=0
section() { echo; echo "== $* ($(date -u +%H:%M:%S), $(nproc) cores)"; }

section "bench_gpu: results made on the GPU, 1 GiB and 4 GiB, against a pinned cudaMemcpy"
BENCH_BREAKDOWN=1 "$bin/bench_gpu" --only a --sizes 1024,4096 --reps 7 || status=1
section "where a streamed 1 GiB result's time goes, device hash and CPU hash (ISORUN_STREAM_TRACE)"
ISORUN_STREAM_TRACE=1 "$bin/bench_gpu" --only a --streamed-only --sizes 1024 --reps 2 || status=1
section "the expandable strategy through the CUDA backend, and PyTorch's allocator on the same traces"
"$root/bench/alloc_gpu_compare.sh" "$build" || status=1
section "bench_core --quick: CPU results on this machine's cores"
"$bin/bench_core" --quick || status=1
exit $status
