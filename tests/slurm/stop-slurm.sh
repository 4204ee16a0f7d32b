#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Stops the Slurm daemons started by start-slurm.sh STATE_DIR.
state=$(realpath -m "${1:?usage: stop-slurm.sh STATE_DIR}")
for pid in "$state/slurmd.pid" "$state/slurmctld.pid"; do
  [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null
done
exit 0
