#!/usr/bin/env bash
# The `slurm`-labelled tests: starts a single-node Slurm cluster in a temporary folder
# (cluster.sh), runs test_sweep's [slurm] cases against it, and stops it whatever happens.
# Exit 77 (ctest: skipped) where no cluster can be started here, saying why.
# usage: run_tests.sh TEST_SWEEP
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/isorun-slurm-XXXXXX)
chmod 755 "$dir"  # (the munge user must reach the cluster's folder)
trap '"$here/cluster.sh" stop "$dir/cluster"; rm -rf "$dir"' EXIT
out=$("$here/cluster.sh" start "$dir/cluster")
rc=$?
if [ $rc -ne 0 ]; then echo "$out"; exit $rc; fi
export "${out##*$'\n'}"  # SLURM_CONF=...
"$1" "[slurm]"
