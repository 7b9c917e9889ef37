"""PPO and CORY training loops around trl 0.11.4's classic PPOTrainer.

An ``Agent`` is one trainable LLM: its own policy with value head, optimizer, adaptive KL
controller and score normaliser, wrapped in its own PPOTrainer. PPO trains one agent; CORY
trains two (LLM1, LLM2) that share a single frozen reference model and exchange the roles of
pioneer and observer every ``swap_period`` iterations.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from cory import memory
from cory.config import ConfigError, CoryArgs, PPOArgs, to_dict
from cory.outputs import RunDir, check_output_dir, latest_checkpoint

AGENTS = ("llm1", "llm2")


class RunError(RuntimeError):
    """A training run cannot go on (non-finite reward or loss, a reward that raised)."""


# ----------------------------------------------------------------------------- pure rules

def pioneer_name(step: int, swap_period: int) -> str:
    """Who plays pioneer at iteration ``step`` (0-based): LLM1 first, roles flip every ``swap_period``."""
    if swap_period <= 0:
        return "llm1"
    return AGENTS[(step // swap_period) % 2]


def is_swap_step(step: int, swap_period: int) -> bool:
    """True when iteration ``step`` starts with freshly exchanged roles."""
    return swap_period > 0 and step > 0 and step % swap_period == 0


def collective_rewards(own: list[float], partner: list[float], other_reward_coef: float) -> list[float]:
    """Each agent's training reward: its own task reward plus ``coef`` times its partner's.

    coef 1 is the paper's collective reward r1 + r2; 0 trains the agents independently; -1 is competitive.
    """
    return [o + other_reward_coef * p for o, p in zip(own, partner)]


def combined_reward(task_reward: float, kl: float, kl_coef: float) -> float:
    """The paper's r_c = r - eta * KL: the objective PPO and CORY both maximise, comparable across methods."""
    return task_reward - kl_coef * kl


class ScoreNormalizer:
    """Running mean/std of training scores (the authors' use_score_scaling + use_score_norm).

    trl 0.11.4's own option crashes ('float' object has no attribute 'to'), so we normalise before
    ``step()``, with trl's update rule: merge the batch moments into the running ones, then scale.
    """

    def __init__(self):
        self.mean, self.var, self.count = 0.0, 1.0, 1e-24

    @property
    def std(self) -> float:
        return math.sqrt(self.var * self.count / max(self.count - 1, 1e-24)) if self.count > 1 else 1.0

    def __call__(self, scores: list[float]) -> list[float]:
        xs = np.asarray(scores, dtype=np.float64)
        n, mean, var = xs.size, xs.mean(), xs.var()
        delta, total = mean - self.mean, self.count + n
        self.var = (self.var * self.count + delta ** 2 * self.count * n / total + var * n) / total
        self.mean += delta * n / total
        self.count = total
        scale = self.std + float(np.finfo(np.float32).eps)
        return [float((x - self.mean) / scale) for x in xs]

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


# ----------------------------------------------------------------------------- agents

def ppo_config(cfg: PPOArgs, learning_rate: float | None = None):
    from trl import PPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return PPOConfig(
            exp_name="cory", seed=cfg.seed, model_name=cfg.model_name, log_with=None,
            learning_rate=learning_rate or cfg.learning_rate, batch_size=cfg.batch_size,
            mini_batch_size=cfg.mini_batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
            ppo_epochs=cfg.ppo_epochs, init_kl_coef=cfg.init_kl_coef, adap_kl_ctrl=cfg.adap_kl_ctrl,
            target=cfg.target, horizon=cfg.horizon, gamma=cfg.gamma, lam=cfg.lam, cliprange=cfg.cliprange,
            cliprange_value=cfg.cliprange_value, vf_coef=cfg.vf_coef, kl_penalty=cfg.kl_penalty,
            max_grad_norm=cfg.max_grad_norm, score_clip=cfg.score_clip, remove_unused_columns=False,
        )


def _accepts_logits_to_keep(model) -> bool:
    model = getattr(model, "module", model)  # DDP
    base = getattr(model, "pretrained_model", model)
    if hasattr(base, "get_base_model"):  # peft
        base = base.get_base_model()
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def pass_plan(lengths: list[int], max_tokens: int, packed: bool = False) -> list[list[int]]:
    """Sample indices grouped into forward passes of at most ``max_tokens`` tokens each: the sum of the
    lengths for ``packed`` passes, else samples x longest (padding counts); 0 = no limit, everything in
    one pass in the given order.

    Over the limit, the fewest passes that fit: for padded passes runs of like-length sequences (longest
    first, so little is padded) of near-equal count, for packed ones near-equal token counts. A sequence
    longer than the limit gets a pass of its own.
    """
    def cost(group):  # groups are sorted longest first
        return sum(lengths[i] for i in group) if packed else len(group) * lengths[group[0]]

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


