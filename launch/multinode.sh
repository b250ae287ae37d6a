#!/usr/bin/env bash
# Multi-node: run this once per node (same arguments everywhere) with a shared filesystem.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 RUN_DIR=/shared/runs/exp1 launch/multinode.sh \
#     trainer=gpu parallel.dp=4 parallel.tp=4
# Env knobs: NNODES, NODE_RANK, MASTER_ADDR (required), MASTER_PORT (29500), NPROC (GPUs per
# node, default 8), MAX_RESTARTS (default 0), RUN_DIR (required: every rank on every node must write the same run dir),
# DRY_RUN=1 prints the command. world size = NNODES × NPROC must equal dp × tp × pp × cp.
set -euo pipefail
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
: "${RUN_DIR:?set RUN_DIR to one directory on a filesystem all nodes share}"
NPROC=${NPROC:-8}
MASTER_PORT=${MASTER_PORT:-29500}
PYTHON=${PYTHON:-python}
cmd=("$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --node-rank "$NODE_RANK"
     --nproc-per-node "$NPROC" --max-restarts "${MAX_RESTARTS:-0}" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"
     --rdzv-id "slime_hydra-$(basename "$RUN_DIR")"
     -m slime_hydra "hydra.run.dir=$RUN_DIR" "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then echo "${cmd[@]}"; exit 0; fi
exec "${cmd[@]}"
