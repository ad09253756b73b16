"""Keep freed memory in the process instead of handing it back to the kernel after every step.

glibc serves allocations above its mmap threshold with fresh pages from the kernel and returns
them on free; it also trims the top of its heap once more than the trim threshold lies free. A
local step allocates and frees the same few tensors (gradients, Adam's state at the start of a
local pass, activations) thousands of times, and every fresh page costs a page fault and zeroing:
a 50-round FedPCL run on 3 x 1280-d features took 1.1M page faults and 5.2-5.5 s, and 15,000 faults
and 3.9 s with the thresholds raised (benchmarks/malloc_thresholds.py, docs/performance.md). PyTorch's CPU allocator has no cache
of its own, so this is the place to fix it.

The tuning is per process and only affects glibc on Linux; values the user set through the
environment are kept, and ``FEDCACHE_MALLOC=system`` leaves glibc's defaults alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit: blocks up to 32 MB come from the heap
TRIM_THRESHOLD = 512 << 20  # keep up to 512 MB of freed heap for reuse
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if they are (now) raised."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("FEDCACHE_MALLOC") == "system" or any(k in os.environ for k in USER_SETTINGS):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    # mallopt returns 1 on success; setting the mmap threshold also turns off glibc's own
    # adjustment of both thresholds, so the two values below stay as set.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
