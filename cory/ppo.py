"""One PPO update of one agent, top to bottom: what ``agent.step(queries, responses, scores)`` does.

The trainer is still trl's ``PPOTrainer`` (its models, Adam optimizer, accelerator, adaptive KL controller and
statistics), with its ``step`` written out here so that every line of PPO is in view:

1. **rollout pass**: one pass of the policy over query + response gives each response token's log-prob and value;
   the frozen reference's log-probs and the full-vocabulary KL(policy || reference) per token come from the same
   pass (``cory.speedups.passes``: response window, token budget, packing);
2. **rewards**: -η·KL at every response token, plus the task score at the last one (trl's ``compute_rewards``);
3. **advantages**: GAE (γ, λ) over the response, then whitened (trl's ``compute_advantages``);
4. **updates**: ``ppo_epochs`` passes over the batch in shuffled mini-batches, each one Adam step on the clipped
   policy loss plus ``vf_coef`` × the clipped value loss (``clipped_losses``, trl's formulas);
5. **statistics** as trl reports them, and the KL controller's update of η.

``fast_ppo: false`` runs trl's own ``PPOTrainer.step`` instead (the same numbers up to float rounding:
tests/test_ppo_passes.py), as does a model this step cannot serve (no ``logits_to_keep``, or encoder-decoder).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch
from trl import PPOTrainer
from trl.core import (WANDB_PADDING, PPODecorators, clip_by_value, convert_to_scalar, masked_mean, stack_dicts,
                      stats_to_np)

from cory.speedups import budget
from cory.speedups.passes import WindowOutputs, accepts_logits_to_keep, pass_plan, packs, window_passes


@dataclass
class PPOBatch:
    """The batch a PPO update reads, on the response window. B samples, W the longest response; every [B, W]
    tensor is aligned at each response's first token and float32 unless said otherwise."""

    queries: list[torch.Tensor]    # B 1-D token tensors: the prompts as the agent read them
    responses: list[torch.Tensor]  # B 1-D token tensors: the sampled answers
    scores: torch.Tensor           # [B]: the task reward of each answer (what the agent is trained on)
    logprobs: torch.Tensor         # [B, W]: the rollout policy's log-prob of each response token (PPO's "old")
    values: torch.Tensor           # [B, W]: the value head at each response token (masked to 0 after GAE)
    masks: torch.Tensor            # [B, W] long: 1 on response tokens, 0 past a response's end
    ref_logprobs: torch.Tensor     # [B, W]: the frozen reference's log-prob of each response token
    kl: torch.Tensor               # [B, W]: the per-token KL estimate (full vocabulary for kl_penalty "full")
    rewards: torch.Tensor | None = None            # [B, W]: -η·KL, plus the score at the last token
    non_score_rewards: torch.Tensor | None = None  # [B, W]: -η·KL alone
    advantages: torch.Tensor | None = None         # [B, W]: GAE, whitened over the batch's response tokens
    returns: torch.Tensor | None = None            # [B, W]: advantages (before whitening) + values

    def minibatch(self, index) -> "PPOBatch":
        """The samples ``index`` (a numpy array of positions) of every field."""
        t = torch.as_tensor(index, device=self.logprobs.device)
        tensors = {name: None if (v := getattr(self, name)) is None else v[t] for name in
                   ("scores", "logprobs", "values", "masks", "ref_logprobs", "kl", "rewards", "non_score_rewards",
                    "advantages", "returns")}
        return PPOBatch([self.queries[i] for i in index], [self.responses[i] for i in index], **tensors)


def per_token_rewards(scores: torch.Tensor, kl: torch.Tensor, masks: torch.Tensor, kl_coef: float):
    """(rewards, non-score rewards), [B, W] each: -η·KL at every token, plus the score at the last response token
    (trl's ``compute_rewards``, with the per-token KL already taken in the rollout pass)."""
    non_score = -kl_coef * kl
    rewards = non_score.clone()
    last = masks.sum(dim=1) - 1  # the window starts at each response's first token
    rewards[torch.arange(len(scores), device=rewards.device), last] += scores
    return rewards, non_score


def clipped_losses(mb: PPOBatch, logprobs: torch.Tensor, vpreds: torch.Tensor, config, rows=slice(None)):
    """PPO's clipped policy loss and ``vf_coef`` × its clipped value loss (trl's ``loss``, its formulas), token
    means over the samples ``rows`` of the mini-batch ``mb``; ``logprobs``, ``vpreds``: [len(rows), W], the
    current policy's."""
    old, values, masks = mb.logprobs[rows], mb.values[rows], mb.masks[rows]
    advantages, returns = mb.advantages[rows], mb.returns[rows]
    vpred_clipped = clip_by_value(vpreds, values - config.cliprange_value, values + config.cliprange_value)
    vf_loss = 0.5 * masked_mean(torch.max((vpreds - returns) ** 2, (vpred_clipped - returns) ** 2), masks)
    ratio = torch.exp(logprobs - old)
    pg_loss = masked_mean(torch.max(-advantages * ratio,
                                    -advantages * torch.clamp(ratio, 1.0 - config.cliprange, 1.0 + config.cliprange)),
                          masks)
    return pg_loss, config.vf_coef * vf_loss


