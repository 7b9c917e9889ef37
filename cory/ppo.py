"""One PPO update of one agent, top to bottom: what ``agent.step(queries, responses, scores)`` does.

The trainer is still trl's ``PPOTrainer`` (its models, Adam optimizer and accelerator), with its ``step`` and its KL
controller (``KLController``) written out here so that every line of PPO is in view (Schulman et al. 2017; Ziegler et al. 2019):

1. **rollout pass**: one pass of the policy over query + response gives each response token's log-prob and value;
   the frozen reference's log-probs and the full-vocabulary KL(policy || reference) per token come from the same
   pass (``cory.passes``: response window, token budget, packing);
2. **rewards** (``per_token_rewards``): -η·KL at every response token, plus the task score at the last one;
3. **advantages** (``advantages``: the learner switch, ``advantage_estimator``): ``gae``, PPO's own: GAE (γ, λ) on
   the value head over the response, then whitened over the batch (``gae``, ``whiten``); or, with no critic, the
   score less a baseline taken over the K answers to the same prompt (``leave_one_out``: RLOO; ``group_normalised``:
   GRPO), summed with the KL penalties that follow each token (``reward_to_go``);
4. **updates**: ``ppo_epochs`` passes over the batch in shuffled mini-batches, each one Adam step on the clipped
   policy loss plus ``vf_coef`` × the clipped value loss (``clipped_losses``; no value loss without a critic);
5. **statistics** (``StepStats``), and the adaptive KL controller's update of η from this batch's KL.

Each formula is trl 0.11.4's (``compute_rewards``, ``compute_advantages``, ``loss``, ``record_step_stats``),
checked against it in tests/test_ppo_passes.py. ``fast_ppo: false`` runs trl's own ``PPOTrainer.step`` instead
(the same numbers up to float rounding), as does a model this step cannot serve (no ``logits_to_keep``, or
encoder-decoder); its statistics are read into the same ``StepStats``.

Adding an estimator: a function of the scores and K beside ``leave_one_out`` in ``CRITIC_FREE`` (or a branch in
``advantages`` for one that needs values), and its name in ``advantage_estimator``'s choices in ``cory.config``
(tests/test_advantages.py checks the two agree).
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from trl import PPOConfig, PPOTrainer
from trl.core import PPODecorators, entropy_from_logits, masked_mean

from cory.config import TRL_FIELDS, PPOArgs, has_critic
from cory.errors import RunError
from cory.device.budget import resolve_budget
from cory.passes import WindowOutputs, accepts_logits_to_keep, pass_plan, packs, shared_tokens, window_passes


class KLController:
    """η, the KL penalty's coefficient: fixed, or adapted towards a target KL (Ziegler et al. 2019, "Fine-Tuning
    Language Models from Human Preferences", §2.2): after each batch of n samples with mean KL k,

        η ← η · (1 + clip(k / target − 1, −0.2, 0.2) · n / horizon),

    a proportional controller whose error is clipped, so that η moves by at most 0.2 · n / horizon per batch. trl
    0.11.4's ``AdaptiveKLController`` and ``FixedKLController`` in one class (checked equal on recorded inputs in
    tests/test_ppo_formulas.py); trl's ``PPOTrainer`` reads ``value`` and calls ``update`` as it does theirs."""

    def __init__(self, init_kl_coef: float, target: float | None = None, horizon: float = 10000.0):
        self.value = init_kl_coef
        self.target = target  # None: fixed
        self.horizon = horizon

    def update(self, current: float, n_steps: int) -> None:
        if self.target is None:
            return
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def ppo_config(cfg: PPOArgs) -> PPOConfig:
    """trl's PPOConfig from the fields that share its names (``cory.config`` marks them): what trl's trainer is
    built with; ``AgentTrainer``'s step reads ``cfg`` itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return PPOConfig(exp_name="cory", log_with=None, remove_unused_columns=False,
                         **{name: getattr(cfg, name) for name in TRL_FIELDS})


def kl_controller(config) -> KLController:
    """The controller a config asks for (``adap_kl_ctrl``, ``init_kl_coef``, ``target``, ``horizon``: our fields or
    trl's PPOConfig, which share the names)."""
    return KLController(config.init_kl_coef, config.target if config.adap_kl_ctrl else None, config.horizon)


class ScoreNormalizer:
    """Running mean/std of training scores (the authors' use_score_scaling + use_score_norm).

    trl 0.11.4's own option crashes ('float' object has no attribute 'to'), so the agent normalises before
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


@dataclass
class PPOBatch:
    """The batch a PPO update reads, on the response window. B samples, W the longest response; every [B, W]
    tensor is aligned at each response's first token and float32 unless said otherwise."""

    queries: list[torch.Tensor]    # B 1-D token tensors: the prompts as the agent read them
    responses: list[torch.Tensor]  # B 1-D token tensors: the sampled answers
    scores: torch.Tensor           # [B]: the task reward of each answer (what the agent is trained on)
    logprobs: torch.Tensor         # [B, W]: the rollout policy's log-prob of each response token (PPO's "old")
    values: torch.Tensor | None    # [B, W]: the value head at each response token (masked to 0); None: no critic
    masks: torch.Tensor            # [B, W] long: 1 on response tokens, 0 past a response's end
    ref_logprobs: torch.Tensor     # [B, W]: the frozen reference's log-prob of each response token
    kl: torch.Tensor               # [B, W]: the per-token KL estimate (full vocabulary for kl_penalty "full")
    rewards: torch.Tensor | None = None            # [B, W]: -η·KL, plus the score at the last token
    non_score_rewards: torch.Tensor | None = None  # [B, W]: -η·KL alone
    advantages: torch.Tensor | None = None         # [B, W]: GAE, whitened over the batch's response tokens (or a
    #                                                critic-free estimator's: ``advantages``)
    returns: torch.Tensor | None = None            # [B, W]: advantages (before whitening) + values

    def minibatch(self, index) -> "PPOBatch":
        """The samples ``index`` (a numpy array of positions) of every field."""
        t = torch.as_tensor(index, device=self.logprobs.device)
        tensors = {name: None if (v := getattr(self, name)) is None else v[t] for name in
                   ("scores", "logprobs", "values", "masks", "ref_logprobs", "kl", "rewards", "non_score_rewards",
                    "advantages", "returns")}
        return PPOBatch([self.queries[i] for i in index], [self.responses[i] for i in index], **tensors)


# ----------------------------------------------------------------------------- the formulas

def per_token_rewards(scores: torch.Tensor, kl: torch.Tensor, masks: torch.Tensor, kl_coef: float):
    """(rewards, non-score rewards), [B, W] each: -η·KL at every token, plus the score at the last response token
    (trl's ``compute_rewards``, with the per-token KL already taken in the rollout pass)."""
    non_score = -kl_coef * kl
    rewards = non_score.clone()
    last = masks.sum(dim=1) - 1  # the window starts at each response's first token
    rewards[torch.arange(len(scores), device=rewards.device), last] += scores
    return rewards, non_score


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """The per-token KL estimate from the sampled tokens' two log-probs, for ``kl_penalty`` kl, abs or mse (trl's
    ``_kl_penalty``; ``full``, the whole vocabulary's, is taken in the rollout pass)."""
    if kind == "kl":
        return logprobs - ref_logprobs
    if kind == "abs":
        return (logprobs - ref_logprobs).abs()
    if kind == "mse":
        return 0.5 * (logprobs - ref_logprobs).square()
    raise ValueError(f"kl_penalty: {kind!r} has no per-token estimate here")


def gae(values: torch.Tensor, rewards: torch.Tensor, masks: torch.Tensor, gamma: float, lam: float):
    """(advantages, returns), [B, W] each: generalised advantage estimation over the response, from its last token
    backwards: δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}; returns = A + V. Past a response's end values
    and rewards are masked to 0, so nothing there reaches its tokens."""
    values, rewards = values * masks, rewards * masks
    backwards, running = [], torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else 0.0
        running = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        backwards.append(running)
    # [W, B] transposed, as trl lays it out: the whitening's sums then add in trl's order, so the advantages equal
    # trl's to the bit (a last-bit difference grows to percents within two bf16 iterations)
    advantages = torch.stack(backwards[::-1]).transpose(0, 1)
    return advantages, advantages + values


def reward_to_go(rewards: torch.Tensor, masks: torch.Tensor, gamma: float) -> torch.Tensor:
    """[B, W]: each token's discounted sum of the rewards from it to the response's end, Σ_s≥t γ^(s−t)·r_s: GAE
    with every value 0 and λ = 1 (a critic-free learner's return, whose baseline is already in the score)."""
    return gae(torch.zeros_like(rewards), rewards, masks, gamma, 1.0)[0]


def leave_one_out(scores: torch.Tensor, k: int) -> torch.Tensor:
    """RLOO's score (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics"): each answer's score less the mean
    score of the other k − 1 answers to its prompt, an unbiased baseline. ``scores``: [B], a prompt's k answers
    side by side (rows g·k … g·k + k − 1)."""
    grouped = scores.reshape(-1, k)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (k - 1)
    return (grouped - baseline).reshape(-1)


def group_normalised(scores: torch.Tensor, k: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO's score (Shao et al. 2024, DeepSeekMath §4.1.2): each answer's score less its prompt's mean, over the
    prompt's standard deviation (Bessel-corrected) + ``eps`` (trl's GRPOTrainer's); a prompt whose k answers all
    score alike gives each 0. ``scores`` as ``leave_one_out``'s."""
    grouped = scores.reshape(-1, k)
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + eps)).reshape(-1)


