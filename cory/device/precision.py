"""The precision a run computes in on this machine: which bfloat16 kernels the CPU runs (``cpu_bf16_kernels``),
what ``precision: auto`` resolves to there (``resolve_precision``, from what the benchmarks measured), the autocast
region of bf16 (``precision_context``) and the process-wide TF32 switch (``set_precision``)."""
from __future__ import annotations

import contextlib
import os

import torch


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX tiles); without, torch emulates it
    and bf16 autocast runs slower than float32."""
    return cpu_bf16_kernels() != "emulated"


# oneDNN's instruction sets (ONEDNN_MAX_CPU_ISA) that hold native bfloat16 instructions, and those with AMX tiles
_ONEDNN_BF16 = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10")
_ONEDNN_AMX = ("AVX512_CORE_AMX", "AVX10_1_512_AMX", "AVX10_2_512_AMX")


def cpu_bf16_kernels(capability: str | None = None, onednn_isa: str | None = None) -> str:
    """Which bfloat16 kernels this CPU's math library will run: "amx" (AMX tiles), "avx512_bf16", or "emulated".
    The CPU's flags, as far as the library uses them: ATen's kernels (``torch.backends.cpu.get_cpu_capability``,
    lowered by ATEN_CPU_CAPABILITY) below AVX-512, or oneDNN capped (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16,
    leave bfloat16 emulated whatever the CPU holds. ``capability`` and ``onednn_isa`` (tests): else asked."""
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA", "") if onednn_isa is None else onednn_isa).strip().upper()
    capped = isa not in ("", "ALL", "DEFAULT")
    if "AVX512" not in capability.upper() or (capped and not isa.startswith(_ONEDNN_BF16)):
        return "emulated"
    if torch.cpu._is_amx_tile_supported() and (not capped or isa.startswith(_ONEDNN_AMX)):
        return "amx"
    return "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else "emulated"


# What `auto` picks on each CPU kind is what the benchmarks measured faster there, per PPO iteration at the cpu
# preset (benchmarks/README.md, "Per CPU kind"): bf16 only where it was faster in every series
AUTO_ON_CPU = {
    "avx512_bf16": ("bf16", "auto on a CPU with AVX-512 BF16 (no AMX), where bf16 was measured 1.24-1.48x faster "
                            "per PPO iteration than fp32"),
    "amx": ("fp32", "auto on a CPU with AMX, where bf16 was measured 0.88-1.22x fp32's speed per PPO iteration "
                    "(not reliably faster); precision: bf16 to use it anyway"),
    "emulated": ("fp32", "auto on a CPU without native bfloat16, where torch emulates it slower than float32"),
}


def resolve_precision(precision: str, device_type: str, kernels: str | None = None) -> tuple[str, str]:
    """(the precision a run computes in, why): ``auto`` is tf32 on CUDA and, on a CPU, what was measured fastest on
    its kind (``AUTO_ON_CPU``); a named precision is itself. ``kernels`` (tests): the CPU's bf16 kernels, else
    asked (``cpu_bf16_kernels``)."""
    if precision != "auto":
        return precision, "as configured"
    if device_type == "cuda":
        return "tf32", "auto on CUDA: TF32 matmuls, float32 weights"
    return AUTO_ON_CPU[kernels or cpu_bf16_kernels()]


def precision_context(precision: str, device_type: str, cache: bool = True):
    """bf16: an autocast region (``cache``: each weight cast once for the whole region); otherwise nothing."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, cache_enabled=cache)


def set_precision(precision: str) -> None:
    """TF32 matmuls on CUDA for ``tf32``, ``bf16`` (float32 work outside autocast) and ``auto``, off for exact
    ``fp32``."""
    fast = precision in ("tf32", "bf16", "auto")
    torch.backends.cuda.matmul.allow_tf32 = fast
    torch.backends.cudnn.allow_tf32 = fast
