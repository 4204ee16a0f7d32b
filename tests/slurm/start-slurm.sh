#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Starts a real single-node Slurm (munge, slurmctld, slurmd; Debian's packages)
# for the tests, with its configuration and state under STATE_DIR, and waits
# until the node is idle. Prints the SLURM_CONF path. Needs root.
#   tests/slurm/start-slurm.sh STATE_DIR        stop-slurm.sh STATE_DIR stops it.
set -euo pipefail
state=$(realpath -m "${1:?usage: start-slurm.sh STATE_DIR}")
mkdir -p "$state"/{spool,ctld,log}
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2 ))

if ! pgrep -x munged > /dev/null; then
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
fi

# Ports chosen per state directory, so a stale daemon elsewhere does not answer.
port=$(( 20000 + $(cksum <<< "$state" | cut -d' ' -f1) % 20000 ))
cat > "$state/slurm.conf" <<CONF
ClusterName=gnhtest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=3600
SchedulerParameters=sched_interval=1
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$state/slurm.conf"
/usr/sbin/slurmctld -f "$SLURM_CONF"
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 1 60); do
  if sinfo -h -o '%t' 2>/dev/null | grep -q -E '^idle'; then
    echo "$SLURM_CONF"
    exit 0
  fi
  sleep 1
done
echo "start-slurm.sh: the node did not become idle; see $state/log" >&2
sinfo >&2 || true
exit 1