def _hf_config(model):
    """The transformers config of a (DDP-wrapped) value-head model."""
    return getattr(model, "module", model).pretrained_model.config


@functools.cache
def windowed_ppo_trainer():
    """trl's PPOTrainer doing only the work PPO reads, within a memory budget, with the same results up to
    float rounding (trl imported on first use). Four changes, each measured in benchmarks/README.md:

    * Logits on the response window. trl projects every position of query + response onto the
      vocabulary and, with ``kl_penalty="full"``, takes two log-softmaxes and a KL over all of them,
      then masks all but the response; for the observer, whose prompt carries the query and the
      pioneer's answer, that is most of the sequence. Here each sample's response positions are
      gathered (``logits_to_keep``) into a [batch, longest response] window before the LM head, and
      every tensor PPO uses afterwards (log-probs, values, masks, logits) lives on that window,
      aligned at the response start. Positions outside it were masked out, and GAE runs backwards,
      so nothing before a response could reach it.
    * The rollout pass is epoch 0's training pass. With one mini-batch per epoch, trl's first
      training forward sees the same weights and inputs as its no-grad rollout forward (both in eval
      mode), so the rollout pass keeps its autograd graph and that training forward is skipped.
    * A token budget per forward pass (``max_pass_tokens``). Activation memory grows with the tokens
      of one pass, and the observer's prompts are two to three times the pioneer's. A mini-batch over
      the budget is run as several passes of like-length sequences, each pass's loss weighted by its
      share of the mini-batch's response tokens and back-propagated at once, so the gradients add up
      to the one-pass gradient (trl's losses are token means over the mini-batch) while only one
      pass's activations are alive. trl's rule that skips a mini-batch whose mean probability ratio
      exceeds ``ratio_threshold`` is applied once, to the whole mini-batch, as trl does.
    * Packed passes (cory.packing): the sequences of a pass share one row, so the linear layers see no
      padding; attention alone is run per sequence. Models it cannot serve get right-padded passes.
    """
    from trl import PPOTrainer
    from trl.core import logprobs_from_logits, masked_mean

    class WindowedPPOTrainer(PPOTrainer):
        reuse_rollout = True
        pack = True  # padding-free passes (cory.packing) where the model allows them
        max_pass_tokens = 0  # set per agent from the config; 0 = one pass per mini-batch (trl's way)
        _window = None  # the longest response while step() runs on the window; None = trl's own path
        _reuse = False  # whether this step() keeps the rollout pass's graph for epoch 0
        _passes = 0  # forward passes so far in this step(): rollout, reference, then training
        _rollout = None
        _deferred = None  # a training mini-batch over the budget: run pass by pass in train_minibatch

        def step(self, queries, responses, scores, response_masks=None):
            usable = (response_masks is None and not self.is_encoder_decoder
                      and _accepts_logits_to_keep(self.model)
                      and (self.ref_model is None or _accepts_logits_to_keep(self.ref_model)))
            self._window = max(len(r) for r in responses) if usable else None
            self._reuse = (self.reuse_rollout and usable and self.config.mini_batch_size >= len(queries)
                           and not self.is_distributed and len(self._plan(queries, responses)) == 1)
            self._passes, self._rollout, self._deferred = 0, None, None
            try:
                return super().step(queries, responses, scores, response_masks)
            finally:
                self._window, self._rollout, self._deferred = None, None, None

        def _packs(self, model) -> bool:
            """Whether ``model``'s passes are packed (cory.packing) or right-padded."""
            from cory import packing

            return self.pack and packing.supported(_hf_config(model))

        def _plan(self, queries, responses, model=None) -> list[list[int]]:
            return pass_plan([len(q) + len(r) for q, r in zip(queries, responses)], self.max_pass_tokens,
                             self._packs(self.model if model is None else model))

        def batched_forward_pass(self, model, queries, responses, model_inputs, return_logits=False,
                                 response_masks=None):
            if self._window is None:
                return super().batched_forward_pass(model, queries, responses, model_inputs, return_logits,
                                                    response_masks)
            self._passes += 1
            if self._passes == 1 and self._reuse:  # the policy's rollout pass (trl runs it under no_grad)
                with torch.enable_grad():
                    out = self._window_pass(model, queries, responses, True)
                self._rollout = (out, list(queries), list(responses))
                logprobs, logits, values, masks = out
                return logprobs.detach(), logits.detach() if return_logits else None, values.detach(), masks
            if self._passes == 3 and self._rollout is not None:  # epoch 0's only mini-batch
                reused, self._rollout = self._from_rollout(queries, responses), None
                if reused is not None:
                    return reused
            if self._passes >= 3 and len(self._plan(queries, responses)) > 1:
                # a training mini-batch over the budget: train_minibatch, which trl calls next with these
                # outputs and nothing else, runs it pass by pass
                self._deferred = (list(queries), list(responses))
                placeholder = torch.zeros(len(queries), self._window, device=self.current_device)
                return placeholder, placeholder, placeholder, placeholder
            return self._window_pass(model, queries, responses, return_logits)

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

        def _window_pass(self, model, queries, responses, return_logits):
            """Log-probs, logits (or None), values and masks on the response window, in the order given,
            computed pass by pass as ``max_pass_tokens`` allows, each pass packed (cory.packing) when the
            model allows it, else right-padded. With grad on, every pass's graph stays alive."""
            from cory import packing

            device = self.current_device
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            config, pack = _hf_config(model), self._packs(model)
            k = torch.arange(self._window, device=device)
            pieces, order = [], []
            model.eval()
            for idx in self._plan(queries, responses, model):
                qs, rs = [queries[i] for i in idx], [responses[i] for i in idx]
                seqs = [torch.cat([q, r]).to(device) for q, r in zip(qs, rs)]
                q_len = torch.tensor([len(q) for q in qs], device=device)
                r_len = torch.tensor([len(r) for r in rs], device=device)
                masks = (k[None, :] < r_len[:, None]).long()
                if pack:
                    with packing.packed(config, [len(s) for s in seqs], device) as layout:
                        input_ids = torch.cat(seqs).unsqueeze(0)
                        # the logits at position t score token t + 1: response token k of sequence i is
                        # scored at start_i + len(q_i) - 1 + k (past the response: its last position, masked)
                        positions = torch.minimum((layout.starts + q_len - 1)[:, None] + k,
                                                  (layout.starts + q_len + r_len - 2)[:, None])
                        logits, _, values = model(input_ids=input_ids, position_ids=layout.position_ids,
                                                  logits_to_keep=positions.reshape(1, -1), use_cache=False)
                    logits = logits.reshape(len(idx), self._window, -1)
                    values, labels = values[0][positions], input_ids[0][positions + 1]
                else:
                    input_ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad)
                    attention = torch.nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)
                    positions = ((q_len - 1)[:, None] + k).clamp(max=input_ids.shape[1] - 2)
                    logits, _, values = model(input_ids=input_ids, attention_mask=attention,
                                              logits_to_keep=positions, use_cache=False)
                    values, labels = values.gather(1, positions), input_ids.gather(1, positions + 1)
                pieces.append((logprobs_from_logits(logits, labels), logits if return_logits else None, values, masks))
                order += idx
            if len(pieces) == 1 and order == list(range(len(order))):
                return pieces[0]
            inverse = torch.empty(len(order), dtype=torch.long, device=device)
            inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)

            def joined(j):
                return torch.cat([p[j] for p in pieces])[inverse] if pieces[0][j] is not None else None
            return joined(0), joined(1), joined(2), joined(3)

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
                    sync = contextlib.nullcontext() if last or not self.is_distributed else self.accelerator.no_sync(self.model)
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
            return super().loss(old_logprobs, values, logits.detach(), vpreds, logprobs, mask, advantages,
                                returns)

    return WindowedPPOTrainer


