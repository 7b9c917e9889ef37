"""PPO's forward passes, on the response window only, within a token budget, packed: what ``cory.ppo`` calls.

A pass runs the value-head model over query + response for a group of samples and returns, on the **response
window** (the batch's longest response, every tensor aligned at each response's first token), the log-probs of
the response tokens, the values, the mask and, when asked, the logits, the reference's log-probs and the
per-token full-vocabulary KL. Three levers, each an argument with its reason:

* ``window``: only the response positions reach the LM head (``logits_to_keep``). trl projects every position
  of query + response onto the vocabulary and masks all but the response afterwards; for CORY's observer, whose
  prompt carries the query and the pioneer's answer, that is most of the sequence. Positions outside the window
  were masked out, and GAE runs backwards, so nothing before a response could reach it.
* ``max_pass_tokens``: a group over the budget runs as several passes of like-length samples (``pass_plan``).
  Activation memory grows with a training pass's tokens, and the observer's prompts are two to three times the
  pioneer's; the caller weights each pass's loss by its share of the response tokens so the gradients add up to
  the one-pass gradient while only one pass's activations are alive. ``max_pass_tokens: auto`` measures the
  budget on the GPU at the first step (``cory.device.budget``).
* ``pack``: the samples of a pass share one row, so the linear layers see no padding (``cory.packing``);
  attention alone runs per sequence. Models it cannot serve get right-padded passes.

The KL is taken inside the pass from the window's logits (``token_kl``), so the four [batch, window,
vocabulary] float32 tensors trl keeps alive through a step (6.6 GB at GSM8K's shapes) never exist at once.

Shapes: B samples of a pass or mini-batch, W the window (the longest response of the batch), V the vocabulary.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from trl.core import logprobs_from_logits

from cory import packing

# the full KL of a pass is taken in one go while its four [B, W, V] float32 tensors stay under this size, else a
# few rows at a time (so a long window or a large vocabulary never needs them all at once)
KL_CHUNK_BYTES = 512 * 2 ** 20
KL_ROWS = 4


def pass_plan(lengths: list[int], max_tokens: int, packed: bool = False, shared: int = 0) -> list[list[int]]:
    """Sample indices grouped into forward passes of at most ``max_tokens`` tokens each: the sum of the
    lengths for ``packed`` passes (``shared`` tokens every sample begins with counted once per pass), else
    samples x longest (padding counts); 0 = no limit, everything in one pass in the given order.

    Over the limit, the fewest passes that fit: for padded passes runs of like-length sequences (longest
    first, so little is padded) of near-equal count, for packed ones near-equal token counts. A sequence
    longer than the limit gets a pass of its own.
    """
    def cost(group):  # groups are sorted longest first
        return sum(lengths[i] for i in group) if packed else len(group) * lengths[group[0]]

    if packed and shared:  # a pass holds the shared tokens once: plan the samples' own tokens in what is left
        return pass_plan([n - shared for n in lengths], max(max_tokens - shared, 1) if max_tokens > 0 else 0, True)
    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    if max_tokens <= 0 or cost(order) <= max_tokens:
        return [list(range(n))]
    for k in range(2, n + 1):
        if packed:  # padding costs nothing: balance the token counts (each sequence to the lightest pass)
            groups, load = [[] for _ in range(k)], [0] * k
            for i in order:
                j = load.index(min(load))
                groups[j].append(i)
                load[j] += lengths[i]
        else:  # like lengths together, so little is padded
            sizes = [n // k + (j < n % k) for j in range(k)]
            groups = [order[sum(sizes[:j]): sum(sizes[:j + 1])] for j in range(k)]
        if all(cost(g) <= max_tokens for g in groups):
            return groups
    return [[i] for i in order]


def shared_tokens(queries, packed: bool) -> int:
    """The tokens every query begins with that a packed pass holds once (``cory.packing``); 0 when too few."""
    shared = packing.shared_prefix_length(queries) if packed else 0
    return shared if shared >= packing.MIN_SHARED_PREFIX else 0


def hf_config(model):
    """The transformers config of a (DDP-wrapped) value-head model."""
    return getattr(model, "module", model).pretrained_model.config


def accepts_logits_to_keep(model) -> bool:
    """Whether the model can project only chosen positions onto the vocabulary (needed for the window)."""
    model = getattr(model, "module", model)  # DDP
    base = getattr(model, "pretrained_model", model)
    if hasattr(base, "get_base_model"):  # peft
        base = base.get_base_model()
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def packs(model, pack: bool) -> bool:
    """Whether ``model``'s passes are packed (asked for, and a model ``cory.packing`` serves)."""
    return pack and packing.supported(hf_config(model))


