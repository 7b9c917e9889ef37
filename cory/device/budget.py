"""``max_pass_tokens: auto``: the token budget of one PPO forward pass (``cory.passes``), chosen from the GPU's free
memory.

A training pass keeps every layer's activations until the backward, so its memory grows with the tokens it holds;
the observer's prompts (the query and the pioneer's answer) make its passes two to three times the pioneer's. On
CUDA the budget is measured, not guessed: at an agent's first PPO step one forward and backward pass over a slice of
the real batch gives the bytes per token; the budget is the free memory (less what the agents' gradients and Adam
moments will still take, and a safety margin) divided by that. A mini-batch over the budget runs as several passes
with the same gradient (``cory.ppo``), so a smaller card only takes more passes. On a CPU ``auto`` means no limit
(0)."""
from __future__ import annotations

import os
import sys

import torch

from cory.errors import ConfigError

BUDGET_FRACTION = 0.7  # of the free memory, for the passes; the rest absorbs the allocator's fragmentation
BUDGET_FLOOR = 256  # never fewer tokens per pass than this (one long sequence must still fit)
BUDGET_PROBE_TOKENS = 512


def auto_pass_tokens(free_bytes: float, bytes_per_token: float, reserve_bytes: float = 0.0,
                     fraction: float = BUDGET_FRACTION, floor: int = BUDGET_FLOOR) -> int:
    """The most tokens one pass may hold: ``fraction`` of the memory left after ``reserve_bytes``, at
    ``bytes_per_token``, and at least ``floor``."""
    usable = max(0.0, free_bytes - reserve_bytes) * fraction
    return max(floor, int(usable // max(bytes_per_token, 1.0)))


# Several runs on one card (the runner's --jobs) each measure the card's free memory at their first step and would
# each budget 0.7 of it: on an H100 the sixth of six SmolLM2 runs then ran out of memory. The runner gives each run
# its share of the card in this variable, and a run budgets within its share.
SHARE_ENV = "CORY_CUDA_SHARE"


def cuda_share() -> float:
    """This run's share of its card: 1 alone, the runner's ``CORY_CUDA_SHARE`` when runs share one card."""
    raw = os.environ.get(SHARE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        share = float(raw)
    except ValueError:
        share = float("nan")
    if not 0 < share <= 1:
        raise ConfigError(f"{SHARE_ENV}: must be a number in (0, 1] (this run's share of the GPU), got {raw!r}")
    return share


def usable_cuda_bytes(free: float, total: float, reserved: float, allocated: float, share: float = 1.0) -> float:
    """What this process may still take: the card's free memory (within its share of the card, less what its
    allocator already reserved) plus what its allocator holds but does not use."""
    room = free if share >= 1 else min(free, share * total - reserved)
    return max(0.0, room) + max(0.0, reserved - allocated)


def free_cuda_bytes(device) -> float:
    """Free memory on the card for this run (``usable_cuda_bytes``)."""
    free, total = torch.cuda.mem_get_info(device)
    return usable_cuda_bytes(free, total, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device),
                             cuda_share())


def measure_bytes_per_token(model, input_ids: torch.Tensor) -> float:
    """Peak memory of one forward and backward pass over ``input_ids`` ([1, n]), per token: activations kept
    for the backward, the logits and their log-softmax, the gradients' transient buffers."""
    device = input_ids.device
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    logits, _, values = model(input_ids=input_ids, use_cache=False)
    loss = torch.log_softmax(logits.float(), -1).mean() + (0 if values is None else values.float().mean())
    loss.backward()
    peak = torch.cuda.max_memory_allocated(device)
    model.zero_grad(set_to_none=True)
    del logits, values, loss
    return (peak - base) / input_ids.shape[1]


def trainable_state_bytes(model) -> int:
    """What an agent's training adds once it has stepped: a gradient and two Adam moments per trainable weight."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def resolve_budget(trainer, queries, responses, reserve_bytes: float) -> int:
    """The budget for ``trainer``'s passes: measured on CUDA, 0 (no limit) elsewhere."""
    device = trainer.current_device
    if not (isinstance(device, torch.device) and device.type == "cuda") and not str(device).startswith("cuda"):
        return 0
    tokens = torch.cat([torch.cat([q, r]) for q, r in zip(queries, responses)])[:BUDGET_PROBE_TOKENS]
    model = trainer.model
    model.eval()  # as every PPO pass runs (no dropout, so no random numbers are drawn)
    per_token = measure_bytes_per_token(model, tokens.to(device).unsqueeze(0))
    free = free_cuda_bytes(device)
    chosen = auto_pass_tokens(free, per_token, reserve_bytes)
    if trainer.accelerator.is_main_process:
        print(f"max_pass_tokens auto: {chosen} tokens per pass ({per_token / 2**20:.2f} MiB per token measured, "
              f"{free / 2**30:.1f} GiB free, {reserve_bytes / 2**30:.1f} GiB kept for gradients and Adam)",
              file=sys.stderr, flush=True)
    return chosen
