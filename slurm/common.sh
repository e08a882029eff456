# shellcheck shell=bash
# Sourced by the sbatch scripts in this folder (they find it via SLURM_SUBMIT_DIR: submit from
# the repository root, or set TRAINBOX_SLURM_DIR). Knobs, all optional:
#   TRAINBOX_SIF    the image: a .sif path (default ./train.sif)
#   TRAINBOX_RUNS   host directory mounted at /runs for run_dir and checkpoints (default ./runs)
#   MASTER_ADDR / MASTER_PORT   rank 0's host and port (default: first node, a port from the job id)
#   NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME   the interface NCCL / gloo use between nodes
#     (e.g. ib0 or eth0; they pass into the container, as every variable does without --cleanenv)
#   NCCL_IB_HCA / NCCL_NET_PLUGIN   the site's RDMA settings, exported here, never baked into the
#     image; `srun ... apptainer run --nv train.sif doctor` says whether NCCL can use the HCAs
#     (apptainer/README.md, "On an InfiniBand or RoCE cluster")

trainbox_defaults() {
  TRAINBOX_SIF=${TRAINBOX_SIF:-train.sif}
  TRAINBOX_RUNS=${TRAINBOX_RUNS:-$SLURM_SUBMIT_DIR/runs}
  mkdir -p "$TRAINBOX_RUNS"
  # The batch shell knows the whole allocation; every rank must agree on one address and port.
  : "${MASTER_ADDR:=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"
  : "${MASTER_PORT:=$((20000 + SLURM_JOB_ID % 10000))}"
  export TRAINBOX_SIF TRAINBOX_RUNS MASTER_ADDR MASTER_PORT
}

# Run one step in the background so this shell can take Slurm's USR1 (sent by
# --signal=B:USR1@lead to the batch shell only) and forward it; srun passes USR1 to every task,
# where trainbox checkpoints and exits 143. The batch shell then requeues the job itself:
# scontrol is not inside the container.
trainbox_step() {
  local step rc
  "$@" &
  step=$!
  trap 'echo "trainbox: preemption signal, forwarding USR1 to the step"; kill -USR1 "$step" 2>/dev/null' USR1
  trap 'kill -TERM "$step" 2>/dev/null' TERM
  while :; do
    rc=0
    wait "$step" || rc=$?
    # `wait` also returns when a trapped signal arrives; only a finished step ends the loop.
    kill -0 "$step" 2>/dev/null || break
  done
  trap - USR1 TERM
  if [[ $rc -eq 143 ]]; then
    echo "trainbox: step stopped after a checkpoint (exit 143); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    return 0
  fi
  return "$rc"
}