def token_kl(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Per position sum_v p(v) (log p(v) - log q(v)) in float32, trl's ``kl_penalty="full"``
    (``F.kl_div(log q, log p, log_target=True).sum(-1)``), without gradients. [B, W, V] x 2 -> [B, W]; in
    chunks of ``KL_ROWS`` rows when the pass's log-softmaxes would pass ``KL_CHUNK_BYTES``."""
    rows = logits.shape[0] if 4 * logits[:1].numel() * 4 * logits.shape[0] <= KL_CHUNK_BYTES else KL_ROWS
    out = []
    with torch.no_grad():
        for i in range(0, logits.shape[0], rows):
            logp = torch.log_softmax(logits[i:i + rows].detach().float(), -1)
            logq = torch.log_softmax(ref_logits[i:i + rows].float(), -1)
            out.append(torch.nn.functional.kl_div(logq, logp, log_target=True, reduction="none").sum(-1))
    return torch.cat(out)


@dataclass
class WindowOutputs:
    """What the passes over B samples give, in the samples' order, on the response window W."""

    logprobs: torch.Tensor                 # [B, W] float32: log-prob of each response token (graph kept with grad on)
    values: torch.Tensor | None            # [B, W] float32: the value head at each response token (None: no head)
    masks: torch.Tensor                    # [B, W] long: 1 on the response's own tokens, 0 past its end
    logits: torch.Tensor | None = None     # [B, W, V] (when asked for): for trl's entropy statistic
    ref_logprobs: torch.Tensor | None = None  # [B, W] float32: the reference's log-probs (with a reference)
    kl: torch.Tensor | None = None         # [B, W] float32: full-vocabulary KL(policy || reference) per token

    def select(self, index) -> "WindowOutputs":
        """The rows ``index`` (a list or tensor of sample indices) of every tensor."""
        index = torch.as_tensor(index, device=self.logprobs.device)
        return WindowOutputs(*(None if t is None else t[index] for t in
                               (self.logprobs, self.values, self.masks, self.logits, self.ref_logprobs, self.kl)))


def window_passes(model, queries, responses, *, window: int, max_pass_tokens: int, pack: bool, pad_id: int,
                  device, keep_logits: bool = False, reference=None, reference_ctx=contextlib.nullcontext,
                  ) -> WindowOutputs:
    """``model``'s outputs on the response window for every sample, computed pass by pass as ``max_pass_tokens``
    allows (with grad on, every pass's graph stays alive; a caller that needs one pass's activations at a time
    calls this per pass). ``reference`` (run inside ``reference_ctx()``, e.g. trl's context that disables LoRA
    adapters): also its log-probs and the per-token full KL, without gradients. ``queries``, ``responses``: B 1-D
    token tensors."""
    k = torch.arange(window, device=device)
    pieces, order = [], []
    packed = packs(model, pack)
    plan = pass_plan([len(q) + len(r) for q, r in zip(queries, responses)], max_pass_tokens, packed,
                     shared_tokens(queries, packed))
    for idx in plan:
        qs, rs = [queries[i] for i in idx], [responses[i] for i in idx]
        r_len = torch.tensor([len(r) for r in rs], device=device)
        logits, values, labels = window_forward(model, qs, rs, window, pack=pack, pad_id=pad_id, device=device)
        # log-probabilities in float32 whatever the compute precision (bf16 log-softmaxes would swamp the small
        # differences PPO's ratios and KL are made of); a no-op in float32
        piece = WindowOutputs(logprobs_from_logits(logits.float(), labels), None if values is None else values.float(),
                              (k[None, :] < r_len[:, None]).long(), logits if keep_logits else None)
        if reference is not None:
            with torch.no_grad(), reference_ctx():
                ref_logits, _, _ = window_forward(reference, qs, rs, window, pack=pack, pad_id=pad_id, device=device)
            piece.ref_logprobs = logprobs_from_logits(ref_logits.float(), labels)
            piece.kl = token_kl(logits, ref_logits)
            del ref_logits
        pieces.append(piece)
        order += idx
    if len(pieces) == 1:
        return pieces[0]
    inverse = torch.empty(len(order), dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)

    def joined(name):
        parts = [getattr(p, name) for p in pieces]
        return None if parts[0] is None else torch.cat(parts)[inverse]
    return WindowOutputs(*(joined(n) for n in ("logprobs", "values", "masks", "logits", "ref_logprobs", "kl")))


def window_forward(model, qs, rs, window: int, *, pack: bool, pad_id: int, device):
    """One pass of ``model`` over the sequences query + response: (logits, values, labels) on the window,
    [B, W, V], [B, W] and [B, W]; values None for a model without a value head (``models.PolicyWithoutValueHead``).
    Past a response's end the window repeats its last position (masked later). Always in eval mode (no dropout): trl's passes are, its training ones included."""
    config = hf_config(model)
    k = torch.arange(window, device=device)
    seqs = [torch.cat([q, r]).to(device) for q, r in zip(qs, rs)]
    q_len = torch.tensor([len(q) for q in qs], device=device)
    r_len = torch.tensor([len(r) for r in rs], device=device)
    model.eval()
    if packs(model, pack):
        # queries that begin alike (a one-shot example) hold it once at the row's start
        shared = shared_tokens(qs, True)
        with packing.packed(config, [len(s) - shared for s in seqs], device, prefix=shared) as layout:
            input_ids = torch.cat([seqs[0][:shared]] + [s[shared:] for s in seqs]).unsqueeze(0)
            # the logits at position t score token t + 1: response token k of sequence i is scored at
            # start_i + len(q_i) - shared - 1 + k, start_i where its own tokens begin (past the response: its last
            # position, masked)
            positions = torch.minimum((layout.starts + q_len - shared - 1)[:, None] + k,
                                      (layout.starts + q_len + r_len - shared - 2)[:, None])
            logits, _, values = model(input_ids=input_ids, position_ids=layout.position_ids,
                                      logits_to_keep=positions.reshape(1, -1), use_cache=False)
        logits = logits.reshape(len(seqs), window, -1)
        return logits, None if values is None else values[0][positions], input_ids[0][positions + 1]
    input_ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad_id)
    attention = torch.nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)
    positions = ((q_len - 1)[:, None] + k).clamp(max=input_ids.shape[1] - 2)
    logits, _, values = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=positions,
                              use_cache=False)
    return logits, None if values is None else values.gather(1, positions), input_ids.gather(1, positions + 1)
