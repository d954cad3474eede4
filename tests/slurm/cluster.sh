#!/usr/bin/env bash
# A single-node Slurm cluster on localhost, for the `slurm`-labelled tests: munged, slurmctld and
# slurmd (Debian 12's Slurm 22.05), all in DIR, with two fake GPUs for gres (character devices:
# slurmd only stat()s them and sets CUDA_VISIBLE_DEVICES from the trailing number).
#   cluster.sh start DIR   starts it; prints SLURM_CONF=DIR/slurm.conf once sinfo answers
#   cluster.sh stop DIR    stops every daemon it started
# Needs root (slurmd runs jobs as their users; munged runs as the munge user). Exit 77 where it
# cannot run, saying why.
set -uo pipefail
cmd=${1:?start or stop}
dir=${2:?DIR}
dir=$(realpath -m "$dir")

stop() {
  for d in slurmd slurmctld munged; do
    [ -f "$dir/$d.pid" ] && kill "$(cat "$dir/$d.pid")" 2> /dev/null
  done
  for d in slurmd slurmctld munged; do
    if [ -f "$dir/$d.pid" ]; then
      pid=$(cat "$dir/$d.pid")
      # Wait for it to go (bounded): the next cluster may reuse the ports.
      for _ in $(seq 1 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2> /dev/null
      rm -f "$dir/$d.pid"
    fi
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi

for b in munged slurmctld slurmd sbatch squeue scontrol setpriv; do
  command -v "$b" > /dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || { echo "no $b: install slurmctld slurmd slurm-client munge"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "a test Slurm cluster needs root (slurmd, munged)"; exit 77; }
id munge > /dev/null 2>&1 || { echo "no munge user (install munge)"; exit 77; }
# slurmd reads its node's cgroups at start, whatever the plugins: without a cgroup file system it
# never registers (a minimal container).
cgroup_fs=no
for d in /sys/fs/cgroup /sys/fs/cgroup/*; do
  case $(stat -f -c %T "$d" 2> /dev/null) in cgroup2fs|cgroupfs) cgroup_fs=yes ;; esac
done
if [ $cgroup_fs = no ]; then
  echo "no cgroup file system is mounted on /sys/fs/cgroup, and slurmd needs one (mount -t cgroup2 none /sys/fs/cgroup)"
  exit 77
fi

mkdir -p "$dir"/{state,spool,munge,log,dev}
chmod 755 "$dir"  # munged runs as the munge user: the folders on its way must be open to it
chown munge:munge "$dir/munge"
chmod 755 "$dir/munge"  # munged wants its socket's folder open to all (the key stays 0400)
# A key of our own, so nothing outside DIR is touched.
dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2> /dev/null
chown munge:munge "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
mknod "$dir/dev/nvidia0" c 195 0 2> /dev/null || [ -c "$dir/dev/nvidia0" ] || { echo "cannot mknod (no CAP_MKNOD)"; exit 77; }
mknod "$dir/dev/nvidia1" c 195 1 2> /dev/null || [ -c "$dir/dev/nvidia1" ]

# Free ports, so clusters of parallel tests do not meet.
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
cat > "$dir/slurm.conf" << CONF
ClusterName=isorun-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# (cred_expire is also how long a requeued job waits to start again: 2 minutes by default.)
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid.slurm
SlurmdPidFile=$dir/slurmd.pid.slurm
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
MaxArraySize=100001
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
cat > "$dir/gres.conf" << CONF
AutoDetect=off
Name=gpu File=$dir/dev/nvidia[0-1]
CONF

setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground \
  --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
  --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" > "$dir/log/munged.out" 2>&1 &
echo $! > "$dir/munged.pid"
for _ in $(seq 1 100); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
if [ ! -S "$dir/munge/munge.socket" ]; then
  echo "munged did not start:"; tail -3 "$dir/log/munged.out"; stop; exit 1
fi
export SLURM_CONF=$dir/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" > "$dir/log/slurmctld.out" 2>&1 &
echo $! > "$dir/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" > "$dir/log/slurmd.out" 2>&1 &
echo $! > "$dir/slurmd.pid"
# Up when the node takes jobs (bounded, 60 s: a daemon that failed shows in the logs).
start=$SECONDS
while [ $((SECONDS - start)) -lt 60 ]; do
  state=$(timeout 5 sinfo -h -o %t 2> /dev/null | head -1)
  case "$state" in idle|mix|alloc) echo "SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.1
done
# DIR goes with the test: the logs are kept elsewhere, and their ends shown here.
stop
keep=$(mktemp -d /tmp/isorun-slurm-logs-XXXXXX)
cp -r "$dir/log/." "$dir/munge/munged.log" "$keep/" 2> /dev/null
echo "the test cluster did not come up (node state '${state:-none}'); its logs are kept in $keep:"
for f in "$keep"/*; do
  [ -s "$f" ] || continue
  echo "--- $(basename "$f"), last lines:"
  tail -n 15 "$f"
done
if grep -qs 'No filesystem mounted on /sys/fs/cgroup' "$keep"/slurmd.*; then
  echo "skipped: slurmd found no cgroup file system on /sys/fs/cgroup (see slurmd.log above)"
  exit 77
fi
exit 1