class AgentTrainer(PPOTrainer):
    """trl's PPOTrainer with the PPO step of this module. ``max_pass_tokens``: the most tokens one forward pass
    may hold (0 = no limit, "auto" = measured on the GPU at the first step); ``reserve_bytes``: memory the agents'
    gradients and Adam moments will take, kept out of an "auto" budget; ``pack``: padding-free passes where the
    model allows; ``reuse_rollout``: with one mini-batch per epoch, the rollout pass (same weights, same inputs)
    is also epoch 0's training pass, so that pass is not run twice."""

    def __init__(self, *args, max_pass_tokens: int | str = 0, reserve_bytes: float = 0.0, pack: bool = True,
                 reuse_rollout: bool = True, compute=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_pass_tokens, self.reserve_bytes = max_pass_tokens, reserve_bytes
        self.pack, self.reuse_rollout = pack, reuse_rollout
        # compute(cache): the precision region the passes run in (bf16: autocast); with ``cache`` each weight is
        # cast once per region. A region lasts while the weights stand still: the rollout pass, then each
        # mini-batch's passes and backward, closed before its optimizer step (a copy cast before it would be stale)
        self.compute = compute or (lambda cache: contextlib.nullcontext())

    @PPODecorators.empty_device_cache()
    def step(self, queries, responses, scores, response_masks=None):
        if response_masks is not None or self.is_encoder_decoder or not self._windowable():
            with self.compute(False):
                return super().step(queries, responses, scores, response_masks)
        queries, responses, scores, _ = self._step_safety_checker(self.config.batch_size, queries, responses, scores)
        scores = torch.tensor(scores, device=self.current_device)
        if self.config.score_clip is not None:
            scores = torch.clip(scores.float(), -self.config.score_clip, self.config.score_clip).to(scores.dtype)
        if self.max_pass_tokens == "auto":
            self.max_pass_tokens = budget.resolve(self, queries, responses, self.reserve_bytes)
        timing, t0 = {}, time.time()

        # 1. the rollout pass: log-probs, values, the reference's log-probs and the per-token KL
        reuse = self._reuses_rollout(queries, responses)
        with torch.set_grad_enabled(reuse), self.compute(True):
            rollout = self._passes(queries, responses, keep_logits=reuse, reference=True)
        batch = PPOBatch(queries, responses, scores, rollout.logprobs.detach(), rollout.values.detach(),
                         rollout.masks, rollout.ref_logprobs, self._token_kl(rollout))
        timing["time/ppo/forward_pass"] = time.time() - t0

        # 2. rewards: the score at the last token, -η·KL at every token
        batch.rewards, batch.non_score_rewards = per_token_rewards(scores, batch.kl, batch.masks, self.kl_ctl.value)
        # 3. advantages: GAE, then whitened (also returns the values masked to the response)
        batch.values, batch.advantages, batch.returns = self.compute_advantages(batch.values, batch.rewards,
                                                                                batch.masks)
        # 4. ppo_epochs passes over the batch in shuffled mini-batches, one optimizer step each
        t = time.time()
        all_stats = []
        for epoch in range(self.config.ppo_epochs):
            order = np.random.permutation(len(queries))  # trl shuffles with numpy's global generator
            for start in range(0, len(queries), self.config.mini_batch_size):
                index = order[start:start + self.config.mini_batch_size]
                with self.accelerator.accumulate(self.model):
                    reused = rollout.select(index) if reuse and epoch == 0 else None
                    all_stats.append(self.train_on(batch.minibatch(index), reused))
            if self.config.early_stopping and self._early_stop(all_stats[-1]["policy/policykl"]):
                break
        timing["time/ppo/optimize_step"] = time.time() - t
        # 5. trl's statistics, and the KL controller's update of η from this batch's KL
        return self._statistics(batch, all_stats, timing, t0)

    def _windowable(self) -> bool:
        return accepts_logits_to_keep(self.model) and (self.ref_model is None or accepts_logits_to_keep(self.ref_model))

    def _reuses_rollout(self, queries, responses) -> bool:
        """The rollout pass doubles as epoch 0's training pass: one mini-batch per epoch, run in one pass, in one
        process (DDP synchronises gradients in the training passes only)."""
        return (self.reuse_rollout and self.config.mini_batch_size >= len(queries) and not self.is_distributed
                and len(self._plan(queries, responses)) == 1)

    def _plan(self, queries, responses) -> list[list[int]]:
        return pass_plan([len(q) + len(r) for q, r in zip(queries, responses)], self.max_pass_tokens,
                         packs(self.model, self.pack))

    def _passes(self, queries, responses, keep_logits: bool, reference: bool = False, window: int | None = None,
                max_pass_tokens: int | None = None) -> WindowOutputs:
        """The policy's passes over these samples (``cory.speedups.passes.window_passes``); ``reference``: also the
        reference's log-probs and the full KL (with LoRA the reference is the policy with its adapters off)."""
        ref_model = (self.model if self.is_peft_model else self.ref_model) if reference else None
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return window_passes(self.model, queries, responses,
                             window=window or max(len(r) for r in responses),
                             max_pass_tokens=self.max_pass_tokens if max_pass_tokens is None else max_pass_tokens,
                             pack=self.pack, pad_id=pad, device=self.current_device, keep_logits=keep_logits,
                             reference=ref_model, reference_ctx=self.optional_peft_ctx)

    def _token_kl(self, rollout: WindowOutputs) -> torch.Tensor:
        """The per-token KL the penalty uses: the full-vocabulary KL taken in the pass for ``kl_penalty: full``,
        else trl's estimate from the two log-probs (kl, abs, mse)."""
        if self.config.kl_penalty == "full":
            return rollout.kl
        return self._kl_penalty(rollout.logprobs.detach(), rollout.ref_logprobs)

    def train_on(self, mb: PPOBatch, reused: WindowOutputs | None = None) -> dict:
        """One optimizer step on the mini-batch ``mb``: the passes the token budget allows, each pass's losses
        weighted by its share of the mini-batch's response tokens and back-propagated at once (the gradients add
        up to the one-pass gradient; only one pass's activations are alive), then trl's rule that skips a
        mini-batch whose mean probability ratio passes ``ratio_threshold``, gradient clipping and the step.
        ``reused``: epoch 0's outputs, already computed by the rollout pass."""
        window, total = mb.masks.shape[1], mb.masks.sum()
        plan = [list(range(len(mb.queries)))] if reused is not None else self._plan(mb.queries, mb.responses)
        outputs = [None] * len(mb.queries)
        with self.compute(True):
            for j, idx in enumerate(plan):
                # in data-parallel runs the gradients are averaged over processes once, on the last pass
                last = j == len(plan) - 1
                sync = (contextlib.nullcontext() if last or not self.is_distributed
                        else self.accelerator.no_sync(self.model))
                with sync:
                    out = reused if reused is not None else self._passes(
                        [mb.queries[i] for i in idx], [mb.responses[i] for i in idx], keep_logits=True, window=window,
                        max_pass_tokens=0)
                    pg_loss, vf_loss = clipped_losses(mb, out.logprobs, out.values, self.config, idx)
                    self.accelerator.backward((pg_loss + vf_loss) * (mb.masks[idx].sum() / total))
                for row, i in enumerate(idx):
                    outputs[i] = (out.logprobs[row].detach(), out.logits[row].detach(), out.values[row].detach())
        logprobs, logits, vpreds = (torch.stack([o[k] for o in outputs]) for k in range(3))
        # trl's statistics of the mini-batch (its loss function, on the detached outputs: the entropy needs logits)
        _, _, stats = self.loss(mb.logprobs, mb.values, logits, vpreds, logprobs, mb.masks, mb.advantages, mb.returns)
        if masked_mean(torch.exp(logprobs - mb.logprobs), mb.masks).item() > self.config.ratio_threshold:
            for p in self.model_params:  # trl zeroes such a mini-batch's loss (the optimizer still steps)
                if p.grad is not None:
                    p.grad.zero_()
        if self.config.max_grad_norm is not None and self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.model_params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return stats

    def _statistics(self, batch: PPOBatch, all_stats: list[dict], timing: dict, t0: float) -> dict:
        """trl's step statistics (``record_step_stats``, gathered over processes), then η's update."""
        t = time.time()
        train_stats = stack_dicts(all_stats)
        # per-token arrays, not averaged (as trl's step keeps them)
        train_stats["policy/advantages"] = torch.nan_to_num(torch.flatten(train_stats["policy/advantages"]).unsqueeze(0),
                                                            WANDB_PADDING)
        train_stats["policy/ratio"] = torch.flatten(train_stats["policy/ratio"]).unsqueeze(0)
        stats = self.record_step_stats(scores=batch.scores, logprobs=batch.logprobs, ref_logprobs=batch.ref_logprobs,
                                       non_score_reward=batch.non_score_rewards, train_stats=train_stats,
                                       kl_coef=self.kl_ctl.value, masks=batch.masks, queries=batch.queries,
                                       responses=batch.responses, kls=batch.kl)
        if self.is_distributed:
            stats = self.gather_stats(stats)
        stats = stats_to_np(stats)
        timing["time/ppo/calc_stats"] = time.time() - t
        stats["ppo/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        self.kl_ctl.update(stats["objective/kl"], self.config.batch_size * self.accelerator.num_processes)
        timing["time/ppo/total"] = time.time() - t0
        stats.update(timing)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return convert_to_scalar(stats)
