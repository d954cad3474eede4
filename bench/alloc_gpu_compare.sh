#!/usr/bin/env bash
# isorun's allocator on GPU 0 (alloc_replay --backend cuda) and PyTorch's caching allocator
# (bench/torch_replay.py, with expandable_segments and with its default), on the same traces,
# one after the other in one run. See bench/README.md, "Allocator: trace replay".
#   [ALLOC_TRACES="gpt2_small_step ..."] bench/alloc_gpu_compare.sh [BUILD_DIR]      (default: build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/bin
dir=$(mktemp -d /tmp/isorun-alloc-compare-XXXXXX)
trap 'rm -rf "$dir"' EXIT
traces=(${ALLOC_TRACES:-gpt2_small_step resnet50_step ramp_batch random_100k_1GiB})  # ALLOC_TRACES: fewer, where device time is short
for t in "${traces[@]}"; do "$bin/alloc_replay" --write "$t" "$dir/$t"; done
for t in "${traces[@]}"; do "$bin/alloc_replay" --backend cuda --trace "$dir/$t" | tail -n +5; done
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  for conf in expandable_segments:True ""; do
    PYTORCH_CUDA_ALLOC_CONF=$conf python3 "$root/bench/torch_replay.py" "${traces[@]/#/$dir/}"
  done
else
  echo "alloc_gpu_compare: PyTorch with CUDA is not available here: no PyTorch figures"
fi
