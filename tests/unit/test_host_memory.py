"""train/run/host_memory.py: with keep_freed_memory a freed block stays in the process for the
next step to reuse, where glibc's defaults hand it back to the OS (each case in a fresh process:
glibc's mmap threshold moves with what a process has freed before)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

RSS_AFTER_FREE = """
import ctypes, sys
from slime_hydra.train.run.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
size = 24 * 2**20  # under the 32 MiB threshold, over glibc's default 128 KiB
block = libc.malloc(size)
ctypes.memset(block, 1, size)
touched = rss_mib()
libc.free(block)
print(touched - rss_mib())
"""


def returned_mib(mode: str) -> float:
    """MiB of a freed 24 MiB block the process gave back to the OS."""
    proc = subprocess.run(
        [sys.executable, "-c", RSS_AFTER_FREE, mode], capture_output=True, text=True, check=True
    )
    return float(proc.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc and /proc")
def test_a_freed_block_stays_for_reuse():
    assert returned_mib("default") > 20  # mapped on its own, unmapped when freed
    assert returned_mib("keep") < 4  # on the heap, kept below the trim threshold