class Agent:
    """One trainable LLM with everything that must travel with it when roles are exchanged."""

    def __init__(self, name: str, cfg: PPOArgs, policy, ref_model, tokenizer):
        self.name = name
        self.cfg = cfg
        self.tokenizer = tokenizer
        self._policy = policy
        self.activate()  # trl builds the optimizer from the parameters that require grad right now
        with warnings.catch_warnings(), _frozen_models_not_wrapped():
            warnings.simplefilter("ignore")  # deprecation and "no dataset" notices of the classic API
            self.trainer = self.trainer_class()(config=ppo_config(cfg), model=policy, ref_model=ref_model,
                                                tokenizer=tokenizer, optimizer=self.make_optimizer(policy))
        self.trainer.max_pass_tokens = cfg.max_pass_tokens
        self.normalizer = ScoreNormalizer()

    def trainer_class(self):
        return windowed_ppo_trainer()

    def make_optimizer(self, policy):
        """trl's default optimizer (Adam at the configured rate) in torch's fused form: the same update
        to float rounding, about 4x faster on CPU (benchmarks/README.md). None lets trl build its own."""
        trainable = [p for p in policy.parameters() if p.requires_grad]
        return torch.optim.Adam(trainable, lr=self.cfg.learning_rate, fused=True)

    @property
    def policy(self):
        """The unwrapped value-head model (DDP adds a wrapper in multi-process runs)."""
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def activate(self) -> None:
        """Switch a shared LoRA base to this agent's adapter (a no-op for agents with their own model)."""
        from cory.assets import activate_adapter

        activate_adapter(self._policy)

    @property
    def kl_coef(self) -> float:
        return float(self.trainer.kl_ctl.value)

    @torch.inference_mode()
    def generate(self, prompts: list[torch.Tensor], max_new_tokens: int, gen_kwargs: dict,
                 min_new_tokens: int = 0) -> list[torch.Tensor]:
        # trl leaves the model in train mode after step(), so its next generation would sample with
        # dropout on (GPT-2 has 0.1) while PPO scores those tokens with dropout off: sample in eval mode.
        self.activate()
        self.trainer.model.eval()
        # one batched call for the whole batch (trl's default of 4 per call is several times slower)
        if min_new_tokens:  # EOS is masked out until then
            gen_kwargs = {**gen_kwargs, "min_new_tokens": min_new_tokens}
        return self.trainer.generate(prompts, batch_size=len(prompts), return_prompt=False,
                                     max_new_tokens=max_new_tokens, **gen_kwargs)

    def step(self, queries, responses, scores: list[float]) -> dict:
        self.activate()
        if self.cfg.score_norm:
            # statistics over the whole data-parallel batch (as trl's own score scaling), so every
            # process holds the same normaliser and the checkpoint's copy is right for all of them
            everyone = _all_gather_floats(scores)
            rank = torch.distributed.get_rank() if _distributed() else 0
            scores = self.normalizer(everyone)[rank * len(scores): (rank + 1) * len(scores)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return self.trainer.step(queries, responses, [torch.tensor(s, dtype=torch.float32) for s in scores])

    def reset_optimizer_state(self) -> None:
        """The authors' exchange reloads fresh PPOTrainers: new Adam moments, KL coefficient and score stats."""
        from trl.trainer.utils import AdaptiveKLController, FixedKLController

        self.trainer.optimizer.state.clear()
        cfg = self.cfg
        self.trainer.kl_ctl = (AdaptiveKLController(cfg.init_kl_coef, cfg.target, cfg.horizon)
                               if cfg.adap_kl_ctrl else FixedKLController(cfg.init_kl_coef))
        self.normalizer = ScoreNormalizer()

    def state_dict(self) -> dict:
        self.activate()  # "requires grad" marks this agent's own adapter on a shared base
        return {
            "params": {n: p.detach() for n, p in self.policy.named_parameters() if p.requires_grad},
            "optimizer": self.trainer.optimizer.state_dict(),
            "kl_coef": self.trainer.kl_ctl.value,
            "normalizer": self.normalizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.activate()
        params = dict(self.policy.named_parameters())
        with torch.no_grad():
            for n, value in state["params"].items():
                params[n].copy_(value)
        self.trainer.optimizer.load_state_dict(state["optimizer"])
        self.trainer.kl_ctl.value = state["kl_coef"]
        self.normalizer.load_state_dict(state["normalizer"])


# ----------------------------------------------------------------------------- helpers

def generation_kwargs(cfg: PPOArgs, tokenizer, task) -> dict:
    kwargs = dict(do_sample=True, top_k=cfg.top_k, top_p=cfg.top_p, temperature=cfg.temperature,
                  repetition_penalty=cfg.repetition_penalty, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    stop = getattr(task, "stop", None)
    if stop:
        kwargs.update(stop_strings=[stop], tokenizer=tokenizer)
    return kwargs


def trim_to_text(ids: torch.Tensor, tokenizer, kept: str) -> torch.Tensor:
    """The longest prefix of ``ids`` whose text the task keeps (at least one token for trl)."""
    kept = kept.rstrip()
    n = len(ids)
    while n > 1 and not kept.startswith(tokenizer.decode(ids[:n], skip_special_tokens=True).rstrip()):
        n -= 1
    return ids[:n]


def decode_and_clean(task, tokenizer, responses: list[torch.Tensor]) -> tuple[list[str], list[torch.Tensor]]:
    texts, kept_ids = [], []
    for ids in responses:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        clean = task.clean_response(text)
        if clean != text:
            ids = trim_to_text(ids, tokenizer, clean)
        texts.append(clean)
        kept_ids.append(ids)
    return texts, kept_ids


def tokenize_prompts(tokenizer, examples, texts: list[str] | None = None) -> list[torch.Tensor]:
    """Prompt tensors; an example's own ``prompt_ids`` win when the pioneer reads ``example.prompt``."""
    out = []
    for i, ex in enumerate(examples):
        if texts is None and ex.prompt_ids is not None:
            out.append(torch.tensor(ex.prompt_ids, dtype=torch.long))
        else:
            text = ex.prompt if texts is None else texts[i]
            out.append(torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"] or
                                    [tokenizer.eos_token_id], dtype=torch.long))
    return out


def score_batch(task, examples, responses: list[str], reward_name: str | None = None) -> list[float]:
    name = reward_name or getattr(task, "reward_name", task.name)
    try:
        scores = _scores(task, examples, responses)
    except Exception as e:  # a reward model's failure must say what it was scoring
        index = getattr(e, "index", None)
        if index is None:
            index = _first_failing_text(task, examples, responses)
        where = f" on text {index} ({responses[index][:60]!r})" if index is not None else ""
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunError(f"reward {name} failed{where}: {type(e).__name__}: {first_line}") from e
    if len(scores) != len(responses):
        raise RunError(f"reward {name} returned {len(scores)} scores for {len(responses)} texts")
    return scores


def _scores(task, examples, responses) -> list[float]:
    return [float(s) for s in task.score(examples, responses)]


def _first_failing_text(task, examples, responses) -> int | None:
    """The index of the first text the reward fails on alone: the batch failed, so find which text did."""
    for i, (example, response) in enumerate(zip(examples, responses)):
        try:
            _scores(task, [example], [response])
        except Exception:
            return i
    return None


def rng_state(length_rng: np.random.Generator) -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "length": length_rng.bit_generator.state}


def set_rng_state(state: dict, length_rng: np.random.Generator) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    length_rng.bit_generator.state = state["length"]


def agent_metrics(prefix: str, task_rewards, train_rewards, stats: dict, responses, kl_coef: float) -> dict:
    task_reward = float(np.mean(task_rewards))
    kl = float(stats["objective/kl"])
    return {
        f"{prefix}/task_reward": task_reward,
        f"{prefix}/collective_reward": float(np.mean(train_rewards)),
        f"{prefix}/kl": kl,
        f"{prefix}/kl_coef": kl_coef,
        f"{prefix}/combined_reward": combined_reward(task_reward, kl, kl_coef),
        f"{prefix}/response_length": float(np.mean([len(r) for r in responses])),
        f"{prefix}/entropy": float(stats["objective/entropy"]),
        f"{prefix}/policy_loss": float(stats["ppo/loss/policy"]),
        f"{prefix}/value_loss": float(stats["ppo/loss/value"]),
    }


# ----------------------------------------------------------------------------- the run

@dataclass
class Run:
    cfg: PPOArgs
    method: str  # "ppo" | "cory"
    task: object
    tokenizer: object
    agents: dict
    run_dir: RunDir
    length_rng: np.random.Generator
    reference: object = None
    start_step: int = 0
    world_size: int = 1
    gen_kwargs: dict = field(default_factory=dict)
    iteration_start: dict | None = None  # sampler_state() before the current iteration drew its batch

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> Path:
        from tqdm.auto import tqdm

        cfg, run_dir = self.cfg, self.run_dir
        resume = cfg.resume is not None
        run_dir.start(to_dict(cfg), resume_step=self.start_step if resume else None, overwrite=cfg.overwrite)
        wandb_run = None
        if cfg.report_to == "wandb" and run_dir.enabled:
            import wandb
            wandb_run = wandb.init(project="cory", config=to_dict(cfg), name=Path(cfg.output_dir).name,
                                   resume="allow")
        iteration = self.cory_iteration if self.method == "cory" else self.ppo_iteration
        bar = tqdm(range(self.start_step, cfg.steps), initial=self.start_step, total=cfg.steps,
                   desc=f"{self.method} {cfg.task}", disable=not run_dir.enabled, dynamic_ncols=True)
        try:
            with _StopOnInterrupt(verbose=run_dir.enabled) as interrupt:
                for step in bar:
                    t0 = time.perf_counter()
                    memory.reset_peak()
                    self.iteration_start = self.sampler_state()
                    batch = self.task.sample(cfg.batch_size)
                    row, samples = iteration(step, batch)
                    if row is not None:  # None: a batch skipped for non-finite rewards
                        row = {"step": step, **row, "time/iteration_s": time.perf_counter() - t0,
                               "memory/peak_gib": memory.peak_gib(), "world_size": self.world_size}
                        row = _mean_over_processes(row)
                        run_dir.log_metrics(row)
                        run_dir.log_samples(samples)
                        if wandb_run is not None:
                            wandb_run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
                        bar.set_postfix(_postfix(row))
                    done = step + 1
                    if done < cfg.steps and _any_over_processes(interrupt.requested):
                        self.save(done)
                        bar.close()
                        if run_dir.enabled:
                            print(f"interrupted: checkpoint of {done} iterations saved in {cfg.output_dir}; "
                                  f"continue with --resume {cfg.output_dir}", file=sys.stderr)
                        raise SystemExit(130)
                    if done % cfg.save_every == 0 and done < cfg.steps:
                        self.save(done)
                bar.close()
                self.save(cfg.steps)
                self.save_final()
        except KeyboardInterrupt:
            # a second Ctrl-C: the current iteration is half done, so nothing new is saved
            bar.close()
            if run_dir.enabled:
                print(f"interrupted: nothing saved; the last checkpoint is {latest_checkpoint(run_dir.path)}",
                      file=sys.stderr)
            raise SystemExit(130)
        if wandb_run is not None:
            wandb_run.finish()
        return Path(cfg.output_dir)

    # -- one iteration ---------------------------------------------------------------------------
    def response_length(self) -> int:
        return int(self.length_rng.integers(self.cfg.response_length_min, self.cfg.response_length_max + 1))

    def answer(self, agent, prompts):
        """``agent``'s sampled answers to ``prompts``, one drawn length for the batch (the paper's
        LengthSampler); unless ``allow_early_eos``, every answer has exactly that length."""
        length = self.response_length()
        return agent.generate(prompts, length, self.gen_kwargs, 0 if self.cfg.allow_early_eos else length)

    def ppo_iteration(self, step: int, batch) -> tuple[dict, list[dict]]:
        agent = self.agents["policy"]
        t = {}
        t0 = time.perf_counter()
        queries = tokenize_prompts(self.tokenizer, batch)
        raw = self.answer(agent, queries)
        texts, responses = decode_and_clean(self.task, self.tokenizer, raw)
        t["time/generate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rewards = score_batch(self.task, batch, texts, self.cfg.reward_model)
        t["time/reward_s"] = time.perf_counter() - t0
        if not self.check_finite(step, "policy", rewards):
            return None, []
        kl_coef = agent.kl_coef
        t0 = time.perf_counter()
        stats = agent.step(queries, responses, rewards)
        t["time/step_s"] = time.perf_counter() - t0
        self.check_loss(step, "policy", stats)
        row = agent_metrics("policy", rewards, rewards, stats, responses, kl_coef)
        row.pop("policy/collective_reward")
        row.update(t)
        samples = [{"step": step, "query": ex.query, "response": text, "reward": r}
                   for ex, text, r in list(zip(batch, texts, rewards))[: self.cfg.samples_per_step]]
        return row, samples

    def cory_iteration(self, step: int, batch) -> tuple[dict, list[dict]]:
        cfg: CoryArgs = self.cfg
        t = {}
        t0 = time.perf_counter()
        if is_swap_step(step, cfg.swap_period) and cfg.reset_on_swap:
            for agent in self.agents.values():
                agent.reset_optimizer_state()
        t["time/swap_s"] = time.perf_counter() - t0
        p_name = pioneer_name(step, cfg.swap_period)
        o_name = "llm2" if p_name == "llm1" else "llm1"
        pioneer, observer = self.agents[p_name], self.agents[o_name]

        t0 = time.perf_counter()
        p_queries = tokenize_prompts(self.tokenizer, batch)
        p_raw = self.answer(pioneer, p_queries)
        p_texts, p_responses = decode_and_clean(self.task, self.tokenizer, p_raw)
        t["time/pioneer_generate_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        # knowledge transfer: the observer reads the query and the pioneer's answer
        o_prompts = ([self.task.observer_prompt(ex, a1) for ex, a1 in zip(batch, p_texts)]
                     if cfg.knowledge_transfer else None)
        o_queries = tokenize_prompts(self.tokenizer, batch, o_prompts)
        o_raw = self.answer(observer, o_queries)
        o_texts, o_responses = decode_and_clean(self.task, self.tokenizer, o_raw)
        t["time/observer_generate_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        # one reward call for both agents: each answer is scored with the query alone (not the observer prompt)
        both = score_batch(self.task, list(batch) + list(batch), p_texts + o_texts, cfg.reward_model)
        r_p, r_o = both[: len(batch)], both[len(batch):]
        s_p = collective_rewards(r_p, r_o, cfg.other_reward_coef)
        s_o = collective_rewards(r_o, r_p, cfg.other_reward_coef)
        t["time/reward_s"] = time.perf_counter() - t0
        if not (self.check_finite(step, p_name, r_p) and self.check_finite(step, o_name, r_o)):
            return None, []

        coefs = {p_name: pioneer.kl_coef, o_name: observer.kl_coef}
        t0 = time.perf_counter()
        p_stats = pioneer.step(p_queries, p_responses, s_p)
        t["time/pioneer_step_s"] = time.perf_counter() - t0
        self.check_loss(step, p_name, p_stats)
        t0 = time.perf_counter()
        o_stats = observer.step(o_queries, o_responses, s_o)
        t["time/observer_step_s"] = time.perf_counter() - t0
        self.check_loss(step, o_name, o_stats)

        row = {"pioneer": p_name}
        row.update(agent_metrics(p_name, r_p, s_p, p_stats, p_responses, coefs[p_name]))
        row.update(agent_metrics(o_name, r_o, s_o, o_stats, o_responses, coefs[o_name]))
        row.update(t)
        samples = []
        for i in range(min(self.cfg.samples_per_step, len(batch))):
            samples.append({
                "step": step, "pioneer": p_name, "query": batch[i].query,
                "pioneer_response": p_texts[i], "pioneer_reward": r_p[i],
                "observer_prompt": o_prompts[i] if o_prompts else batch[i].prompt,
                "observer_response": o_texts[i], "observer_reward": r_o[i],
            })
        return row, samples

    # -- safety ----------------------------------------------------------------------------------
    def check_finite(self, step: int, agent: str, rewards: list[float]) -> bool:
        """False (skip the batch) or RunError on a non-finite reward in any process; every process decides alike."""
        bad = [i for i, r in enumerate(rewards) if not math.isfinite(r)]
        if not _any_over_processes(bool(bad)):
            return True
        where = f"text {bad[0]}" if bad else "in another process"
        if self.cfg.on_nonfinite == "skip":
            warnings.warn(f"step {step}: non-finite reward for {agent} ({where}); batch skipped")
            return False
        # no agent has taken this iteration's PPO step yet: save the state the iteration started from
        self.save(step, self.iteration_start)
        raise RunError(f"step {step}: non-finite reward for {agent} ({where}); the last good state is saved "
                       f"in {latest_checkpoint(self.run_dir.path)}; use --on_nonfinite skip to skip such batches")

    def check_loss(self, step: int, agent: str, stats: dict) -> None:
        loss = float(stats["ppo/loss/total"])
        if not math.isfinite(loss):
            last = latest_checkpoint(self.run_dir.path)
            raise RunError(f"step {step}: non-finite PPO loss for {agent}; the last good checkpoint is {last}")

    # -- checkpoints -----------------------------------------------------------------------------
    def sampler_state(self) -> dict:
        """Where this process's data and random streams stand."""
        import copy

        return {"task": copy.deepcopy(self.task.state_dict()), "rng": rng_state(self.length_rng)}

    def save(self, step: int, sampler: dict | None = None) -> None:
        """Checkpoint after ``step`` completed iterations (everything a resumed run needs).

        The agents are the same in every process; the data and random streams are not, so the main
        process saves every process's ``sampler`` (default: where they stand now).
        """
        samplers = _all_gather_objects(sampler or self.sampler_state())

        def write(folder: Path):
            for name, agent in self.agents.items():
                torch.save(agent.state_dict(), folder / f"{name}.pt")
            torch.save({"step": step, **samplers[0], "other_ranks": samplers[1:]}, folder / "state.pt")
        self.run_dir.save_checkpoint(step, write, keep=self.cfg.keep_checkpoints)
        _barrier()  # no process runs ahead of, or later resumes from, a checkpoint still being written

    def restore(self, folder: Path) -> None:
        for name, agent in self.agents.items():
            agent.load_state_dict(torch.load(folder / f"{name}.pt", weights_only=False))
        state = torch.load(folder / "state.pt", weights_only=False)
        others = state.get("other_ranks", [])
        rank = torch.distributed.get_rank() if _distributed() else 0
        if 1 + len(others) != self.world_size:
            warnings.warn(f"resume: {folder} was written by {1 + len(others)} processes and this run has "
                          f"{self.world_size}; processes without a saved data stream start a fresh one")
        mine = state if rank == 0 else (others[rank - 1] if rank <= len(others) else None)
        if mine is not None:
            self.task.load_state_dict(mine["task"])
            set_rng_state(mine["rng"], self.length_rng)
        else:  # response lengths stay common to all processes
            self.length_rng.bit_generator.state = state["rng"]["length"]
        self.start_step = state["step"]

    def save_final(self) -> None:
        """The plain final models, from the main process, once every process holds the same weights."""
        digests = ({name: weights_digest(agent.state_dict()["params"]) for name, agent in self.agents.items()}
                   if self.world_size > 1 else {})
        everyone = _all_gather_objects(digests)
        if self.run_dir.enabled:
            for name, agent in self.agents.items():
                out = self.run_dir.path / "final" / name
                agent.activate()  # merge_and_unload merges the active adapter only
                model = agent.policy.pretrained_model
                if getattr(agent.policy, "is_peft_model", False):
                    # a plain model that loads from the query alone, without peft or the base
                    import copy
                    model = copy.deepcopy(model).merge_and_unload()
                model.save_pretrained(out)
                self.tokenizer.save_pretrained(out)
            if self.world_size > 1:
                record = {name: [d[name] for d in everyone] for name in digests}
                (self.run_dir.path / "final" / "weight_digests.json").write_text(json.dumps(record, indent=1))
        _barrier()
        for name in digests:
            if len({d[name] for d in everyone}) > 1:
                raise RunError(f"{name}: the {len(everyone)} processes ended with different weights (sha256 per "
                               f"process in {self.run_dir.path / 'final' / 'weight_digests.json'})")


def weights_digest(params: dict) -> str:
    """sha256 of ``{name: tensor}`` (names and bytes, in name order): equal digests, equal weights.
    Applied to an agent's trainable parameters, as its checkpoint saves them under ``params``."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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


def _distributed_setup() -> tuple[int, int]:
    """(rank, world size). Under torchrun on CPU, accelerate must be told cpu=True before trl loads
    a model, or every process silently trains alone (checked with trl 0.11.4 + accelerate 1.15)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())
        return state.process_index, state.num_processes
    return 0, 1


def prepare_run(cfg: PPOArgs, method: str) -> Run:
    """Everything a run needs, loaded and (with ``resume``) restored; nothing is written yet."""
    from cory import assets
    from cory.tasks import make_task

    resume = cfg.resume is not None
    check_output_dir(cfg.output_dir, resume=resume, overwrite=cfg.overwrite)
    if cfg.load_in_4bit and not torch.cuda.is_available():
        raise ConfigError("load_in_4bit: needs a CUDA GPU and bitsandbytes; set load_in_4bit: false on CPU")
    rank, world = _distributed_setup()
    return_freed_memory()

    torch.manual_seed(cfg.seed)
    tokenizer = assets.load_tokenizer(cfg.model_name)
    task = make_task(cfg, tokenizer, rank=rank)
    names = ["policy"] if method == "ppo" else list(AGENTS)
    reference = assets.load_reference(cfg.model_name, use_peft=cfg.use_peft)  # loaded once, shared
    # with LoRA both agents' adapters sit on one shared frozen base (single process only: DDP wants
    # one wrapper per set of weights)
    policies = assets.load_policies(cfg.model_name, names, use_peft=cfg.use_peft, shared_base=world == 1,
                                    lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                    lora_dropout=cfg.lora_dropout, load_in_4bit=cfg.load_in_4bit)
    agents = {name: Agent(name, cfg, policies[name], reference, tokenizer) for name in names}

    run = Run(cfg=cfg, method=method, task=task, tokenizer=tokenizer, agents=agents,
              run_dir=RunDir(cfg.output_dir, enabled=rank == 0), reference=reference,
              length_rng=np.random.default_rng(cfg.seed), world_size=world,
              gen_kwargs=generation_kwargs(cfg, tokenizer, task))
    # trl seeds every RNG when it builds a trainer; seed again so the run depends on cfg.seed alone
    torch.manual_seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    random.seed(cfg.seed + rank)
    if resume:
        run.restore(latest_checkpoint(cfg.output_dir))
    return run


def train(cfg: PPOArgs, method: str) -> Path:
    """Run PPO (one agent) or CORY (two agents) as configured; returns the output folder."""
    return prepare_run(cfg, method).fit()


# ----------------------------------------------------------------------------- data-parallel helpers
# Every process calls these at the same points; with one process they do nothing.

def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _device() -> torch.device:
    """Where collectives take their tensors (NCCL wants the process's GPU, gloo the CPU)."""
    from accelerate import PartialState

    return PartialState().device


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()


def _any_over_processes(flag: bool) -> bool:
    if not _distributed():
        return bool(flag)
    t = torch.tensor([int(bool(flag))], device=_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


def _all_gather_objects(obj) -> list:
    """``obj`` of every process, in rank order."""
    if not _distributed():
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def _all_gather_floats(values: list[float]) -> list[float]:
    """The same-length ``values`` of every process, concatenated in rank order."""
    if not _distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, t)
    return torch.cat(parts).tolist()


def _mean_over_processes(row: dict) -> dict:
    """Average the numeric metrics over data-parallel processes (trl already averages its own stats)."""
    if not _distributed():
        return row
    keys = [k for k, v in row.items() if isinstance(v, float)]
    values = torch.tensor([row[k] for k in keys], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(values)
    values /= torch.distributed.get_world_size()
    return {**row, **dict(zip(keys, values.tolist()))}


@contextlib.contextmanager
def _frozen_models_not_wrapped():
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


class _StopOnInterrupt:
    """Ctrl-C (SIGINT) asks the loop to stop at the end of the current iteration, so the checkpoint it
    then saves is a state the run really passed through; a second Ctrl-C stops at once, saving nothing.
    torchrun forwards one SIGINT to each process, and the processes agree on the iteration to stop after."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.verbose:
            print("\nstopping after this iteration and saving a checkpoint (Ctrl-C again: stop now, save nothing)",
                  file=sys.stderr, flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def _postfix(row: dict) -> dict:
    out = {}
    for prefix in ("policy", "llm1", "llm2"):
        if f"{prefix}/task_reward" in row:
            out[f"{prefix[-1] if prefix != 'policy' else ''}r"] = f"{row[f'{prefix}/task_reward']:.3f}"
            out[f"{prefix[-1] if prefix != 'policy' else ''}kl"] = f"{row[f'{prefix}/kl']:.2f}"
    return out
