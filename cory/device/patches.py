"""Two process-wide patches a run applies before it loads models."""
from __future__ import annotations

import contextlib
import os


def return_freed_memory(threshold: int = 1 << 20) -> bool:
    """Have glibc serve every allocation of ``threshold`` bytes or more with its own mapping, handed back
    to the system when freed. By default glibc raises that threshold after each large free (up to 32 MB),
    so one phase's activations stay in its heap afterwards and the next phase's land beside them: resident
    memory then peaks above what is alive at any moment (measured in benchmarks/README.md). False where
    the C library is not glibc (nothing changes there)."""
    import ctypes

    try:
        m_mmap_threshold = -3
        return bool(ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, threshold))
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def frozen_models_not_wrapped():
    """trl passes the frozen reference through ``accelerator.prepare``. With several CPU processes
    accelerate wraps it in DDP, which refuses a module with nothing to train (on GPUs accelerate already
    leaves such models unwrapped): prepare models without trainable parameters as for evaluation."""
    from accelerate import Accelerator

    original = Accelerator.prepare_model

    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        frozen = not any(p.requires_grad for p in model.parameters())
        return original(self, model, device_placement=device_placement, evaluation_mode=evaluation_mode or frozen)

    Accelerator.prepare_model = prepare_model
    try:
        yield
    finally:
        Accelerator.prepare_model = original


def cuda_allocator_segments() -> None:
    """Let PyTorch's CUDA allocator grow its segments instead of caching fixed blocks. Sequence lengths change
    every iteration, and fixed blocks of the last shapes then fragment the card: memory that no tensor uses
    but the allocator still holds (what nvidia-smi shows) grows well past what is allocated. Read by torch
    at its first CUDA allocation, so set before any; a setting the user made wins."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
