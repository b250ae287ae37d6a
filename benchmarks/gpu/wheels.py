"""Which wheels to carry to a device machine without package registries: what a pip report
wants, less what the device's image holds already (benchmarks/gpu_wheels.sh)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# What the device's image holds already (KINDS.md, 'Python packages already there', read
# 2026-11-17): these are not carried, so the device's own versions are used.
_DEVICE_PACKAGE_NAMES = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
    pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
    protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""


DEVICE_PACKAGES = frozenset(_DEVICE_PACKAGE_NAMES.split())


NEVER_CARRY = re.compile(r"^(torch|triton|nvidia-.*|numpy)$")
"""Never downloaded, whatever the device lists: torch there is 2.11+cu130 with its CUDA stack."""


def normalize(name: str) -> str:
    """A distribution name in PEP 503 form: 'PyYAML' → 'pyyaml', 'a_b.c' → 'a-b-c'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels_to_fetch(report: Mapping[str, Any], skip: Iterable[str] = ()) -> list[str]:
    """`name==version` of each package in a `pip install --dry-run --report` that the device
    lacks: the resolved set minus DEVICE_PACKAGES, torch's stack, and `skip` (already built)."""
    skipped = {normalize(s) for s in skip}
    wanted = []
    for item in report["install"]:
        meta = item["metadata"]
        name = normalize(meta["name"])
        if name in DEVICE_PACKAGES or name in skipped or NEVER_CARRY.match(name):
            continue
        wanted.append(f"{name}=={meta['version']}")
    return sorted(wanted)
