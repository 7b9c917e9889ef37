"""generate() over prompts that begin alike (a one-shot example), the shared beginning read once per batch.

Every arithmetic and GSM8K prompt opens with the same worked example: 39 of an arithmetic prompt's 47-49 tokens.
Read once per sequence, it is most of a short answer's cost; read once per batch and its keys and values repeated
for every row, the batch reads only what differs. Training's sampling (``cory.agent``) and held-out evaluation
(``cory.heldout``) both sample through here. The draws are generate()'s own, from the same logits up to float
rounding (tests/test_generation.py holds the tokens equal to plain left-padded generate()).
"""
from __future__ import annotations

from typing import Sequence

import torch

from cory.packing import MIN_SHARED_PREFIX, shared_prefix_length


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int):
    """(ids, mask), [rows, longest] each: the sequences right-aligned, padding masked."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def positions(mask):
    # Left padding shifts every sequence: position ids must count real tokens only, as generate() does.
    return (mask.cumsum(-1) - 1).clamp(min=0)


def with_shared_prefix(model, prompts: Sequence[Sequence[int]], tails: Sequence[Sequence[int]], pad_id: int):
    """The batch of ``prompts`` (each followed by its ``tails`` entry) for a forward pass or generate(): the
    prompts' shared prefix read once and its cache repeated per row, then each row's rest left-padded behind it
    (padding in the middle, masked; positions count real tokens only, so every row sees the positions it would
    see unpadded). Returns (ids, mask, positions, cache) where ids and positions cover the rest only and mask the
    prefix too; cache is None (ids the whole left-padded rows) when the prompts share too little."""
    n = shared_prefix_length(prompts)
    device = next(model.parameters()).device
    if n < MIN_SHARED_PREFIX:
        ids, mask = left_pad([list(p) + list(t) for p, t in zip(prompts, tails)], pad_id)
        return ids.to(device), mask.to(device), positions(mask).to(device), None
    ids, rest_mask = left_pad([list(p[n:]) + list(t) for p, t in zip(prompts, tails)], pad_id)
    mask = torch.cat([torch.ones((len(prompts), n), dtype=torch.long), rest_mask], dim=1)
    rest_positions = positions(mask)[:, n:]
    with torch.inference_mode():
        prefix = torch.as_tensor(list(prompts[0][:n]), device=device)[None]
        cache = model(input_ids=prefix, use_cache=True).past_key_values
    cache.batch_repeat_interleave(len(prompts))
    return ids.to(device), mask.to(device), rest_positions.to(device), cache


def generate_from_shared_prefix(model, prompts: Sequence[Sequence[int]], pad_id: int, **kwargs):
    """``model.generate(**kwargs)`` on the left-padded ``prompts``, their shared prefix read once (else the plain
    left-padded call): (generate()'s output, the padded prompt width, after which each row's new tokens begin)."""
    ids, mask, _, cache = with_shared_prefix(model, prompts, [[] for _ in prompts], pad_id)
    if cache is not None:
        kwargs["past_key_values"] = cache
        # generate() takes the whole rows and reads on from the cache's length
        prefix = torch.as_tensor(list(prompts[0][:mask.shape[1] - ids.shape[1]]), dtype=ids.dtype, device=ids.device)
        ids = torch.cat([prefix.expand(len(prompts), -1), ids], dim=1)
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, **kwargs), ids.shape[1]


def new_tokens(rows: torch.Tensor, width: int, eos_id: int | None) -> list[torch.Tensor]:
    """Each row's generated tokens (after the prompt ``width``) up to and including the first EOS, trl's
    ``_generate_batched(return_prompt=False)``'s cut."""
    out = []
    for row in rows[:, width:]:
        if eos_id is not None:
            hits = (row == eos_id).nonzero()
            if len(hits):
                row = row[: int(hits[0, 0]) + 1]
        out.append(row)
    return out