# the critic-free estimators: no value head, the baseline taken over each prompt's K answers (``num_generations``)
CRITIC_FREE = {"rloo": leave_one_out, "grpo": group_normalised}
ESTIMATORS = ("gae", *CRITIC_FREE)  # ``advantage_estimator``'s values


def advantages(estimator: str, scores: torch.Tensor, values: torch.Tensor | None, kl: torch.Tensor,
               masks: torch.Tensor, kl_coef: float, k: int, gamma: float, lam: float):
    """The learner switch: (rewards, non-score rewards, advantages, returns), [B, W] each, of ``estimator``. The
    per-token rewards are -η·KL at every token plus the score at the last one (``per_token_rewards``) for all;
    ``gae``: GAE on the value head (``values``, masked), whitened over the batch; ``rloo``, ``grpo``: the score
    replaced by its baselined form over each prompt's ``k`` answers, and the advantage is the reward-to-go as it
    is (the baseline centres it already). The clipped policy loss and η's controller are the same for all."""
    if estimator == "gae":
        rewards, non_score = per_token_rewards(scores, kl, masks, kl_coef)
        gae_advantages, returns = gae(values, rewards, masks, gamma, lam)
        return rewards, non_score, whiten(gae_advantages, masks).detach(), returns
    rewards, non_score = per_token_rewards(CRITIC_FREE[estimator](scores.float(), k), kl, masks, kl_coef)
    returns = reward_to_go(rewards, masks, gamma)
    return rewards, non_score, returns.detach(), returns


