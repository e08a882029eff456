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
#   TRAINBOX_NODE_RETRIES   how many times a job comes back without a node that failed it (exit 3:
#     a GPU fault or a fatal preflight finding; exit 4: ranks that died), as trainbox recorded it
#     in run_dir/bad_nodes/ (default 2; 0: never). docs/reliability.md, "the next attempt
#     without the bad node"
#   TRAINBOX_RUN_DIR   run_dir as this shell sees it (default $TRAINBOX_RUNS/$SLURM_JOB_NAME,
#     where the scripts' run_dir=/runs/$SLURM_JOB_NAME lands); set it when you override run_dir

trainbox_defaults() {
  TRAINBOX_SIF=${TRAINBOX_SIF:-train.sif}
  TRAINBOX_RUNS=${TRAINBOX_RUNS:-$SLURM_SUBMIT_DIR/runs}
  TRAINBOX_RUN_DIR=${TRAINBOX_RUN_DIR:-$TRAINBOX_RUNS/$SLURM_JOB_NAME}
  TRAINBOX_NODE_RETRIES=${TRAINBOX_NODE_RETRIES:-2}
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
  rc=$(trainbox_step_code "$rc" "$(trainbox_bad_codes "$TRAINBOX_RUN_DIR" "$SLURM_JOB_ID" \
    "${SLURM_RESTART_COUNT:-0}")")
  if [[ $rc -eq 143 ]]; then
    echo "trainbox: step stopped after a checkpoint (exit 143); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    return 0
  fi
  if [[ $rc -eq 3 || $rc -eq 4 ]] && trainbox_without_bad_nodes "$rc"; then
    return 0
  fi
  return "$rc"
}

# Exit 3 or 4 with a node recorded bad for this attempt: requeue the job without it, when the
# partition can still hold the job and retries are left; else one line saying why not.
trainbox_without_bad_nodes() {
  local rc=$1 bad excluded needed usable retried decision
  bad=$(trainbox_bad_hosts "$TRAINBOX_RUN_DIR" "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" |
    paste -sd' ' -)
  excluded=$(trainbox_job_field ExcNodeList)
  [[ $excluded == "(null)" ]] && excluded=""
  excluded=$( (if [[ -n $excluded ]]; then scontrol show hostnames "$excluded"; fi
    tr ' ' '\n' <<< "$bad") | sed '/^$/d' | sort -u | paste -sd, -)
  needed=${SLURM_JOB_NUM_NODES:-1}
  usable=$(sinfo -h -N -p "${SLURM_JOB_PARTITION:-}" -o '%N %t' | trainbox_usable_nodes "$excluded")
  retried=$(trainbox_node_retries_done "$TRAINBOX_RUN_DIR" "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}")
  decision=$(trainbox_node_decision "$rc" "$retried" "$TRAINBOX_NODE_RETRIES" "$needed" \
    "$usable" "$bad" "$excluded")
  if [[ $decision != requeue ]]; then
    echo "trainbox: not requeueing job $SLURM_JOB_ID after exit $rc: ${decision#stop: }"
    return 1
  fi
  echo "trainbox: exit $rc on bad node(s) $bad (run_dir/bad_nodes); requeueing job" \
    "$SLURM_JOB_ID without $excluded (node retry $((retried + 1)) of $TRAINBOX_NODE_RETRIES)"
  trainbox_requeue_excluding "$SLURM_JOB_ID" "$excluded"
}

# Slurm takes a job's ExcNodeList only while the job is pending (a running job's update fails
# with "Job is no longer pending execution"): hold it pending, exclude, then let it go. The
# requeue ends this shell's job; TERM is ignored so that the last two calls still happen.
trainbox_requeue_excluding() {
  local job=$1 hosts=$2 ok=0
  trap '' TERM
  scontrol requeuehold "$job" || return 1
  scontrol update JobId="$job" ExcNodeList="$hosts" || ok=1
  scontrol release "$job" || ok=1
  return "$ok"
}

# The hosts trainbox recorded bad in attempt JOB.RESTARTS of RUN_DIR, one a line: the folder
# names, so this shell needs no Python (src/trainbox/process/bad_nodes.py writes them).
trainbox_bad_hosts() {
  local dir=$1/bad_nodes/$2.$3
  if [[ -d $dir ]]; then
    find "$dir" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort
  fi
}

# The exit codes recorded with the bad nodes of attempt JOB.RESTARTS, lowest first (the records
# are trainbox's own one-line JSON, process/bad_nodes.py).
trainbox_bad_codes() {
  local dir=$1/bad_nodes/$2.$3
  if [[ -d $dir ]]; then
    find "$dir" -name 'rank-*.json' -exec grep -ho '"exit_code": *[0-9]*' {} + |
      grep -o '[0-9]*$' | sort -un | paste -sd' ' - || true
  fi
}

# Pure: the exit code a failed step stands for. srun reports its tasks' highest code, and when one
# node fails (exit 3 or 4) --kill-on-bad-exit stops the others, which exit 143 as if preempted:
# a node recorded bad for this attempt is what happened. Arguments: srun's code, recorded codes.
trainbox_step_code() {
  local rc=$1 recorded=$2
  if [[ $rc -ne 0 && -n $recorded ]]; then
    echo "${recorded%% *}"
  else
    echo "$rc"
  fi
}

# How many earlier attempts of job JOB (before restart RESTARTS) ended on a recorded bad node:
# each of them came back once without it.
trainbox_node_retries_done() {
  local run_dir=$1 job=$2 restarts=$3 count=0 dir
  for dir in "$run_dir/bad_nodes/$job".*; do
    [[ -d $dir && ${dir##*.} =~ ^[0-9]+$ ]] || continue
    if ((${dir##*.} < restarts)); then
      count=$((count + 1))
    fi
  done
  echo "$count"
}

# sinfo's "NODE STATE" lines on stdin: how many nodes can run a job, the EXCLUDED (a,b,c) aside.
trainbox_usable_nodes() {
  local excluded=",$1," node state count=0
  declare -A seen=()
  while read -r node state; do
    [[ -n $node && -z ${seen[$node]:-} ]] || continue
    seen[$node]=1
    [[ $excluded == *",$node,"* ]] && continue
    # Down, drained, failing or not yet there: the scheduler will not start a job on them.
    [[ $state =~ ^(down|drain|drng|fail|maint|futr|inval|unk|npc|boot|powered_down) ]] &&
      continue
    count=$((count + 1))
  done
  echo "$count"
}

# Pure: come back without the bad nodes ("requeue") or not ("stop: WHY"). Arguments: the exit
# code, node retries done and allowed, nodes the job needs and nodes usable without EXCLUDED,
# the bad hosts (space-separated), EXCLUDED (comma-separated).
trainbox_node_decision() {
  local rc=$1 retried=$2 allowed=$3 needed=$4 usable=$5 bad=$6 excluded=$7
  if [[ -z $bad ]]; then
    echo "stop: no bad node recorded for this attempt in run_dir/bad_nodes (exit $rc names" \
      "no host to leave out; see the error line above)"
  elif ((retried >= allowed)); then
    echo "stop: $bad failed it, and the job came back without a bad node $retried time(s)" \
      "already (TRAINBOX_NODE_RETRIES=$allowed)"
  elif ((usable < needed)); then
    echo "stop: $bad failed it; without $excluded the partition has $usable usable node(s)" \
      "and the job needs $needed"
  else
    echo requeue
  fi
}

# One field of this job's `scontrol show job` (empty if absent).
trainbox_job_field() {
  scontrol show job -o "$SLURM_JOB_ID" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
