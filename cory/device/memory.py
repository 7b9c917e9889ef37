"""Memory: the peak of one stretch of work (an iteration, a benchmark phase), in GiB, and how much this machine has;
and the CPU a timing was taken on.

On CUDA the peak is the caching allocator's peak of allocated tensors (``torch.cuda.max_memory_allocated``).
On CPU it is the process's peak resident memory: Linux keeps it as VmHWM and resets it when "5" is
written to /proc/self/clear_refs, so each stretch gets its own peak; where that cannot be reset the
figure is the peak since the process started.

``ram_bytes``, ``gpu_bytes`` and ``cpu_info`` read no tensor library (the checks before a run loads anything use
them), so torch is imported only by the functions that measure a peak.
"""
from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys

GIB = 1024 ** 3


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def reset_peak() -> None:
    """Start a new stretch: the next ``peak_gib()`` covers only what happens from here on."""
    if _cuda():
        import torch

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
        import torch

        return torch.cuda.max_memory_allocated() / GIB
    try:
        with open("/proc/self/status") as f:
            kib = int(re.search(r"VmHWM:\s+(\d+)\s+kB", f.read()).group(1))
        return kib * 1024 / GIB
    except (OSError, AttributeError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / GIB * (1 if sys.platform == "darwin" else 1024)


def ram_bytes() -> int | None:
    """This machine's physical memory (all of it, used or not); None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_bytes() -> int:
    """The memory of this machine's largest NVIDIA GPU (from nvidia-smi, so that no CUDA context is made before
    the run sets up its allocator); 0 where there is none or nvidia-smi does not answer."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return max((int(mib) * 2 ** 20 for mib in re.findall(r"^\s*(\d+)\s*$", out, re.M)), default=0)
    except (OSError, subprocess.SubprocessError):
        return 0


def cpu_info() -> dict:
    """The CPU a timing was taken on (its model, cores and the vector flags that decide the fastest precision: AVX2,
    AVX-512, AMX), and the load then, to be written beside every timing."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in flags if f.startswith(("avx", "fma", "amx"))],
            "load": list(os.getloadavg())}
