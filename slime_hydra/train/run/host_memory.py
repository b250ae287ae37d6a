"""Keep freed host memory in the process, as PyTorch's CUDA caching allocator keeps device memory.

On CPU, torch allocates tensors with glibc's malloc. glibc maps each block above its mmap
threshold afresh and unmaps it when freed, and trims the heap top back to the OS: a step whose
micro-batches are larger than the last one's page-faults (and the kernel zeroes) every
activation page again: on pp2 vpp2 short answers steps 2-4 ran 5% slower for it (spreads apart;
docs/cost_model.md, thirteenth session), and the calibration's grid, which alternates sizes,
paid it unevenly. `keep_freed_memory` raises both thresholds, so freed blocks are reused.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt's parameters (glibc malloc.h)."""

MMAP_THRESHOLD = 32 * 2**20
"""Blocks above this are still mapped on their own: glibc's largest mmap threshold
(HEAP_MAX_SIZE / 2 on 64-bit; mallopt refuses more)."""

TRIM_THRESHOLD = 2**31 - 1
"""Free memory at the heap's top kept before glibc returns it (mallopt takes an int)."""


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks for reuse; False where the C library has no
    mallopt (not glibc) or refuses, and nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not kept:
        log.debug("mallopt refused; freed host memory goes back to the OS")
    return kept
