#!/usr/bin/env bash
# cluster.sh on a machine without a cgroup file system (a minimal container): it must skip (77)
# saying why, before any daemon starts, instead of failing with a node that never registers.
# Made here by an empty tmpfs over /sys/fs/cgroup in a mount namespace of this test's own.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
unshare -m true 2> /dev/null || { echo "skipped: no mount namespace can be made here (needs root)"; exit 77; }
dir=$(mktemp -d /tmp/isorun-slurm-nocg-XXXXXX)
trap 'rm -rf "$dir"' EXIT
out=$(unshare -m bash -c 'mount -t tmpfs none /sys/fs/cgroup && exec "$1" start "$2"' _ "$here/cluster.sh" "$dir/c" 2>&1)
rc=$?
echo "$out"
case "$out" in "no "*": install"*|"a test Slurm cluster needs root"*|"no munge user"*) echo "skipped"; exit 77 ;; esac
[ $rc -eq 77 ] || { echo "FAILED: cluster.sh exited $rc, not 77"; exit 1; }
case "$out" in *"no cgroup file system is mounted on /sys/fs/cgroup"*) ;; *) echo "FAILED: the reason is not given"; exit 1 ;; esac
[ ! -e "$dir/c/slurmd.pid" ] || { echo "FAILED: a daemon was started"; exit 1; }
echo "passed: skipped with the reason, nothing started"
