"""trl's PPOTrainer doing only the work PPO reads, within a memory budget, with the same results up to float
rounding. Four changes, each measured in benchmarks/README.md:

* Logits on the response window. trl projects every position of query + response onto the vocabulary and,
  with ``kl_penalty="full"``, takes two log-softmaxes and a KL over all of them, then masks all but the
  response; for the observer, whose prompt carries the query and the pioneer's answer, that is most of the
  sequence. Here each sample's response positions are gathered (``logits_to_keep``) into a [batch, longest
  response] window before the LM head, and every tensor PPO uses afterwards (log-probs, values, masks,
  logits) lives on that window, aligned at the response start. Positions outside it were masked out, and GAE
  runs backwards, so nothing before a response could reach it.
* The rollout pass is epoch 0's training pass. With one mini-batch per epoch, trl's first training forward
  sees the same weights and inputs as its no-grad rollout forward (both in eval mode), so the rollout pass
  keeps its autograd graph and that training forward is skipped.
* A token budget per forward pass (``max_pass_tokens``). Activation memory grows with the tokens of one
  pass, and the observer's prompts are two to three times the pioneer's. A mini-batch over the budget is run
  as several passes of like-length sequences, each pass's loss weighted by its share of the mini-batch's
  response tokens and back-propagated at once, so the gradients add up to the one-pass gradient (trl's
  losses are token means over the mini-batch) while only one pass's activations are alive. trl's rule that
  skips a mini-batch whose mean probability ratio exceeds ``ratio_threshold`` is applied once, to the whole
  mini-batch, as trl does.
* Packed passes (``cory.speedups.packing``): the sequences of a pass share one row, so the linear layers see
  no padding; attention alone is run per sequence. Models it cannot serve get right-padded passes.
* The full-vocabulary KL without the full-vocabulary tensors. With ``kl_penalty="full"`` trl keeps the policy's
  and the reference's logits and both log-softmaxes, four [batch, response, vocabulary] float32 tensors, alive
  through the whole step (they are locals of ``step()``): at GSM8K's shapes (32 x 256 x 50,257) that is 6.6 GB,
  many times a small model's weights (benchmarks/README.md). Here the rollout pass also runs the reference on
  each of its passes, takes the per-token KL a few rows at a time, and keeps only the [batch, response] KL and
  the reference's log-probabilities; trl's reference pass then returns those, and trl's reward rule
  (``compute_rewards``) reads the KL from them. The numbers are the same as trl's to float rounding.
  Where those tensors are small (``kl_in_rollout = "auto"``: under ``KL_TENSORS_LIMIT`` with the batch in one
  pass, e.g. 190 MB at the IMDB CPU preset with batch 16) the KL is left to trl, on the window's logits: the
  rows-at-a-time KL costs a few percent of the rollout, reference and KL work on a CPU (benchmarks/README.md)
  and would save memory that is not short there.

trl's ``step()`` makes three kinds of forward pass, told apart here by what surrounds them: the rollout pass
(no gradients), the reference pass (inside trl's ``optional_peft_ctx``, wrapped below) and the training
passes (gradients on).
"""
from __future__ import annotations

import contextlib
import inspect

import torch
from trl import PPOTrainer
from trl.core import logprobs_from_logits, masked_mean

from cory.speedups import budget, packing
from cory.speedups.passes import pass_plan


def _accepts_logits_to_keep(model) -> bool:
    model = getattr(model, "module", model)  # DDP
    base = getattr(model, "pretrained_model", model)
    if hasattr(base, "get_base_model"):  # peft
        base = base.get_base_model()
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _hf_config(model):
    """The transformers config of a (DDP-wrapped) value-head model."""
    return getattr(model, "module", model).pretrained_model.config


def _token_kl(logits, ref_logits, rows: int = 4) -> torch.Tensor:
    """sum_v p(v) (log p(v) - log q(v)) per position, in float32, a few rows at a time (trl's "full" penalty:
    ``F.kl_div(log q, log p, log_target=True).sum(-1)``), so only a few rows' log-softmaxes are ever alive.
    ``logits``, ``ref_logits``: [B, W, V] -> [B, W]."""
    out = []
    with torch.no_grad():
        for i in range(0, logits.shape[0], rows):
            logp = torch.log_softmax(logits[i:i + rows].detach().float(), -1)
            logq = torch.log_softmax(ref_logits[i:i + rows].float(), -1)
            out.append(torch.nn.functional.kl_div(logq, logp, log_target=True, reduction="none").sum(-1))
    return torch.cat(out)


