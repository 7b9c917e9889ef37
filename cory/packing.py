"""Padding-free forward passes for PPO: every sequence's tokens in one row, attention per sequence.

Nearly all of a forward pass's work is in the linear layers, which treat tokens independently. Packed
into one row, they see only real tokens (a right-padded batch wastes 10-20% of them here). Attention,
the one per-sequence operation, re-pads its queries, keys and values to [sequences, longest, ...] and
runs causal SDPA: a sequence's padding lies after its tokens, so a causal mask keeps it from reaching
them, and its output rows are dropped on the way back. So results equal the padded batch's up to float
rounding (tests/test_ppo_passes.py), and attention costs what it cost before.

Sequences that begin alike (a one-shot example before every question) hold that prefix once, at the row's start:
each attends to it as if it were its own, and the linear layers, most of the work, read it once per pass.

The attention runs under its own name (``cory_sdpa``) so that transformers dispatches to it; outside a
``packed(...)`` block it is plain SDPA, masks included, so generation is unaffected.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "cory_sdpa"
_layout: contextvars.ContextVar = contextvars.ContextVar("cory_packed_layout", default=None)


# Sequences that all begin with at least this many equal tokens (a one-shot example: the arithmetic and GSM8K
# prompts) share one copy of them; fewer are not worth the bookkeeping.
MIN_SHARED_PREFIX = 8


def shared_prefix_length(sequences) -> int:
    """How many tokens every sequence begins with, leaving each at least one token of its own (the token whose
    logits predict what follows the prompt); 0 for fewer than two sequences."""
    if len(sequences) < 2:
        return 0
    first, longest = sequences[0], min(len(s) for s in sequences) - 1
    for i in range(max(longest, 0)):
        if any(s[i] != first[i] for s in sequences):
            return i
    return max(longest, 0)


class Layout:
    """Where each sequence sits in the packed row, and the index maps to and from [sequences, longest].

    ``prefix``: the row begins with that many tokens every sequence shares, held once; ``lengths`` are then the
    sequences' own tokens after it. Each sequence attends to the shared tokens and its own, at the positions it
    would have alone; the linear layers read the shared tokens once (their gradient gathers every sequence's)."""

    def __init__(self, lengths: list[int], device, prefix: int = 0):
        self.tokens = prefix + sum(lengths)
        longest = prefix + max(lengths)
        lens = torch.tensor(lengths, device=device)
        starts = prefix + torch.cumsum(lens, 0) - lens  # where each sequence's own tokens begin in the row
        j = torch.arange(longest, device=device)
        own = j[None, :] >= prefix
        inside = j[None, :] < (prefix + lens)[:, None]
        # a sequence re-padded: the shared tokens, then its own; past its end it repeats its last token (causal
        # attention never lets that reach a real one)
        self.gather = torch.where(~own, j[None, :],
                                  starts[:, None] + torch.minimum((j - prefix).clamp(min=0)[None, :], (lens - 1)[:, None]))
        # back into the row: the shared tokens' outputs from the first sequence (all compute them alike), then each
        # sequence's own
        mine = (torch.arange(len(lengths), device=device)[:, None] * longest + j)[own & inside]
        self.scatter = torch.cat([torch.arange(prefix, device=device), mine])
        self.position_ids = torch.cat([torch.arange(prefix, device=device),
                                       j[None, :].expand(len(lengths), -1)[own & inside]]).unsqueeze(0)
        self.starts = starts


def attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA attention per sequence of a packed row: ``query``, ``key``, ``value`` [1, heads, N, dim] are re-padded
    to [B, heads, longest, dim], attended causally, and scattered back to [1, N, heads, dim]; any other call is
    transformers' own SDPA."""
    layout = _layout.get()
    if layout is None or query.shape[0] != 1 or query.shape[2] != layout.tokens:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    def repad(x):  # [1, heads, tokens, dim] -> [sequences, heads, longest, dim]
        return x[0][:, layout.gather].transpose(0, 1)

    kwargs.pop("is_causal", None)
    out, _ = sdpa_attention_forward(module, repad(query), repad(key), repad(value), None, is_causal=True, **kwargs)
    n, longest, heads, dim = out.shape  # sdpa returns [batch, length, heads, dim]
    return out.reshape(n * longest, heads, dim)[layout.scatter].unsqueeze(0), None


def mask(*args, **kwargs):
    if _layout.get() is not None:
        return None  # the attention above builds its own per-sequence causal mask
    return sdpa_mask(*args, **kwargs)


@functools.cache
def register() -> None:
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, mask)


def supported(config) -> bool:
    """Models whose attention we can stand in for: SDPA ones with no sub-configs (Llama, GPT-2, ...)."""
    return getattr(config, "_attn_implementation", None) in ("sdpa", NAME) and not getattr(config, "sub_configs", None)


@contextlib.contextmanager
def packed(config, lengths: list[int], device, prefix: int = 0):
    """Run the model of ``config`` on packed rows of sequences of ``lengths`` (after ``prefix`` shared tokens, see
    ``Layout``) while the block is open."""
    register()
    layout = Layout(lengths, device, prefix)
    before = config._attn_implementation
    config._attn_implementation = NAME
    token = _layout.set(layout)
    try:
        yield layout
    finally:
        _layout.reset(token)
        config._attn_implementation = before
