"""Peak memory of one stretch of work (an iteration, a benchmark phase), in GiB.

On CUDA it is the caching allocator's peak of allocated tensors (``torch.cuda.max_memory_allocated``).
On CPU it is the process's peak resident memory: Linux keeps it as VmHWM and resets it when "5" is
written to /proc/self/clear_refs, so each stretch gets its own peak; where that cannot be reset the
figure is the peak since the process started.
"""
from __future__ import annotations

import re
import resource
import sys

import torch

GIB = 1024 ** 3


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def reset_peak() -> None:
    """Start a new stretch: the next ``peak_gib()`` covers only what happens from here on."""
    if _cuda():
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak since the start is reported instead


def peak_gib() -> float:
    """The peak since the last ``reset_peak()`` (CUDA: allocated tensors; CPU: resident memory)."""
    if _cuda():
        return torch.cuda.max_memory_allocated() / GIB
    try:
        with open("/proc/self/status") as f:
            kib = int(re.search(r"VmHWM:\s+(\d+)\s+kB", f.read()).group(1))
        return kib * 1024 / GIB
    except (OSError, AttributeError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / GIB * (1 if sys.platform == "darwin" else 1024)
