#!/usr/bin/env bash
# Launch sparrow training on one node of a multi-node job (run this on every node).
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 NPROC_PER_NODE=8 \
#       scripts/launch_multinode.sh preset=...        # on node 0; NODE_RANK=1 on node 1
#
# Wraps torchrun with a c10d rendezvous hosted at MASTER_ADDR:MASTER_PORT; arguments are passed
# to `python -m sparrow.cli.train`. Defaults give a single-node run on this machine.
# With cluster.rollout_ranks=R the world's last R ranks (the last node's, when R is its
# NPROC_PER_NODE) run only the rollout engine and the others train:
#   NNODES=2 NODE_RANK=... MASTER_ADDR=node0 NPROC_PER_NODE=8 scripts/launch_multinode.sh \
#       cluster.rollout_ranks=8 ...                # node 1 rolls out for node 0's 8 trainers
# (rl.async.staleness=1, the draw one step ahead, takes one training rank for now).
# NPROC_PER_NODE defaults to the GPU count (1 process on a CPU-only node).
# RDZV_ID names the job (agents with different ids never join each other).
# SPARROW_ENTRY=path/to/script.py runs that script instead of sparrow.cli.train (tests use it).
# MAX_RESTARTS (default 0) is torchrun's --max-restarts: after a rank fails, every agent stops its
# workers and, while restarts are left, starts them all again; they resume=auto from the newest
# complete checkpoint. Each node must get the same value.
# Checkpoints under the run directory must be on a filesystem shared by all nodes.
# When a rank dies, the others exit at their next collective (exit code 4, one line); a rank that
# hangs instead is given up after actor.collective_timeout_min (60 min by default).
# torchrun's agent runs in sparrow/cli/launcher.py (so $PYTHON must import sparrow): a failed run
# ends with one line naming each failed local rank's exit, then the line the lowest of them
# stopped with, and this script exits with that rank's code (4 after a lost rank; 1 when no rank
# said why), where torchrun would end with its traceback and exit 1.
set -euo pipefail
# The Python whose torch runs the job: $PYTHON, else the checkout's .venv, else python3.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "${here}/.venv/bin/python" ]]; then PYTHON="${here}/.venv/bin/python"; else PYTHON=python3; fi
fi

NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
if [[ "${NNODES}" != 1 && -z "${MASTER_ADDR:-}" ]]; then
    # 127.0.0.1 would have every node host its own rendezvous and wait for the others forever.
    echo "launch_multinode.sh: NNODES=${NNODES} needs MASTER_ADDR, the address of node 0 that every" \
        "node can reach" >&2
    exit 2
fi
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
if [[ -z "${NPROC_PER_NODE:-}" ]]; then
    NPROC_PER_NODE="$("${PYTHON}" -c 'import torch; print(max(torch.cuda.device_count(), 1))')"
fi
RDZV_ID="${RDZV_ID:-sparrow}"
# After SIGTERM torchrun forwards it to the workers and SIGKILLs them 30 s later by default, too
# soon to finish a step and checkpoint it (sparrow's graceful stop). Torch versions that read
# this variable wait this long instead; it is also how long a node waits for its workers after
# one of them failed before it gives up on them.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-600}"

MAX_RESTARTS="${MAX_RESTARTS:-0}"
if [[ "${MAX_RESTARTS}" != 0 ]]; then
    # By default the restarted workers share the rendezvous store with the ones before them and
    # read the dead attempt's process-group addresses (gloo: "Connection refused", then a
    # connect timeout); with this, every attempt gets a fresh store on a free port of node 0.
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
fi

if [[ -n "${SPARROW_ENTRY:-}" ]]; then
    entry=("${SPARROW_ENTRY}")
else
    entry=(-m sparrow.cli.train)
fi

exec "${PYTHON}" -m sparrow.cli.launcher \
    --nnodes "${NNODES}" \
    --node_rank "${NODE_RANK}" \
    --nproc_per_node "${NPROC_PER_NODE}" \
    --rdzv_backend c10d \
    --rdzv_endpoint "${MASTER_ADDR}:${MASTER_PORT}" \
    --rdzv_id "${RDZV_ID}" \
    --max-restarts "${MAX_RESTARTS}" \
    "${entry[@]}" "$@"
