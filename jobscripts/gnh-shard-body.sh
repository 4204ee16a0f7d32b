# SPDX-License-Identifier: BSD-3-Clause
# Sourced by gnh's batch scripts. gnh_shard_run TARGET GNH ARGS... launches
# gnh under srun and wires Slurm's warning signal to gnh's resume behaviour:
#   --signal=B:TERM@<s> delivers SIGTERM to this batch shell <s> seconds before
#   the time limit; it is forwarded to the job step, where gnh finishes the
#   current batch, keeps every finished group and exits with 143; the job is
#   then requeued (--requeue) and the rerun reuses the finished groups.
# TARGET: cpu (one rank per task) or gh200 (one GPU per rank, closest binding).

# gnh_binary BUILD_DIR: the gnh of GNH_HOME, an installed tree (bin/gnh) or a
# checkout (BUILD_DIR/bin/gnh).
gnh_binary() {
  if [ -x "$GNH_HOME/bin/gnh" ]; then
    echo "$GNH_HOME/bin/gnh"
  else
    echo "$GNH_HOME/$1/bin/gnh"
  fi
}

gnh_shard_run() {
  local target=$1
  shift
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
  export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
  local launcher=(srun --mpi="${GNH_SRUN_MPI:-pmix}")
  if [ "$target" = gh200 ]; then
    # One GPU per rank, bound to the closest CPU cores; Kokkos picks the
    # visible device. CUDA-aware MPI is assumed for device buffers.
    launcher+=(--gpus-per-task=1 --gpu-bind=closest)
    export KOKKOS_MAP_DEVICE_ID_BY=mpi_rank
  fi
  "${launcher[@]}" "$@" &
  local step=$!
  trap 'echo "gnh: SIGTERM from Slurm: letting the current batch finish"; kill -TERM "$step" 2>/dev/null' TERM
  local rc=0
  wait "$step" || rc=$?
  # wait returns early when the trap fires; wait for the step itself.
  while kill -0 "$step" 2>/dev/null; do
    rc=0
    wait "$step" || rc=$?
  done
  if [ "$rc" -eq 143 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    # The warning before the time limit leaves the job RUNNING: requeue it to
    # resume. A scancel has already marked it CANCELLED: leave it so.
    local state
    state=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    if [ "$state" = RUNNING ]; then
      echo "gnh: interrupted before the time limit; requeueing job $SLURM_JOB_ID to resume"
      scontrol requeue "$SLURM_JOB_ID"
    else
      echo "gnh: job $SLURM_JOB_ID is $state: not requeued; resubmit this script to resume"
    fi
  fi
  return "$rc"
}
