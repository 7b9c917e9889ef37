"""The paper's game, one iteration at a time (Ma et al., NeurIPS 2024, "Coevolving with the Other You").

CORY copies the pretrained model into two agents, LLM1 and LLM2. In each iteration

1. the pioneer answers the query;
2. the observer answers the query after reading the pioneer's answer (knowledge transfer);
3. both answers are scored by the task reward, each on the query and its own answer;
4. each agent takes a PPO step on the collective reward r1 + r2, less its own KL penalty to the frozen original
   model (``cory.ppo.per_token_rewards``);
5. every ``swap_period`` iterations the agents exchange roles.

**K answers per prompt** (``num_generations``, for the critic-free learners' group baselines): the batch counts
answers, ``answers_per_prompt`` puts each of batch_size / K prompts K times side by side, and the game runs on that
batch as on any other: each pioneer answer gets ONE observer answer, the pair's collective reward is r1_k + r2_k,
and each agent's baseline is taken over its own K answers to the query (why this form: docs/learners.md).

Single-agent PPO, the paper's baseline, is the same iteration with one agent and no partner. The pure
rules come first (with table tests in tests/test_rules.py), then the two iterations; the run loop
(``cory.train``) plays ``ITERATIONS[method]`` once per batch.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from cory import parallel
from cory.config import has_critic
from cory.errors import NonFinite
from cory.method import CORY, PPO
from cory.metrics import degeneration, knowledge_transfer
from cory.tasks.base import right_or_wrong

if TYPE_CHECKING:
    from cory.agent import Agent
    from cory.config import CoryArgs, PPOArgs
    from cory.ppo import StepStats
    from cory.rollout import Answers, Rollout
    from cory.tasks.base import Example


# ----------------------------------------------------------------------------- the rules

class Roles(NamedTuple):
    pioneer: str   # the agent that answers the query first
    observer: str  # the agent that answers after reading the pioneer's answer


def swap_roles(roles: Roles) -> Roles:
    return Roles(pioneer=roles.observer, observer=roles.pioneer)


def roles_at(step: int, swap_period: int) -> Roles:
    """The roles at iteration ``step`` (0-based): LLM1 pioneers first, and the agents swap roles every
    ``swap_period`` iterations (0: never, the ablation)."""
    roles = Roles(*CORY.agents)
    if swap_period > 0 and (step // swap_period) % 2 == 1:
        roles = swap_roles(roles)
    return roles


def is_swap_step(step: int, swap_period: int) -> bool:
    """True when iteration ``step`` starts with freshly exchanged roles."""
    return swap_period > 0 and step > 0 and step % swap_period == 0


def answers_per_prompt(prompts: list[Example], k: int) -> list[Example]:
    """The batch of ``k`` answers per prompt: each prompt ``k`` times, side by side (prompt g's answers are rows
    g·k … g·k + k − 1, where the critic-free learners take their baselines)."""
    return [example for example in prompts for _ in range(k)]


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


def check_loss(step: int, agent: str, stats: StepStats) -> None:
    if not np.isfinite(stats.total_loss):
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


def agent_metrics(prefix: str, task_rewards: list[float], train_rewards: list[float], stats: StepStats,
                  answers: Answers, kl_coef: float, critic: bool = True) -> dict:
    """One agent's row of metrics.jsonl; ``kl`` is the full-vocabulary KL summed over the response; ``entropy`` the
    answers' sampled entropy (``StepStats.sequence_entropy``); distinct-n and the share of answers repeating a
    token 4+ times in a row show a policy collapsing (``cory.metrics``). With a ``critic`` (``gae``) its value loss
    and explained variance (does the value head learn anything?); a critic-free learner has neither."""
    task_reward = float(np.mean(task_rewards))
    kl = stats.kl
    degenerate = {f"{prefix}/{name}": value for name, value in degeneration(answers.texts, answers.ids).items()}
    return {
        f"{prefix}/task_reward": task_reward,
        f"{prefix}/collective_reward": float(np.mean(train_rewards)),
        f"{prefix}/kl": kl,
        f"{prefix}/kl_coef": kl_coef,
        f"{prefix}/combined_reward": combined_reward(task_reward, kl, kl_coef),
        f"{prefix}/response_length": float(np.mean([len(r) for r in answers.ids])),
        **degenerate,
        f"{prefix}/entropy": stats.sequence_entropy,
        f"{prefix}/policy_loss": stats.policy_loss,
        # CleanRL's names: how far each update moved the policy, and the share of tokens whose ratio was clipped
        f"{prefix}/approx_kl": stats.approx_kl,
        f"{prefix}/clip_fraction": stats.clip_fraction,
        f"{prefix}/frac_minibatches_skipped": stats.frac_minibatches_skipped,
        **({f"{prefix}/value_loss": stats.value_loss, f"{prefix}/explained_variance": stats.explained_variance}
           if critic else {f"{prefix}/frac_reward_zero_std": stats.frac_reward_zero_std}),
    }


# ----------------------------------------------------------------------------- the iterations
# Each takes the iteration's batch of examples and returns (metrics row, sample rows), or (None, []) for a
# batch skipped because of a non-finite reward.
IterationResult = tuple[dict | None, list[dict]]


def ppo_iteration(step: int, batch: list[Example], agents: dict[str, Agent], rollout: Rollout,
                  cfg: PPOArgs) -> IterationResult:
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

    row = agent_metrics(name, rewards, rewards, stats, answers, kl_coef, has_critic(cfg))
    row.pop(f"{name}/collective_reward")
    row.update(timer.seconds)
    samples = [{"step": step, "query": ex.query, "response": text, "reward": r}
               for ex, text, r in list(zip(batch, answers.texts, rewards))[: cfg.samples_per_step]]
    return row, samples


def cory_iteration(step: int, batch: list[Example], agents: dict[str, Agent], rollout: Rollout,
                   cfg: CoryArgs) -> IterationResult:
    """CORY: the pioneer answers, the observer answers knowing the pioneer's answer, both learn from r1 + r2."""
    timer = Timer()
    # 5. every swap_period iterations the agents swap roles: taken here, at the start of the iteration it is due
    # for, as a function of the iteration number (so a resumed run plays the roles it would have played)
    roles = roles_at(step, cfg.swap_period)
    with timer("swap"):
        if cfg.reset_on_swap and is_swap_step(step, cfg.swap_period):
            for agent in agents.values():  # the authors' exchange reloads both trainers
                agent.reset_optimizer_state()
    pioneer, observer = agents[roles.pioneer], agents[roles.observer]

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
    if not (rewards_are_finite(step, roles.pioneer, r1, cfg.on_nonfinite)
            and rewards_are_finite(step, roles.observer, r2, cfg.on_nonfinite)):
        return None, []

    # 4. both learn from the collective reward (with coef 1: r1 + r2, per pioneer-observer pair), each with its own KL
    # penalty (with K answers per prompt, each agent's baseline over its own K answers to the query: its step)
    pioneer_reward = collective_rewards(r1, r2, cfg.other_reward_coef)
    observer_reward = collective_rewards(r2, r1, cfg.other_reward_coef)
    kl_coefs = {roles.pioneer: pioneer.kl_coef, roles.observer: observer.kl_coef}  # the η this step's penalties use
    with timer("pioneer_step"):
        pioneer_stats = pioneer.step(pioneer_prompts, a1.ids, pioneer_reward)
    check_loss(step, roles.pioneer, pioneer_stats)
    with timer("observer_step"):
        observer_stats = observer.step(observer_prompts, a2.ids, observer_reward)
    check_loss(step, roles.observer, observer_stats)

    row = {"pioneer": roles.pioneer}
    # did the observer use the pioneer's answer? (its reward minus the pioneer's; copy and correction rates)
    row.update(knowledge_transfer(r1, r2, right_or_wrong(rollout.task, r1, r2)))
    critic = has_critic(cfg)
    row.update(agent_metrics(roles.pioneer, r1, pioneer_reward, pioneer_stats, a1, kl_coefs[roles.pioneer], critic))
    row.update(agent_metrics(roles.observer, r2, observer_reward, observer_stats, a2, kl_coefs[roles.observer],
                             critic))
    row.update(timer.seconds)
    samples = [{"step": step, "pioneer": roles.pioneer, "query": batch[i].query,
                "pioneer_response": a1.texts[i], "pioneer_reward": r1[i],
                "observer_prompt": transfer[i] if transfer else batch[i].prompt,
                "observer_response": a2.texts[i], "observer_reward": r2[i]}
               for i in range(min(cfg.samples_per_step, len(batch)))]
    return row, samples


Iteration = Callable[[int, "list[Example]", "dict[str, Agent]", "Rollout", "PPOArgs"], IterationResult]
ITERATIONS: dict[str, Iteration] = {PPO.name: ppo_iteration, CORY.name: cory_iteration}  # by ``Method.name``
