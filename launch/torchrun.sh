#!/usr/bin/env bash
# Single node: torchrun starts NPROC workers, each runs `python -m slime_hydra` as a worker.
#   launch/torchrun.sh [overrides...]        e.g. NPROC=2 launch/torchrun.sh parallel.dp=2
# Env knobs: NPROC (default 2), MAX_RESTARTS (default 0; trainer.max_restarts is the
#            in-process launcher's), RUN_DIR (one run dir for every rank; default a new timestamp),
#            DRY_RUN=1 prints the command instead of running it.
# trainer.nproc_per_node is ignored under torchrun: the world size is torchrun's.
set -euo pipefail
NPROC=${NPROC:-2}
RUN_DIR=${RUN_DIR:-outputs/runs/$(date +%Y-%m-%d)/$(date +%H-%M-%S)}
PYTHON=${PYTHON:-python}
cmd=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC"
     --max-restarts "${MAX_RESTARTS:-0}"
     -m slime_hydra "hydra.run.dir=$RUN_DIR" "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then echo "${cmd[@]}"; exit 0; fi
exec "${cmd[@]}"
