#!/usr/bin/env bash
# A real SLURM on one machine: starts munged, slurmctld and slurmd (Debian's slurm-wlm and munge:
# `apt-get install slurm-wlm munge`) in a temporary folder, sends a sweep through sbatch with
# hydra/launcher=slurm, compares its jobs, then stops the daemons and removes the folder.
#
#   bash bench/slurm.sh                    # the sweep: heads=1,2 seed=1,2 model=micro, 4 jobs
#   bash bench/slurm.sh train.max_steps=40 # more settings for every job
#
# Prints the compare table (docs/cluster.md quotes one) and, before it, the refusals a user meets
# on a CPU-only cluster: the shipped launcher's GPU and an unknown partition, each one line.
# Run as root or as a user who may start daemons; the ports are drawn free above 20000.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin
  command -v "$tool" >/dev/null || { echo "slurm.sh: $tool missing: apt-get install slurm-wlm munge" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/microgpt-slurm.XXXXXX")
chmod 755 "$tmp"  # munged refuses a group- or world-writable folder on its socket's path
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done; done
  rm -rf "$tmp"
}
trap stop EXIT

# munge: its own key, socket and files in the folder
mkdir -m 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/key"
munged --foreground --force --key-file="$tmp/munge/key" --socket="$tmp/munge/socket" \
  --pid-file="$tmp/munge/pid" --log-file="$tmp/munge/log" --seed-file="$tmp/munge/seed" 2>>"$tmp/daemons.log" &
pids+=($!)
for _ in $(seq 50); do [ -S "$tmp/munge/socket" ] && break; sleep 0.1; done

# slurm: one node, this machine, its cores and memory; one CPU partition
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
node=$(slurmd -C | head -1)  # NodeName=... CPUs=... RealMemory=...: what slurmd finds here
mkdir -p "$tmp/state" "$tmp/spool"
cat > "$tmp/slurm.conf" <<EOF
ClusterName=microgpt
SlurmctldHost=$(hostname -s)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
$node State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -f "$SLURM_CONF" 2>>"$tmp/daemons.log" &
pids+=($!)
slurmd -D -f "$SLURM_CONF" 2>>"$tmp/daemons.log" &
pids+=($!)
for _ in $(seq 100); do
  sinfo -h -o %T 2>/dev/null | grep -qx idle && break
  sleep 0.3
done
sinfo -h -o %T | grep -qx idle || { echo "slurm.sh: the node never came up:" >&2; tail -n 20 "$tmp"/daemons.log >&2; exit 1; }
echo "slurm.sh: a one-node cluster is up ($(sinfo -h -o '%P %D node, %c cpus, %m MB')) in $tmp"

sweep=$tmp/sweep
refused() {  # a job the scheduler refuses: exit 2, one error line last, no folder left
  echo "\$ python train.py -m heads=1 model=micro hydra/launcher=slurm $*"
  set +e
  out=$("$python" train.py -m heads=1 model=micro train.max_steps=4 hydra/launcher=slurm \
    hydra.sweep.dir="$tmp/refused" "$@" 2>&1)
  status=$?
  set -e
  echo "$out"
  [ "$status" = 2 ] && [[ "$(tail -n 1 <<<"$out")" == "microgpt: error: SLURM refused"* ]] \
    && [ ! -e "$tmp/refused" ] || { echo "slurm.sh: expected one error line, exit 2" >&2; exit 1; }
}
refused hydra.launcher.partition=cpu                    # the shipped config asks for a GPU
refused hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=0   # no such partition

echo "\$ python train.py -m heads=1,2 seed=1,2 model=micro hydra/launcher=slurm (CPU settings)"
"$python" train.py -m heads=1,2 seed=1,2 model=micro hydra/launcher=slurm \
  hydra.launcher.partition=cpu hydra.launcher.gpus_per_node=0 hydra.launcher.cpus_per_task=1 \
  hydra.launcher.mem_gb=1 hydra.launcher.timeout_min=30 hydra.sweep.dir="$sweep" "$@"
echo "\$ python -m microgpt.compare SWEEP"
"$python" -m microgpt.compare "$sweep"
