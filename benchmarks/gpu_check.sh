#!/usr/bin/env bash
# On a GPU machine, from the repository root: make the packages importable, then run the whole
# check; results in $OUT (docs/gpu.md gives the device tool's `run` call).
#   bash benchmarks/gpu_check.sh [gpu_check.py check options, e.g. --budget-s 420]
# Packages, the first way that applies:
#   1. wheels carried in $GPU_WHEELS (default .gpu_wheels, from benchmarks/gpu_wheels.sh):
#      installed into $GPU_SITE (default /tmp/site) without an index, the image's torch kept;
#   2. megatron-core, hydra-core and omegaconf already importable: used as they are;
#   3. otherwise `pip install -e .` from the package registries (PyPI's Linux torch==2.13.0 is
#      a CUDA build).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${GPU_WHEELS:-.gpu_wheels}
SITE=${GPU_SITE:-/tmp/site}
OUT=${OUT:-$PWD/outputs/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
start=$(date +%s)
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || exit 3
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "[gpu_check.sh] installed $(ls "$WHEELS"/*.whl | wc -l) carried wheels into $SITE"
elif "$PY" -c "import megatron.core, hydra, omegaconf" 2>/dev/null; then
  echo "[gpu_check.sh] megatron-core, hydra-core and omegaconf are importable: using them"
else
  echo "[gpu_check.sh] no wheels in $WHEELS: pip install -e . from the package registries"
  "$PY" -m pip install -q -e . || exit 3
fi
echo "[gpu_check.sh] packages ready in $(($(date +%s) - start)) s"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
"$PY" benchmarks/gpu_check.py check --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
