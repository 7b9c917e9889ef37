"""Did the baseline learn? The question every comparison asks first (issue 25): a comparison of two methods that
did not learn their task tests nothing, whatever its KL or reward tests say.

``LEARNING_RULE`` is printed in REPORT.md before the verdict. PPO learned when its reward rose above where it
started by more than the seeds' noise: on held-out prompts where the runs were evaluated (each seed's final model
against the base model), else on the training batches (each seed's mean over its last ``LAST_N`` iterations
against its first ``LAST_N``). One-sided t-test over seeds at α = 0.05.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lab.curves import curve, heldout_value
from lab.results import POLICY, LAST_N, Experiment, Group, fmt

ALPHA = 0.05

LEARNING_RULE = (
    "First, did the baseline learn? A comparison of methods that did not learn their task tests nothing. PPO learned "
    "when its reward rose above its start by more than the seeds' noise: a one-sided t-test over seeds "
    f"(α = {ALPHA:g}) of each seed's gain, on **held-out prompts** where the runs were evaluated (the final model's "
    "held-out reward minus the base model's, same prompts and sampling; the base model's own sampling error, from "
    "its one evaluation, is added to the seeds' standard error), else on the **training batches** (the "
    f"mean task reward over the last {LAST_N} iterations minus the mean over the first {LAST_N}). When it did not, the "
    "verdict reads _not tested (PPO did not learn)_ and no KL or reward test below is a finding.")


@dataclass
class Learning:
    learned: bool | None  # None: cannot be told (fewer than 2 seeds, or no reward to read)
    source: str           # "held-out" | "training" | ""
    gains: np.ndarray     # per seed
    start: float          # the base model's held-out reward, or the seeds' mean over the first window
    end: float            # the seeds' mean final held-out reward, or over the last window
    p: float
    needed: float         # the smallest mean gain this spread and these seeds would show (p = α)
    text: str


def base_error(result: dict) -> float:
    """The sampling error of the base model's one held-out mean: reward_sd / sqrt(prompts) for a reward, the
    binomial error of an accuracy over questions x samples (clustering by question ignored); 0 when unknown."""
    sd, n = result.get("reward_sd"), result.get("n_prompts")
    if isinstance(sd, (int, float)) and isinstance(n, int) and n > 0:
        return float(sd) / math.sqrt(n)
    p, questions, samples = result.get("accuracy"), result.get("n_questions"), result.get("n_samples")
    if isinstance(p, (int, float)) and isinstance(questions, int) and isinstance(samples, int) and questions * samples:
        return math.sqrt(max(p * (1 - p), 0.0) / (questions * samples))
    return 0.0


def _gains(exp: Experiment, group: Group, agent: str) -> tuple[str, np.ndarray, float, float, float]:
    """(source, per-seed gains, start, end, the start's own sampling error)."""
    base_result = exp.base_evaluation()
    base = heldout_value(base_result)
    finals = {s: heldout_value(run.final_evaluation(agent)) for s, run in sorted(group.runs.items())}
    finals = {s: v for s, v in finals.items() if v is not None}
    if base is not None and finals:
        values = np.array(list(finals.values()))
        return "held-out", values - base, base, float(values.mean()), base_error(base_result)
    c = curve(group, agent, "task_reward")
    if c is None or len(c.steps) < 2:
        return "", np.array([]), float("nan"), float("nan"), 0.0
    k = min(LAST_N, len(c.steps) // 2)
    first, last = c.values[:, :k].mean(axis=1), c.values[:, -k:].mean(axis=1)
    # each seed's gain is its own last window minus its own first, so the seeds' spread holds all the noise
    return (f"training reward, iterations {c.steps[0]}–{c.steps[k - 1]} against {c.steps[-k]}–{c.steps[-1]}",
            last - first, float(first.mean()), float(last.mean()), 0.0)


def baseline_learned(exp: Experiment, group: Group, agent: str = POLICY) -> Learning:
    """Whether ``group`` (PPO) learned its task, by ``LEARNING_RULE``."""
    source, gains, start, end, start_error = _gains(exp, group, agent)
    what = ("held-out reward of the final models against the base model's" if source == "held-out" else source)
    return judge_gains(group.name(agent), source, what, gains, start, end, start_error)


def judge_gains(name: str, source: str, what: str, gains: np.ndarray, start: float, end: float,
                start_error: float) -> Learning:
    """The one-sided t-test of ``LEARNING_RULE`` over per-seed ``gains`` (``what`` names what they are)."""
    from scipy.special import stdtr, stdtrit

    if not len(gains):
        return Learning(None, "", gains, start, end, float("nan"), float("nan"),
                        f"Whether {name} learned cannot be told: no held-out evaluation and too few iterations.")
    mean = float(gains.mean())
    numbers = (f"{name}'s {what}: {fmt(start)} → {fmt(end)}, a gain of {fmt(mean)}"
               + (f" ± {fmt(float(gains.std(ddof=1)))} (std over {len(gains)} seeds)" if len(gains) > 1 else
                  " (1 seed)"))
    if len(gains) < 2:
        return Learning(None, source, gains, start, end, float("nan"), float("nan"),
                        f"Whether the baseline learned cannot be told from one seed: {numbers}.")
    n = len(gains)
    # the seeds' spread holds each final model's sampling noise; the base model was evaluated once, so its own
    # sampling error adds to the error of every gain
    se = math.hypot(float(gains.std(ddof=1)) / math.sqrt(n), start_error)
    if se == 0:
        p = 0.0 if mean > 0 else 1.0
        needed = 0.0
    else:
        p = float(stdtr(n - 1, -mean / se))
        needed = float(stdtrit(n - 1, 1 - ALPHA)) * se
    learned = p < ALPHA
    if learned:
        text = f"**PPO learned** — {numbers}; one-sided p {p:.2g}."
    else:
        text = (f"**PPO did not learn** — {numbers}; one-sided p {p:.2g}. A gain above this noise needed a mean "
                f"gain of at least {fmt(needed)}: PPO missed it by {fmt(needed - mean)}.")
    return Learning(learned, source, gains, start, end, p, needed, text)
