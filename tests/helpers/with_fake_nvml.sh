#!/bin/sh
# Runs COMMAND with the stand-in libnvidia-ml.so.1 in DIR found first, in front of the library path
# the test inherits (a packed build on a GPU machine finds its own dependencies there).
#   with_fake_nvml.sh DIR COMMAND [ARG...]
# Refuses to run without the stand-in: the real NVML of a GPU machine would be found instead.
dir=$1; shift
if [ ! -f "$dir/libnvidia-ml.so.1" ]; then
  echo "with_fake_nvml.sh: the stand-in NVML is missing from $dir" >&2
  exit 1
fi
LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$@"
