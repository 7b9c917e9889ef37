"""The paper's game, one iteration at a time (Ma et al., NeurIPS 2024, "Coevolving with the Other You").

CORY copies the pretrained model into two agents, LLM1 and LLM2. In each iteration

1. the pioneer answers the query;
2. the observer answers the query after reading the pioneer's answer (knowledge transfer);
3. both answers are scored by the task reward, each on the query and its own answer;
4. each agent takes a PPO step on the collective reward r1 + r2 (trl adds each agent's own KL penalty
   to the frozen original model);
5. every ``swap_period`` iterations the agents exchange roles.

Single-agent PPO, the paper's baseline, is the same iteration with one agent and no partner. The pure
rules come first (with table tests in tests/test_rules.py), then the two iterations.
"""
from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np

from cory import parallel
from cory.errors import NonFinite
from cory.method import CORY, PPO
from cory.metrics import degeneration


# ----------------------------------------------------------------------------- the rules

def pioneer_name(step: int, swap_period: int) -> str:
    """Who plays pioneer at iteration ``step`` (0-based): LLM1 first, roles flip every ``swap_period``."""
    if swap_period <= 0:
        return CORY.agents[0]
    return CORY.agents[(step // swap_period) % 2]


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


# ----------------------------------------------------------------------------- bookkeeping

def rewards_are_finite(step: int, agent: str, rewards: list[float], on_nonfinite: str) -> bool:
    """True to go on, False to skip the batch (``on_nonfinite: skip``); raises NonFinite (``stop``). Every
    process decides alike."""
    bad = [i for i, r in enumerate(rewards) if not np.isfinite(r)]
    if not parallel.any_process(bool(bad)):
        return True
    where = f"text {bad[0]}" if bad else "in another process"
    if on_nonfinite == "skip":
        warnings.warn(f"step {step}: non-finite reward for {agent} ({where}); batch skipped")
        return False
    raise NonFinite(step, agent, "reward", where)


def check_loss(step: int, agent: str, stats: dict) -> None:
    if not np.isfinite(float(stats["ppo/loss/total"])):
        raise NonFinite(step, agent, "PPO loss")


class Timer:
    """``with timer("reward"): ...`` records the block's wall time as ``time/reward_s``."""

    def __init__(self):
        self.seconds = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[f"time/{name}_s"] = time.perf_counter() - t0


def agent_metrics(prefix: str, task_rewards, train_rewards, stats: dict, answers, kl_coef: float) -> dict:
    """One agent's row of metrics.jsonl; ``kl`` is trl's full-vocabulary KL summed over the response; distinct-n
    and the share of answers repeating a token 4+ times in a row show a policy collapsing (``cory.metrics``)."""
    task_reward = float(np.mean(task_rewards))
    kl = float(stats["objective/kl"])
    degenerate = {f"{prefix}/{name}": value for name, value in degeneration(answers.texts, answers.ids).items()}
    return {
        f"{prefix}/task_reward": task_reward,
        f"{prefix}/collective_reward": float(np.mean(train_rewards)),
        f"{prefix}/kl": kl,
        f"{prefix}/kl_coef": kl_coef,
        f"{prefix}/combined_reward": combined_reward(task_reward, kl, kl_coef),
        f"{prefix}/response_length": float(np.mean([len(r) for r in answers.ids])),
        **degenerate,
        f"{prefix}/entropy": float(stats["objective/entropy"]),
        f"{prefix}/policy_loss": float(stats["ppo/loss/policy"]),
        f"{prefix}/value_loss": float(stats["ppo/loss/value"]),
    }


# ----------------------------------------------------------------------------- the iterations
# Each takes the iteration's batch of examples and returns (metrics row, sample rows), or (None, []) for a
# batch skipped because of a non-finite reward.

def ppo_iteration(step: int, batch, agents: dict, rollout, cfg) -> tuple[dict | None, list[dict]]:
    """Single-agent PPO: answer, score, one PPO step on the task reward."""
    (name,), timer = PPO.agents, Timer()
    policy = agents[name]
    with timer("generate"):
        queries = rollout.prompts(batch)
        answers = rollout.answer(policy, queries)
    with timer("reward"):
        rewards = rollout.score(batch, answers.texts)
    if not rewards_are_finite(step, name, rewards, cfg.on_nonfinite):
        return None, []
    kl_coef = policy.kl_coef  # the coefficient this step's penalty uses
    with timer("step"):
        stats = policy.step(queries, answers.ids, rewards)
    check_loss(step, name, stats)

    row = agent_metrics(name, rewards, rewards, stats, answers, kl_coef)
    row.pop(f"{name}/collective_reward")
    row.update(timer.seconds)
    samples = [{"step": step, "query": ex.query, "response": text, "reward": r}
               for ex, text, r in list(zip(batch, answers.texts, rewards))[: cfg.samples_per_step]]
    return row, samples


def cory_iteration(step: int, batch, agents: dict, rollout, cfg) -> tuple[dict | None, list[dict]]:
    """CORY: the pioneer answers, the observer answers knowing the pioneer's answer, both learn from r1 + r2."""
    timer = Timer()
    with timer("swap"):
        if cfg.reset_on_swap and is_swap_step(step, cfg.swap_period):
            for agent in agents.values():  # the authors' exchange reloads both trainers
                agent.reset_optimizer_state()
    pioneer_is = pioneer_name(step, cfg.swap_period)
    observer_is = next(a for a in CORY.agents if a != pioneer_is)
    pioneer, observer = agents[pioneer_is], agents[observer_is]

    # 1. the pioneer answers the query
    with timer("pioneer_generate"):
        pioneer_prompts = rollout.prompts(batch)
        a1 = rollout.answer(pioneer, pioneer_prompts)

    # 2. the observer answers the query knowing the pioneer's answer (without knowledge transfer: the query)
    with timer("observer_generate"):
        transfer = ([rollout.task.observer_prompt(ex, text) for ex, text in zip(batch, a1.texts)]
                    if cfg.knowledge_transfer else None)
        observer_prompts = rollout.prompts(batch, transfer)
        a2 = rollout.answer(observer, observer_prompts)

    # 3. each answer is scored on the query and that answer alone (one reward call for both)
    with timer("reward"):
        both = rollout.score(list(batch) + list(batch), a1.texts + a2.texts)
        r1, r2 = both[: len(batch)], both[len(batch):]
    if not (rewards_are_finite(step, pioneer_is, r1, cfg.on_nonfinite)
            and rewards_are_finite(step, observer_is, r2, cfg.on_nonfinite)):
        return None, []

    # 4. both learn from the collective reward (with coef 1: r1 + r2), each with its own KL penalty
    pioneer_reward = collective_rewards(r1, r2, cfg.other_reward_coef)
    observer_reward = collective_rewards(r2, r1, cfg.other_reward_coef)
    kl_coefs = {pioneer_is: pioneer.kl_coef, observer_is: observer.kl_coef}
    with timer("pioneer_step"):
        pioneer_stats = pioneer.step(pioneer_prompts, a1.ids, pioneer_reward)
    check_loss(step, pioneer_is, pioneer_stats)
    with timer("observer_step"):
        observer_stats = observer.step(observer_prompts, a2.ids, observer_reward)
    check_loss(step, observer_is, observer_stats)
    # 5. the exchange is only a change of who plays pioneer: pioneer_name() at the next iterations

    row = {"pioneer": pioneer_is}
    row.update(agent_metrics(pioneer_is, r1, pioneer_reward, pioneer_stats, a1, kl_coefs[pioneer_is]))
    row.update(agent_metrics(observer_is, r2, observer_reward, observer_stats, a2, kl_coefs[observer_is]))
    row.update(timer.seconds)
    samples = [{"step": step, "pioneer": pioneer_is, "query": batch[i].query,
                "pioneer_response": a1.texts[i], "pioneer_reward": r1[i],
                "observer_prompt": transfer[i] if transfer else batch[i].prompt,
                "observer_response": a2.texts[i], "observer_reward": r2[i]}
               for i in range(min(cfg.samples_per_step, len(batch)))]
    return row, samples