def frac_reward_zero_std(scores: torch.Tensor, k: int) -> float:
    """The share of prompts whose ``k`` answers all score alike (``scores`` as ``leave_one_out``'s)."""
    grouped = scores.reshape(-1, k)
    return (grouped == grouped[:, :1]).all(dim=1).float().mean().item()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, masks: torch.Tensor) -> float:
    """How much of the returns' variance the value head explains, over the response tokens (CleanRL's
    ``1 − Var(returns − values) / Var(returns)``): 1 = perfect, 0 = no better than a constant, below 0 = worse;
    NaN when the returns do not vary."""
    kept = masks.bool()
    y, residual = returns[kept].double(), (returns - values)[kept].double()
    var_y = y.var(unbiased=False).item()
    return float("nan") if var_y == 0 else 1.0 - residual.var(unbiased=False).item() / var_y


def whiten(x: torch.Tensor, masks: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``x`` scaled to unit variance over the masked tokens (Bessel-corrected), and centred unless not
    ``shift_mean`` (trl's ``masked_whiten``)."""
    n = masks.sum()
    mean = masked_mean(x, masks)
    var = masked_mean((x - mean) ** 2, masks) * (n / (n - 1))
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def surrogate_terms(mb: PPOBatch, logprobs: torch.Tensor, config, rows=slice(None)):
    """(ratio, −A·ratio, −A·clip(ratio, 1 ± ε)), [len(rows), W] each: the clipped surrogate's two sides, which the loss
    takes the larger of and ``clip_fraction`` counts where the clipped side won."""
    ratio = torch.exp(logprobs - mb.logprobs[rows])
    advantages = mb.advantages[rows]
    return ratio, -advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - config.cliprange, 1.0 + config.cliprange)


def clipped_losses(mb: PPOBatch, logprobs: torch.Tensor, vpreds: torch.Tensor | None, config, rows=slice(None)):
    """(policy loss, value loss): PPO's clipped surrogate and the clipped squared value error, token means over
    the samples ``rows`` of the mini-batch ``mb``; ``logprobs``, ``vpreds``: [len(rows), W], the current policy's.
    The update minimises policy + ``vf_coef`` × value. Without a critic (``vpreds`` None) the value loss is 0."""
    _, unclipped, clipped = surrogate_terms(mb, logprobs, config, rows)
    policy_loss = masked_mean(torch.max(unclipped, clipped), mb.masks[rows])
    return policy_loss, clipped_value_loss(mb, vpreds, config, rows, policy_loss.device)


def clipped_value_loss(mb: PPOBatch, vpreds: torch.Tensor | None, config, rows=slice(None), device=None):
    """The clipped squared value error over ``rows`` (0 without a critic)."""
    if vpreds is None or mb.values is None:
        return torch.zeros((), device=device)
    masks, returns, values = mb.masks[rows], mb.returns[rows], mb.values[rows]
    vpred_clipped = torch.clamp(vpreds, values - config.cliprange_value, values + config.cliprange_value)
    return 0.5 * masked_mean(torch.max((vpreds - returns) ** 2, (vpred_clipped - returns) ** 2), masks)


# ----------------------------------------------------------------------------- the statistics

@dataclass
class MinibatchStats:
    """One optimizer step's statistics (trl's ``loss`` statistics), on the mini-batch's detached outputs."""

    policy_loss: float    # the clipped surrogate (0 for a mini-batch skipped by ratio_threshold, as trl logs it)
    value_loss: float     # the clipped value loss, before vf_coef (likewise)
    total_loss: float     # policy_loss + vf_coef × value_loss (likewise)
    token_entropy: float  # the mean entropy of the next-token distribution at the response's positions
    approx_kl: float      # ½·mean (log π − log π_old)²: how far this update moved the policy
    policy_kl: float      # mean (log π_old − log π), what trl's early_stopping reads (off in trl, not carried here)
    skipped: bool         # the mean ratio passed ratio_threshold: trl zeroes this mini-batch's update
    clip_fraction: float  # the share of tokens whose ratio was clipped
    mean_value: float     # the value head's mean prediction (NaN without a critic)
    mean_return: float    # the mean GAE return it regresses on (without a critic: the mean reward-to-go)


def minibatch_stats(mb: PPOBatch, logprobs, vpreds, token_entropy, config) -> MinibatchStats:
    """``MinibatchStats`` of the mini-batch ``mb`` for the current policy's ``logprobs``, ``vpreds`` and per-token
    ``token_entropy`` ([B, W] each, detached)."""
    masks = mb.masks
    ratio, unclipped, clipped_side = surrogate_terms(mb, logprobs, config)  # read once for the loss and the clip share
    policy_loss = masked_mean(torch.max(unclipped, clipped_side), masks)
    value_loss = clipped_value_loss(mb, vpreds, config, device=policy_loss.device)
    clipped = torch.gt(clipped_side, unclipped).float()
    kept = masked_mean(ratio, masks).item() <= config.ratio_threshold  # else trl zeroes the batch's losses
    return MinibatchStats(skipped=not kept,
        policy_loss=policy_loss.item() * kept, value_loss=value_loss.item() * kept,
        total_loss=(policy_loss + config.vf_coef * value_loss).item() * kept,
        token_entropy=masked_mean(token_entropy, masks).item(),
        approx_kl=0.5 * masked_mean((logprobs - mb.logprobs) ** 2, masks).item(),
        policy_kl=masked_mean(mb.logprobs - logprobs, masks).item(),
        clip_fraction=masked_mean(clipped, masks).item(),
        mean_value=float("nan") if vpreds is None else masked_mean(vpreds, masks).item(),
        mean_return=masked_mean(mb.returns, masks).item())


@dataclass
class StepStats:
    """What one PPO step reports (trl's key in brackets): the batch's statistics, then the means over its
    optimizer steps of ``MinibatchStats``."""

    kl: float                # each answer's summed per-token KL to the reference, mean over the batch (objective/kl)
    sequence_entropy: float  # each answer's summed −log-prob of its sampled tokens, mean over the batch: a sampled
    #                          estimate of the answers' entropy (objective/entropy)
    kl_coef: float           # the η this step's penalty used (objective/kl_coef)
    mean_score: float        # the mean task score trained on (ppo/mean_scores)
    policy_loss: float       # (ppo/loss/policy)
    value_loss: float        # before vf_coef (ppo/loss/value)
    total_loss: float        # (ppo/loss/total)
    token_entropy: float     # (ppo/policy/entropy)
    approx_kl: float         # (ppo/policy/approxkl)
    clip_fraction: float     # (ppo/policy/clipfrac)
    mean_value: float        # (ppo/val/vpred)
    mean_return: float       # (ppo/returns/mean)
    # CleanRL's 1 − Var(returns − values) / Var(returns) on the rollout's values (``explained_variance``); trl's
    # step: its ppo/val/var_explained, the mean over mini-batches on each one's current values; NaN without a critic
    explained_variance: float = float("nan")
    # the share of the step's mini-batches whose update ratio_threshold zeroed (NaN from trl's step, which does not
    # say), and a critic-free learner's share of prompts whose K scores are all equal, where the group baseline
    # leaves no signal (trl's GRPOTrainer's frac_reward_zero_std; NaN with GAE)
    frac_minibatches_skipped: float = float("nan")
    frac_reward_zero_std: float = float("nan")
    seconds: dict = field(default_factory=dict)  # forward_pass, optimize_step, total (trl's time/ppo/*)

    TRL_KEYS = {"kl": "objective/kl", "sequence_entropy": "objective/entropy", "kl_coef": "objective/kl_coef",
                "mean_score": "ppo/mean_scores", "policy_loss": "ppo/loss/policy", "value_loss": "ppo/loss/value",
                "total_loss": "ppo/loss/total", "token_entropy": "ppo/policy/entropy",
                "approx_kl": "ppo/policy/approxkl", "clip_fraction": "ppo/policy/clipfrac",
                "mean_value": "ppo/val/vpred", "mean_return": "ppo/returns/mean"}

    @classmethod
    def from_trl(cls, stats: dict) -> "StepStats":
        """The statistics of trl's own ``PPOTrainer.step`` (``fast_ppo: false``)."""
        seconds = {k.removeprefix("time/ppo/"): float(v) for k, v in stats.items() if k.startswith("time/ppo/")}
        return cls(**{name: float(stats[key]) for name, key in cls.TRL_KEYS.items()},
                   explained_variance=float(stats["ppo/val/var_explained"]), seconds=seconds)

    def scalars(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seconds"}


class AgentTrainer(PPOTrainer):
    """trl's PPOTrainer with the PPO step of this module. ``args``: the run's config (``cory.config.PPOArgs``),
    the one place the step reads its settings from; trl's ``PPOConfig`` (``config``, built from ``args`` by
    ``ppo_config``) sets up trl's trainer (accelerator, seed) and nothing is read back from it.
    ``max_pass_tokens``: the most tokens one forward pass may hold (0 = no limit, "auto" = measured on the GPU at
    the first step); ``reserve_bytes``: memory the agents' gradients and Adam moments will take, kept out of an
    "auto" budget; ``pack``: padding-free passes where the model allows; ``reuse_rollout``: with one mini-batch per
    epoch, the rollout pass (same weights, same inputs) is also epoch 0's training pass, so that pass is not run
    twice."""

    def __init__(self, *trl_args, args: PPOArgs, max_pass_tokens: int | str = 0, reserve_bytes: float = 0.0,
                 pack: bool = True, reuse_rollout: bool = True, compute=None, **kwargs):
        super().__init__(*trl_args, **kwargs)
        self.args = args
        self.kl_ctl = kl_controller(args)
        self.max_pass_tokens, self.reserve_bytes = max_pass_tokens, reserve_bytes
        self.pack, self.reuse_rollout = pack, reuse_rollout
        # compute(cache): the precision region the passes run in (bf16: autocast); with ``cache`` each weight is
        # cast once per region. A region lasts while the weights stand still: the rollout pass, then each
        # mini-batch's passes and backward, closed before its optimizer step (a copy cast before it would be stale)
        self.compute = compute or (lambda cache: contextlib.nullcontext())

    @PPODecorators.empty_device_cache()
    def step(self, queries, responses, scores, response_masks=None) -> StepStats:
        if response_masks is not None or self.is_encoder_decoder or not self._windowable():
            if not has_critic(self.args):
                raise RunError(f"advantage_estimator: {self.args.advantage_estimator} needs cory.ppo's step, which "
                               "this model cannot take (no logits_to_keep, or encoder-decoder); trl's step has GAE only")
            with self.compute(False):
                return StepStats.from_trl(super().step(queries, responses, scores, response_masks))
        queries, responses, scores, _ = self._step_safety_checker(self.args.batch_size, queries, responses, scores)
        scores = torch.tensor(scores, device=self.current_device)
        if self.args.score_clip is not None:
            scores = torch.clip(scores.float(), -self.args.score_clip, self.args.score_clip).to(scores.dtype)
        if self.max_pass_tokens == "auto":
            self.max_pass_tokens = resolve_budget(self, queries, responses, self.reserve_bytes)
        seconds, t0 = {}, time.time()
        kl_coef = self.kl_ctl.value

        # 1. the rollout pass: log-probs, values, the reference's log-probs and the per-token KL
        reuse = self._reuses_rollout(queries, responses)
        with torch.set_grad_enabled(reuse), self.compute(True):
            rollout_pass = self._passes(queries, responses, keep_logits=reuse, reference=True)
        values = None if rollout_pass.values is None else rollout_pass.values.detach() * rollout_pass.masks
        batch = PPOBatch(queries, responses, scores, rollout_pass.logprobs.detach(), values, rollout_pass.masks,
                         rollout_pass.ref_logprobs, self._token_kl(rollout_pass))
        seconds["forward_pass"] = time.time() - t0

        # 2. rewards: the score at the last token, -η·KL at every token; 3. advantages: GAE over each response, then
        # whitened over the batch (the values masked to the response; trl's whiten_rewards, off by default, is not a
        # field here), or a critic-free estimator's (``advantages``: the learner switch)
        batch.rewards, batch.non_score_rewards, batch.advantages, batch.returns = advantages(
            self.args.advantage_estimator, scores, batch.values, batch.kl, batch.masks, kl_coef,
            self.args.num_generations, self.args.gamma, self.args.lam)

        # 4. ppo_epochs passes over the batch in shuffled mini-batches, one optimizer step each
        t = time.time()
        minibatches = []
        for epoch in range(self.args.ppo_epochs):
            order = np.random.permutation(len(queries))  # trl shuffles with numpy's global generator
            for start in range(0, len(queries), self.args.mini_batch_size):
                index = order[start:start + self.args.mini_batch_size]
                with self.accelerator.accumulate(self.model):
                    reused = rollout_pass.select(index) if reuse and epoch == 0 else None
                    minibatches.append(self.train_on(batch.minibatch(index), reused))
        seconds["optimize_step"] = time.time() - t

        # 5. the statistics, then η's update from this batch's KL (``KLController``: fixed, or adapted towards the
        # target KL)
        stats = self._statistics(batch, minibatches, kl_coef, seconds)
        if not has_critic(self.args):
            stats.frac_reward_zero_std = frac_reward_zero_std(scores, self.args.num_generations)
        if batch.values is not None:
            stats.explained_variance = explained_variance(batch.values, batch.returns, batch.masks)
        self.kl_ctl.update(stats.kl, self.args.batch_size * self.accelerator.num_processes)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        stats.seconds["total"] = time.time() - t0
        return stats

    def _windowable(self) -> bool:
        return accepts_logits_to_keep(self.model) and (self.ref_model is None or accepts_logits_to_keep(self.ref_model))

    def _reuses_rollout(self, queries, responses) -> bool:
        """The rollout pass doubles as epoch 0's training pass: one mini-batch per epoch, run in one pass, in one
        process (DDP synchronises gradients in the training passes only)."""
        return (self.reuse_rollout and self.args.mini_batch_size >= len(queries) and not self.is_distributed
                and len(self._plan(queries, responses)) == 1)

    def _plan(self, queries, responses) -> list[list[int]]:
        packed = packs(self.model, self.pack)
        return pass_plan([len(q) + len(r) for q, r in zip(queries, responses)], self.max_pass_tokens, packed,
                         shared_tokens(queries, packed))

    def _passes(self, queries, responses, keep_logits: bool, reference: bool = False, window: int | None = None,
                max_pass_tokens: int | None = None) -> WindowOutputs:
        """The policy's passes over these samples (``cory.passes.window_passes``); ``reference``: also the
        reference's log-probs and the full KL (with LoRA the reference is the policy with its adapters off)."""
        ref_model = (self.model if self.is_peft_model else self.ref_model) if reference else None
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return window_passes(self.model, queries, responses,
                             window=window or max(len(r) for r in responses),
                             max_pass_tokens=self.max_pass_tokens if max_pass_tokens is None else max_pass_tokens,
                             pack=self.pack, pad_id=pad, device=self.current_device, keep_logits=keep_logits,
                             reference=ref_model, reference_ctx=self.optional_peft_ctx)

    def _token_kl(self, rollout_pass: WindowOutputs) -> torch.Tensor:
        """The per-token KL the penalty uses: the full-vocabulary KL taken in the pass for ``kl_penalty: full``,
        else trl's estimate from the two log-probs (kl, abs, mse)."""
        if self.args.kl_penalty == "full":
            return rollout_pass.kl
        return kl_estimate(rollout_pass.logprobs.detach(), rollout_pass.ref_logprobs, self.args.kl_penalty)

    def train_on(self, mb: PPOBatch, reused: WindowOutputs | None = None) -> MinibatchStats:
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
                    policy_loss, value_loss = clipped_losses(mb, out.logprobs, out.values, self.args, idx)
                    loss = policy_loss + self.args.vf_coef * value_loss
                    self.accelerator.backward(loss * (mb.masks[idx].sum() / total))
                with torch.no_grad():
                    entropy = entropy_from_logits(out.logits.detach().float())
                for row, i in enumerate(idx):
                    outputs[i] = (out.logprobs[row].detach(), None if out.values is None else out.values[row].detach(),
                                  entropy[row])
        logprobs, vpreds, entropy = (None if outputs[0][k] is None else torch.stack([o[k] for o in outputs])
                                     for k in range(3))
        stats = minibatch_stats(mb, logprobs, vpreds, entropy, self.args)
        if stats.skipped:
            for p in self.model_params:  # trl zeroes such a mini-batch's loss (the optimizer still steps)
                if p.grad is not None:
                    p.grad.zero_()
        if self.args.max_grad_norm is not None and self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.model_params, self.args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return stats

    def _statistics(self, batch: PPOBatch, minibatches: list[MinibatchStats], kl_coef: float,
                    seconds: dict) -> StepStats:
        """The step's ``StepStats`` (trl's ``record_step_stats``), averaged over processes in data-parallel runs."""
        per_step = {f.name: float(np.mean([getattr(m, f.name) for m in minibatches]))
                    for f in fields(MinibatchStats) if f.name not in ("policy_kl", "skipped")}
        stats = StepStats(kl=(batch.kl * batch.masks).sum(-1).mean().item(),
                          sequence_entropy=(-batch.logprobs * batch.masks).sum(-1).mean().item(),
                          kl_coef=float(kl_coef), mean_score=batch.scores.float().mean().item(), **per_step,
                          frac_minibatches_skipped=float(np.mean([m.skipped for m in minibatches])),
                          seconds=seconds)
        if self.is_distributed:
            names = list(stats.scalars())
            means = self.accelerator.reduce(torch.tensor([getattr(stats, n) for n in names], dtype=torch.float64,
                                                         device=self.current_device), reduction="mean")
            for name, value in zip(names, means.tolist()):
                setattr(stats, name, value)
        return stats
