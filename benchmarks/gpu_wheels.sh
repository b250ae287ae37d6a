#!/usr/bin/env bash
# Download, here, the wheels that benchmarks/gpu_check.sh installs on the device machine:
# megatron-core, hydra-core, omegaconf, antlr4-python3-runtime, wandb and those of their
# dependencies the device's image lacks (benchmarks/gpu/wheels.py: DEVICE_PACKAGES), for the
# device's CPython (GPU_PYTHON_VERSION, default 3.12: the lent image's) on manylinux x86_64.
# torch is never downloaded: the device has 2.11+cu130.
#   bash benchmarks/gpu_wheels.sh [DEST]          # DEST defaults to .gpu_wheels (git-ignored)
# The folder travels with `carry` (64 MiB per call for the tree and carried paths together).
# A GPU machine that reaches the package registries needs none of this: gpu_check.sh then
# runs `pip install -e .`.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu_wheels}
PY=${PYTHON:-python3}
MEGATRON=megatron-core==0.16.1
HYDRA=hydra-core==1.3.8
OMEGACONF=omegaconf==2.3.1
ANTLR=antlr4-python3-runtime==4.9.3
WANDB=wandb==0.31.0
PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
TARGET=(--only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$DEST"
mkdir -p "$DEST"

# PyPI has antlr4-python3-runtime 4.9.3 (hydra's pin) as an sdist only: build its pure-Python
# wheel here (py3-none-any, so the build's Python does not matter).
"$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$DEST" "$ANTLR"

# Resolve the rest for the device's Python; megatron-core is left out of the resolution (its
# only requirements, torch, numpy and packaging, are on the device; resolving it pulls torch).
"$PY" -m pip install -q --dry-run --ignore-installed --report "$tmp/report.json" \
  "${TARGET[@]}" --target "$tmp/target" "$HYDRA" "$OMEGACONF" "$WANDB" "$DEST"/antlr4_*.whl
mapfile -t WANTED < <("$PY" benchmarks/gpu_check.py wheels "$tmp/report.json" --skip antlr4-python3-runtime)

"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$DEST" "$MEGATRON" "${WANTED[@]}"

count=$(ls "$DEST"/*.whl | wc -l)
kib=$(du -sk "$DEST" | cut -f1)
echo "$count wheels, $((kib / 1024)) MiB in $DEST:"
ls -1 "$DEST"
if [ "$kib" -gt $((56 * 1024)) ]; then
  echo "over 56 MiB: with the working tree this may pass the 64 MiB a device call carries" >&2
  exit 1
fi
