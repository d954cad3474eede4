#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds an outside project against it with
# find_package(isorun), and runs both it and the installed CLI.
set -euo pipefail
build=$1
if [ ! -f "$build/cmake_install.cmake" ]; then
  echo "install test skipped: $build has no cmake_install.cmake (a packed copy of a build, not a build tree)"
  exit 77
fi
work=$(mktemp -d /tmp/isorun-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$(dirname "$0")/install_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
out=$("$work/consumer/consumer")
[ "$out" = "installed!" ] || { echo "consumer printed '$out'"; exit 1; }
# The installed CLI finds the installed example tasks without --tasks.
"$work/prefix/bin/isorun" --cpu -q hello name=prefix | grep -q '"hello, prefix"'
# ...and runs a command under the installed shim, with the installed cap library.
ISORUN_SIMULATE_GPUS=1x16G "$work/prefix/bin/isorun" --gpu 0 -q --mem-limit 64M -- /bin/sh -c 'echo "under $LD_PRELOAD"' | grep -q 'libisorun_cuda_cap.so'
# Neither tree looks for its libraries in the current folder: from a folder holding a libstdc++.so.6
# and a libisorun.so.0 that are not libraries, the CLI, the library and a task library still load
# (an empty RUNPATH entry, as CMake pads a build RUNPATH with, would load them and fail).
mkdir "$work/planted"
for lib in libstdc++.so.6 libisorun.so.0 libxxhash.so.0 libm.so.6 libc.so.6; do echo "not a library" > "$work/planted/$lib"; done
for cli in "$build/bin/isorun" "$work/prefix/bin/isorun"; do
  (cd "$work/planted" && "$cli" --cpu -q hello name=planted) | grep -q '"hello, planted"' ||
    { echo "$cli loads libraries from the current folder"; exit 1; }
done
echo "install test passed"