# trl's full-vocabulary KL keeps four [batch, response window, vocabulary] float32 tensors alive through a step;
# up to this size (and with the batch in one pass) they are left to it, above it the KL is taken in the rollout pass
KL_TENSORS_LIMIT = 512 * 2 ** 20


class WindowedPPOTrainer(PPOTrainer):
    reuse_rollout = True
    pack = True  # padding-free passes where the model allows them
    # where the full-vocabulary KL is taken: True = in the rollout pass, a few rows at a time; False = by trl,
    # from the window's logits; "auto" = in the rollout pass where trl's tensors would be large (see above)
    kl_in_rollout: bool | str = "auto"

    def __init__(self, *args, max_pass_tokens: int | str = 0, reserve_bytes: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        # 0 = one pass per mini-batch (trl's way); "auto" = measured at the first step (cory.speedups.budget)
        self.max_pass_tokens = max_pass_tokens
        self.reserve_bytes = reserve_bytes  # memory the agents' gradients and Adam moments will take
        self._window = None  # the longest response while step() runs on the window; None = trl's own path
        self._reuse = False  # whether this step() keeps the rollout pass's graph for epoch 0
        self._in_reference = False
        self._rollout = None  # the rollout pass's outputs, until epoch 0's training pass takes them
        self._reference = None  # (reference log-probs, per-token full KL) from the rollout pass, for this step
        self._kl_here = False  # whether this step() takes the full KL in the rollout pass
        self._disable_adapters = None
        self._deferred = None  # a training mini-batch over the budget: run pass by pass in train_minibatch
        disable_adapters = self._disable_adapters = self.optional_peft_ctx

        @contextlib.contextmanager
        def reference_pass():
            self._in_reference = True
            try:
                with disable_adapters():
                    yield
            finally:
                self._in_reference = False
        self.optional_peft_ctx = reference_pass

    def step(self, queries, responses, scores, response_masks=None):
        if self.max_pass_tokens == "auto":
            self.max_pass_tokens = budget.resolve(self, queries, responses, self.reserve_bytes)
        usable = (response_masks is None and not self.is_encoder_decoder
                  and _accepts_logits_to_keep(self.model)
                  and (self.ref_model is None or _accepts_logits_to_keep(self.ref_model)))
        self._window = max(len(r) for r in responses) if usable else None
        self._reuse = (self.reuse_rollout and usable and self.config.mini_batch_size >= len(queries)
                       and not self.is_distributed and len(self._plan(queries, responses)) == 1)
        self._kl_here = usable and self._takes_kl_in_rollout(queries, responses)
        self._rollout, self._deferred, self._reference = None, None, None
        try:
            return super().step(queries, responses, scores, response_masks)
        finally:
            self._window, self._rollout, self._deferred, self._reference = None, None, None, None

    def _takes_kl_in_rollout(self, queries, responses) -> bool:
        """Whether the full-vocabulary KL is taken in the rollout pass (``kl_in_rollout``) for this batch."""
        if self.kl_in_rollout != "auto":
            return bool(self.kl_in_rollout)
        vocabulary = _hf_config(self.model).vocab_size
        trl_bytes = 4 * len(queries) * max(len(r) for r in responses) * vocabulary * 4
        return trl_bytes > KL_TENSORS_LIMIT or len(self._plan(queries, responses)) > 1

    def _packs(self, model) -> bool:
        """Whether ``model``'s passes are packed or right-padded."""
        return self.pack and packing.supported(_hf_config(model))

    def _plan(self, queries, responses, model=None) -> list[list[int]]:
        return pass_plan([len(q) + len(r) for q, r in zip(queries, responses)], self.max_pass_tokens,
                         self._packs(self.model if model is None else model))

    def batched_forward_pass(self, model, queries, responses, model_inputs, return_logits=False,
                             response_masks=None):
        if self._window is None:
            return super().batched_forward_pass(model, queries, responses, model_inputs, return_logits,
                                                response_masks)
        if self._in_reference:
            if self._reference is not None:  # computed beside the rollout pass
                ref_logprobs, _ = self._reference
                return ref_logprobs, self._no_logits(ref_logprobs) if return_logits else None, None, None
            return self._float_logits(self._window_pass(model, queries, responses, return_logits))
        if not torch.is_grad_enabled():  # the policy's rollout pass
            # trl asks for logits here only to take the full-vocabulary KL: take it here, pass by pass, or
            # hand trl the window's logits
            full_kl = return_logits and self._kl_here
            if not self._reuse:
                out = self._window_pass(model, queries, responses, return_logits and not full_kl,
                                        with_reference=full_kl)
            else:
                with torch.enable_grad():
                    out = self._window_pass(model, queries, responses, True, with_reference=full_kl)
                self._rollout = (out[:4], list(queries), list(responses))
            logprobs, logits, values, masks = out[:4]
            if full_kl:
                self._reference = out[4:]
                logits = self._no_logits(logprobs)
            elif return_logits:
                logits = logits.detach().float()  # trl's full-vocabulary KL is taken from these, in float32
            else:
                logits = None
            return logprobs.detach(), logits, values.detach(), masks
        # a training pass
        if self._rollout is not None:  # epoch 0's only mini-batch
            reused, self._rollout = self._from_rollout(queries, responses), None
            if reused is not None:
                return reused
        if len(self._plan(queries, responses)) > 1:
            # a mini-batch over the budget: train_minibatch, which trl calls next with these outputs and
            # nothing else, runs it pass by pass
            self._deferred = (list(queries), list(responses))
            placeholder = torch.zeros(len(queries), self._window, device=self.current_device)
            return placeholder, placeholder, placeholder, placeholder
        return self._window_pass(model, queries, responses, return_logits)

    @staticmethod
    def _float_logits(out):
        """A no-grad pass's outputs with its logits (when asked for) in float32, for trl's full-vocabulary KL."""
        logprobs, logits, values, masks = out
        return logprobs, None if logits is None else logits.float(), values, masks

    @staticmethod
    def _no_logits(like):
        """Stand-in logits of one class for trl's full-vocabulary log-softmax (the KL is taken in the passes)."""
        return torch.zeros(*like.shape, 1, device=like.device)

    def compute_rewards(self, scores, logprobs, ref_logprobs, masks):
        if self._reference is None:
            return super().compute_rewards(scores, logprobs, ref_logprobs, masks)
        # trl's rule, row by row in batch order, with the per-token KL the rollout pass took
        rows = iter(self._reference[1])
        self._kl_penalty = lambda logprob, ref_logprob: next(rows)
        try:
            return super().compute_rewards(scores, logprobs, ref_logprobs, masks)
        finally:
            del self._kl_penalty  # back to the class's method

    def _from_rollout(self, queries, responses):
        """The rollout outputs in the order of trl's shuffled mini-batch (same tensors, so matched by identity)."""
        (logprobs, logits, values, masks), rollout_queries, rollout_responses = self._rollout
        index = {id(q): i for i, q in enumerate(rollout_queries)}
        if len(index) != len(rollout_queries) or any(id(q) not in index for q in queries):
            return None
        order = [index[id(q)] for q in queries]
        if any(rollout_responses[i] is not r for i, r in zip(order, responses)):
            return None
        order = torch.tensor(order, device=logprobs.device)
        return logprobs[order], logits[order], values[order], masks[order]

    def _window_pass(self, model, queries, responses, return_logits, with_reference=False):
        """Log-probs, logits (or None), values and masks on the response window, in the order given, computed
        pass by pass as ``max_pass_tokens`` allows, each pass packed when the model allows it, else
        right-padded. With grad on, every pass's graph stays alive. ``with_reference``: also the reference's
        log-probs and the per-token full-vocabulary KL(policy || reference), pass by pass (no grad).
        ``queries``, ``responses``: B 1-D token tensors; log-probs, values, masks and KL: [B, W]; logits:
        [B, W, V]."""
        device = self.current_device
        k = torch.arange(self._window, device=device)
        pieces, order = [], []
        reference = self.model if self.is_peft_model else self.ref_model
        for idx in self._plan(queries, responses, model):
            qs, rs = [queries[i] for i in idx], [responses[i] for i in idx]
            r_len = torch.tensor([len(r) for r in rs], device=device)
            masks = (k[None, :] < r_len[:, None]).long()
            logits, values, labels = self._forward(model, qs, rs)
            # log-probabilities in float32 whatever the compute precision (bf16 log-softmaxes would swamp the
            # small differences PPO's ratios and KL are made of); a no-op in float32
            piece = [logprobs_from_logits(logits.float(), labels), logits if return_logits else None,
                     values.float(), masks]
            if with_reference:
                with torch.no_grad(), self._disable_adapters():
                    ref_logits, _, _ = self._forward(reference, qs, rs)
                    piece += [logprobs_from_logits(ref_logits.float(), labels), _token_kl(logits, ref_logits)]
                del ref_logits
            pieces.append(piece)
            order += idx
        if len(pieces) == 1 and order == list(range(len(order))):
            return tuple(pieces[0])
        inverse = torch.empty(len(order), dtype=torch.long, device=device)
        inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)

        def joined(j):
            return torch.cat([p[j] for p in pieces])[inverse] if pieces[0][j] is not None else None
        return tuple(joined(j) for j in range(len(pieces[0])))

    def _forward(self, model, qs, rs):
        """One pass of ``model`` over the sequences query + response: (logits, values, labels) on the window,
        [B, W, V], [B, W] and [B, W] for the B sequences of the pass."""
        device = self.current_device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        config, pack = _hf_config(model), self._packs(model)
        k = torch.arange(self._window, device=device)
        seqs = [torch.cat([q, r]).to(device) for q, r in zip(qs, rs)]
        q_len = torch.tensor([len(q) for q in qs], device=device)
        r_len = torch.tensor([len(r) for r in rs], device=device)
        model.eval()
        if pack:
            with packing.packed(config, [len(s) for s in seqs], device) as layout:
                input_ids = torch.cat(seqs).unsqueeze(0)
                # the logits at position t score token t + 1: response token k of sequence i is scored at
                # start_i + len(q_i) - 1 + k (past the response: its last position, masked)
                positions = torch.minimum((layout.starts + q_len - 1)[:, None] + k,
                                          (layout.starts + q_len + r_len - 2)[:, None])
                logits, _, values = model(input_ids=input_ids, position_ids=layout.position_ids,
                                          logits_to_keep=positions.reshape(1, -1), use_cache=False)
            logits = logits.reshape(len(seqs), self._window, -1)
            return logits, values[0][positions], input_ids[0][positions + 1]
        input_ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad)
        attention = torch.nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)
        positions = ((q_len - 1)[:, None] + k).clamp(max=input_ids.shape[1] - 2)
        logits, _, values = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=positions,
                                  use_cache=False)
        return logits, values.gather(1, positions), input_ids.gather(1, positions + 1)

    def train_minibatch(self, old_logprobs, values, logprobs, logits, vpreds, mask, advantages, returns):
        if self._deferred is None:
            return super().train_minibatch(old_logprobs, values, logprobs, logits, vpreds, mask, advantages,
                                           returns)
        queries, responses = self._deferred
        self._deferred = None
        self.model.train()
        total = mask.sum()
        plan = self._plan(queries, responses)
        outputs = [None] * len(queries)
        threshold = self.config.ratio_threshold
        self.config.ratio_threshold = float("inf")  # applied below, once, over the whole mini-batch
        try:
            for j, idx in enumerate(plan):
                # in data-parallel runs gradients are averaged over processes once, on the last pass
                last = j == len(plan) - 1
                sync = (contextlib.nullcontext() if last or not self.is_distributed
                        else self.accelerator.no_sync(self.model))
                with sync:
                    lp, lg, vp, _ = self._window_pass(self.model, [queries[i] for i in idx],
                                                      [responses[i] for i in idx], True)
                    t = torch.tensor(idx, device=mask.device)
                    pg_loss, vf_loss, _ = self.loss(old_logprobs[t], values[t], lg, vp, lp, mask[t],
                                                    advantages[t], returns[t])
                    # trl's losses are means over the mini-batch's response tokens: weight by this pass's share
                    self.accelerator.backward((pg_loss + vf_loss) * (mask[t].sum() / total))
                for row, i in enumerate(idx):
                    outputs[i] = (lp[row].detach(), lg[row].detach(), vp[row].detach())
        finally:
            self.config.ratio_threshold = threshold
        logprobs, logits, vpreds = (torch.stack([o[j] for o in outputs]) for j in range(3))
        # trl's statistics, from the whole mini-batch
        _, _, train_stats = self.loss(old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns)
        if masked_mean(torch.exp(logprobs - old_logprobs), mask).item() > threshold:
            for p in self.model_params:  # trl zeroes this mini-batch's loss (the optimizer still steps)
                if p.grad is not None:
                    p.grad.zero_()
        if self.config.max_grad_norm is not None and self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.model_params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return train_stats

    def loss(self, old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns):
        # trl reads the logits here only for the entropy statistic: keep them out of the autograd graph
        return super().loss(old_logprobs, values, logits.detach(), vpreds, logprobs, mask, advantages, returns)
