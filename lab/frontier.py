"""The η sweep's frontier (paper Fig. 2c), read as the claim is: at matched KL.

Per method, agent and seed, the final models of the η values both methods ran form a frontier: their (KL, reward)
points sorted by KL. Both come from the held-out evaluations of the final models where every run of the sweep has
one, else from the training window's final values. At each of PPO's own frontier points that lies inside the
agent's KL range, the agent's reward (interpolated along its frontier) minus PPO's; a seed's endpoint is their
mean. Tested as the claim at matched KL (``lab.matched_kl.judge``): one-sided t-tests over seeds, Holm over
the agents, the design's margin.
"""
from __future__ import annotations

import numpy as np

from lab.design import load_design
from lab.matched_kl import AgentReading, HeldoutPath, MatchedKL, SeedReading, judge, reward_at
from lab.curves import final_value, heldout_value
from lab.results import POLICY, Experiment, Group, finite

RULE = (
    "**The η frontier at matched KL** (paper Fig. 2c). Per method, agent and seed, the final models of the η values "
    "both methods ran form a frontier, their (KL, reward) points sorted by KL: from the held-out evaluations of the "
    "final models where every run of the sweep has one, else from the training window's final values. At each of "
    "PPO's frontier points inside the agent's KL range, the agent's reward interpolated along its own frontier minus "
    "PPO's; a seed's endpoint is their mean; tested as the claim at matched KL (one-sided t-tests over seeds, Holm "
    "over the agents, the design's margin). Needs at least two η values both methods ran.")


def sweep_groups(exp: Experiment, method: str) -> dict[float, Group]:
    """η -> the group of ``method`` that started from it (a folder whose runs started elsewhere is left out)."""
    return {g.kl_coef: g for g in exp.groups.values()
            if g.method == method and g.kl_coef is not None and not g.eta_mismatch and g.runs}


def _point(group: Group, seed: int, agent: str, heldout: bool) -> tuple[float, float] | None:
    if heldout:
        result = group.runs[seed].final_evaluation(agent) or {}
        kl, reward = finite(result.get("kl")), heldout_value(result)
    else:
        r, k = final_value(group, agent, "task_reward"), final_value(group, agent, "kl")
        if r is None or k is None or seed not in r.seeds or seed not in k.seeds:
            return None
        reward, kl = float(r.per_seed[r.seeds.index(seed)]), float(k.per_seed[k.seeds.index(seed)])
    return None if kl is None or reward is None else (kl, reward)


def frontier_path(groups: dict[float, Group], seed: int, agent: str, heldout: bool) -> HeldoutPath | None:
    points = sorted(p for g in groups.values() if seed in g.runs for p in [_point(g, seed, agent, heldout)] if p)
    if len(points) < 2:
        return None
    kl, reward = np.array(points).T
    return HeldoutPath(np.arange(len(points)), kl, reward)


def frontier(exp: Experiment) -> MatchedKL | None:
    """None without two η values both methods ran."""
    ppo, cory = sweep_groups(exp, "ppo"), sweep_groups(exp, "cory")
    etas = sorted(set(ppo) & set(cory))
    if len(etas) < 2:
        return None
    ppo, cory = {e: ppo[e] for e in etas}, {e: cory[e] for e in etas}
    design = load_design(exp.path)
    agents = next(iter(cory.values())).agents
    everyone = [(g, a) for g in ppo.values() for a in [POLICY]] + [(g, a) for g in cory.values() for a in agents]
    heldout = all(run.final_evaluation(a) is not None for g, a in everyone for run in g.runs.values())
    readings = []
    for agent in agents:
        reading = AgentReading(next(iter(cory.values())).name(agent, eta=False), [], [], design)
        seeds = sorted(set.intersection(*(set(g.runs) for g in (*ppo.values(), *cory.values()))))
        for seed in seeds:
            mine, base = frontier_path(cory, seed, agent, heldout), frontier_path(ppo, seed, POLICY, heldout)
            points = {}
            if mine is not None and base is not None:
                for k, r in zip(base.kl, base.reward):
                    other = reward_at(mine, float(k))
                    if other is not None:
                        points[float(k)] = other - float(r)
            (reading.readings.append(SeedReading(seed, points)) if points else reading.left_out.append(seed))
        reading.test()
        readings.append(reading)
    answer, summary = judge(readings, design, "at the same KL along the η frontier")
    source = "held-out evaluations of the final models" if heldout else "training-window final values"
    text = (f"**{answer}** — {summary} η = {', '.join(f'{e:g}' for e in etas)}; points from the {source}. "
            f"Design: {design.text()}.\n\n" + "\n".join(r.line().replace(" at matched held-out KL", " along the frontier")
                                                       for r in readings))
    return MatchedKL(answer, text, readings, design)
