#!/usr/bin/env bash
# On the device machine (one H200), from the repository root: install the carried wheels into
# /tmp/site, then run the whole check; results in $OUT (docs/gpu.md gives the `run` call).
#   bash benchmarks/gpu_check.sh [gpu_check.py check options, e.g. --budget-s 420]
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${GPU_WHEELS:-.gpu_wheels}
SITE=${GPU_SITE:-/tmp/site}
OUT=${OUT:-$PWD/outputs/gpu_check}
mkdir -p "$OUT"
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "no wheels in $WHEELS: run 'bash benchmarks/gpu_wheels.sh' here and carry $WHEELS" >&2
  exit 2
fi
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl || exit 3
echo "[gpu_check.sh] installed $(ls "$WHEELS"/*.whl | wc -l) wheels in $(($(date +%s) - start)) s"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
python3 benchmarks/gpu_check.py check --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
