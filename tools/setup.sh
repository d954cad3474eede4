#!/usr/bin/env bash
# Installs the Debian packages isorun needs, if any are missing. Safe to run repeatedly.
set -euo pipefail
packages=(build-essential cmake pkg-config libboost1.81-dev libcereal-dev catch2 nlohmann-json3-dev
          libxxhash-dev libyaml-cpp-dev zlib1g-dev libbenchmark-dev libmimalloc-dev libjemalloc-dev
          clang-14 libclang-rt-14-dev)  # the last two for tools/fuzz.sh (libFuzzer)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "isorun setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
fi
