"""The paper's claim read as a trade-off: each CORY agent's held-out reward against PPO's at the same held-out KL.

At matched iterations a method that learns slower always shows "lower KL at lower reward"; the paper's claim is
that CORY reaches similar reward at lower KL (its reward-vs-KL curve lies above PPO's), so it is read at matched
KL, as reward-vs-KL curves along training are read in the reward-overoptimisation literature (Gao et al. 2022).

Each run's held-out evaluations (``eval.jsonl``: the base model at iteration 0, then every ``eval_every``) form a
path of (held-out KL, held-out reward) points in iteration order. A path's reward at KL k is the linear
interpolation between the first two consecutive points whose KL brackets k (the first time the run reaches k).
Per seed and CORY agent, the endpoint is the agent's reward minus PPO's at the grid's KL values, averaged over the
grid points both paths reached. The design (grid, margin, level) is read from ``design.yaml`` in the experiment
folder, written before its runs; a folder without one gets ``lab.design.Design()`` and the verdict says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lab.design import Design, load_design
from lab.learning import Learning, base_error, baseline_learned, judge_gains
from lab.curves import heldout_value
from lab.results import METHOD_NAMES, POLICY, Experiment, Group, fmt
from lab.stats import Diff, holm, min_detectable, p_two_sided, p_value


SECONDARY_KL = (8.0, 12.0)  # also read (shown, not tested) where both paths reached them

# The six answers; a folder's verdict is one of them.
YES, NO, COULD_NOT_TELL = "yes", "no", "could not tell"
PPO_DID_NOT_LEARN, CORY_DID_NOT_LEARN = "not tested (PPO did not learn)", "not tested (CORY did not learn)"
NOT_DECIDED = "not decided"


# ----------------------------------------------------------------------------- paths

@dataclass
class HeldoutPath:
    """One run's (one agent's) held-out path, in iteration order: its held-out KL and one held-out series (``key``:
    the task reward, or any other value eval.jsonl records, such as distinct-2, read at matched KL the same way)."""
    iterations: np.ndarray
    kl: np.ndarray
    values: np.ndarray
    key: str = "task_reward"

    @property
    def reward(self) -> np.ndarray:
        return self.values


def heldout_path(group: Group, seed: int, agent: str, key: str = "task_reward") -> HeldoutPath | None:
    """The run's held-out (KL, ``key``) points at the iterations that recorded both; None with fewer than two."""
    run = group.runs[seed]
    kl, values = run.heldout_series(agent, "kl"), run.heldout_series(agent, key)
    its = sorted(set(kl) & set(values))
    if len(its) < 2:
        return None
    return HeldoutPath(np.array(its), np.array([kl[i] for i in its]), np.array([values[i] for i in its]), key)


def value_at(path: HeldoutPath, k: float) -> float | None:
    """The path's value where its KL first reaches ``k`` (linear between the two points that bracket it), None if it
    never does."""
    for i in range(len(path.kl) - 1):
        a, b = path.kl[i], path.kl[i + 1]
        if a == k:
            return float(path.values[i])
        if min(a, b) < k <= max(a, b):
            t = (k - a) / (b - a)
            return float(path.values[i] + t * (path.values[i + 1] - path.values[i]))
    if len(path.kl) and path.kl[-1] == k:
        return float(path.values[-1])
    return None


def reward_at(path: HeldoutPath, k: float) -> float | None:
    """The path's reward where its KL first reaches ``k`` (``value_at`` on a task-reward path)."""
    return value_at(path, k)


@dataclass
class SeedReading:
    seed: int
    points: dict[float, float]  # grid KL -> agent's reward minus PPO's, where both reached it

    @property
    def value(self) -> float:
        return float(np.mean(list(self.points.values())))


def seed_reading(seed: int, mine: HeldoutPath, ppo: HeldoutPath, grid: tuple[float, ...]) -> SeedReading:
    points = {}
    for k in grid:
        a, b = reward_at(mine, k), reward_at(ppo, k)
        if a is not None and b is not None:
            points[k] = a - b
    return SeedReading(seed, points)


# ----------------------------------------------------------------------------- one agent against PPO

def paired_diff(values) -> Diff:
    """The one-sample t of per-seed paired differences: mean, SE, df, n (SE and df NaN below 2 seeds)."""
    d = np.asarray(values, dtype=float)
    n = len(d)
    if n < 2:
        return Diff(True, float(d.mean()) if n else float("nan"), float("nan"), float("nan"), n)
    return Diff(True, float(d.mean()), float(d.std(ddof=1) / math.sqrt(n)), float(n - 1), n)


@dataclass
class AgentReading:
    name: str
    readings: list[SeedReading]
    left_out: list[int]          # seeds with no grid point both paths reached, or no path
    design: Design
    learned: bool | None = None
    learning: Learning | None = None  # the numbers behind ``learned``
    by_point: dict[float, list[float]] = field(default_factory=dict)  # every KL read (grid and SECONDARY_KL)
    p_higher: float = float("nan")
    p_below_margin: float = float("nan")
    p_lower: float = float("nan")
    answer: str = NOT_DECIDED

    @property
    def values(self) -> np.ndarray:
        return np.array([r.value for r in self.readings if r.points], dtype=float)

    @property
    def diff(self) -> Diff:
        return paired_diff(self.values)

    @property
    def judged(self) -> bool:
        tested = self.learned is not False or self.design.agents_tested == "all"
        return len(self.values) >= self.design.min_seeds and tested

    def test(self) -> None:
        d = self.diff
        self.p_higher = p_value(d, "greater")
        self.p_below_margin = p_value(d, "less", self.design.margin)
        self.p_lower = p_value(d, "less")

    def _gain(self) -> str:
        g = self.learning
        if g is None or len(g.gains) < 2:
            return ""
        return (f" (its held-out reward against the base model's, read as PPO's is: {fmt(g.start)} → {fmt(g.end)}, a "
                f"gain of {fmt(float(g.gains.mean()))} ± {fmt(float(g.gains.std(ddof=1)))} (std over {len(g.gains)} "
                f"seeds); one-sided p {g.p:.2g})")

    def line(self) -> str:
        d = self.diff
        per_seed = ", ".join(f"seed {r.seed} {'+' if r.value >= 0 else ''}{fmt(r.value)} "
                             f"(at {', '.join(f'{k:g}' for k in r.points)})" for r in self.readings if r.points)
        out = (f"- {self.name} − PPO at matched held-out KL: {fmt(d.mean)} ± {fmt(d.se)} (SE, {d.n} paired seeds); "
               f"per seed: {per_seed or 'none'}.")
        points = [f"{k:g}: {'+' if np.mean(v) >= 0 else ''}{fmt(float(np.mean(v)))} ({len(v)})"
                  for k, v in sorted(self.by_point.items()) if v]
        if points:
            out += f" By KL point (nats: mean difference (seeds)): {'; '.join(points)}."
        if self.left_out:
            out += f" Left out (no grid point both paths reached): seeds {', '.join(map(str, self.left_out))}."
        enough = len(self.values) >= self.design.min_seeds
        if self.learned is True:  # said as plainly as "did not learn": a reader asks it of every agent
            out += f" {self.name} learned{self._gain()}."
        if self.learned is False and enough and self.design.agents_tested == "all":
            out += f" {self.name} did not learn{self._gain()}; tested all the same (the design tests every agent)."
        elif self.learned is False and enough:
            return out + f" {self.name} did not learn: not tested{self._gain()}."
        if not self.judged:  # below min_seeds a gain not yet beyond noise is not "did not learn" (as the folder's)
            return out + (f" Not judged: {d.n} seed(s), the design needs {self.design.min_seeds}"
                          + ("; not yet shown to learn." if self.learned is False else "."))
        mdd = min_detectable(d, self.design.alpha / 2)
        return (out + f" One-sided p (higher) {fmt(self.p_higher)}, p (below PPO + {self.design.margin:g}) "
                f"{fmt(self.p_below_margin)}: **{self.answer}**; the smallest advantage these seeds would show at "
                f"80% power (α/2): {fmt(mdd)}.")


@dataclass
class MatchedKL:
    answer: str
    text: str
    agents: list[AgentReading] = field(default_factory=list)
    design: Design = field(default_factory=Design)


RULE = (
    "**The claim at matched KL** (primary; `lab.matched_kl`). The paper claims similar reward at lower KL: "
    "CORY's reward-vs-KL curve above PPO's. Each run's held-out evaluations (every `eval_every` iterations, the base "
    "model at iteration 0) form a path of (held-out KL, held-out reward); a path's reward at KL k is interpolated "
    "linearly where the run first reaches k. Per seed and CORY agent, the endpoint is the agent's reward minus PPO's "
    "(same seed) at the design's KL grid, averaged over the grid points both paths reached; a seed with none is "
    "left out and named. One-sample t-tests over seeds, one-sided, Holm over the two agents at the design's α. Per "
    "agent: _yes_ — shown higher than PPO's; _no_ — not shown higher and shown below PPO's + the margin (shown "
    "lower, or not higher by an amount that matters); _could not tell_ — neither. The folder: _yes_ if an agent's "
    "is yes and none is shown lower; _no_ if every agent's is no; else _could not tell_. Before any of it: _not "
    "tested (PPO did not learn)_ when PPO's final held-out reward (with the design's `learned_at: kl_grid`: its path's "
    "reward at the largest grid KL it reached, else at its last evaluation) is not above the base model's beyond "
    "noise, _not tested (CORY did not learn)_ when neither agent's is.")


def base_reward(exp: Experiment, design: Design) -> tuple[float | None, float, str]:
    """(the base model's held-out reward, its sampling error, in words where it is more than one draw): one draw
    (the runner's evaluation), or with the design's ``base_draws`` > 1 the mean of the draws found, its error the
    draws' mean error over the square root of their number."""
    draws = exp.base_draws() if design.base_draws > 1 else exp.base_draws()[:1]
    values = [v for v in map(heldout_value, draws) if v is not None]
    if not values:
        return None, 0.0, ""
    error = float(np.mean([base_error(r) for r in draws])) / math.sqrt(len(values))
    said = ("" if design.base_draws == 1 else f" (the base model's: the mean of {len(values)} sampled draws "
            f"{', '.join(fmt(v) for v in values)}" + ("" if len(values) >= design.base_draws else
                                                      f"; the design asks for {design.base_draws}") + ")")
    return float(np.mean(values)), error, said


def learned_along_path(exp: Experiment, group: Group, agent: str, design: Design) -> Learning:
    """Did ``group``'s ``agent`` learn within what the matched-KL reading compares: per seed, its held-out path's
    reward at the largest grid KL the path reached (else at its last evaluation) minus the base model's."""
    grid = design.kl_grid
    base, error, said = base_reward(exp, design)
    gains = []
    for seed in sorted(group.runs) if base is not None else []:  # no base model's reward: nothing to gain over
        path = heldout_path(group, seed, agent)
        if path is None:
            continue
        reached = [r for r in (reward_at(path, k) for k in sorted(grid, reverse=True)) if r is not None]
        gains.append((reached[0] if reached else float(path.reward[-1])) - base)
    gains = np.array(gains, dtype=float)
    end = float(gains.mean() + base) if len(gains) else float("nan")
    return judge_gains(group.name(agent), "held-out path", "held-out reward at the largest KL-grid point each seed's "
                       f"path reached (else its last evaluation) against the base model's{said}", gains,
                       float("nan") if base is None else base, end, error)


def _learned(exp: Experiment, group: Group, agent: str, design: Design) -> Learning:
    if design.learned_at == "kl_grid":
        return learned_along_path(exp, group, agent, design)
    return baseline_learned(exp, group, agent)


def matched_kl(exp: Experiment, method: str = "cory") -> MatchedKL:
    """PPO against ``method`` (CORY, or a variant of it such as ``cory_norm``) at matched held-out KL."""
    design = load_design(exp.path)
    ppo, cory = exp.main_group("ppo"), exp.main_group(method)
    if ppo is None or cory is None:
        name = METHOD_NAMES.get(method, method)
        return MatchedKL(NOT_DECIDED, f"**not decided** — no PPO and {name} runs with metrics to compare.", [], design)
    learning = _learned(exp, ppo, POLICY, design)
    head = f"Design: {design.text()}."
    if learning.learned is not True:
        why = learning.text.split(" — ", 1)[-1]
        if len(ppo.runs) < design.min_seeds:  # the design's rule: fewer seeds, the numbers shown and no verdict
            return MatchedKL(NOT_DECIDED, f"**{NOT_DECIDED}** — {len(ppo.runs)} PPO seed(s), the design needs "
                             f"{design.min_seeds}; so far, not shown to learn: {why} {head}", [], design)
        answer = PPO_DID_NOT_LEARN if learning.learned is False else NOT_DECIDED
        return MatchedKL(answer, f"**{answer}** — {why} {head}", [], design)
    readings = []
    for agent in cory.agents:
        agent_learning = _learned(exp, cory, agent, design)
        reading = AgentReading(cory.name(agent), [], [], design, learned=agent_learning.learned,
                               learning=agent_learning)
        for seed in sorted(set(cory.runs) & set(ppo.runs)):
            mine, base = heldout_path(cory, seed, agent), heldout_path(ppo, seed, POLICY)
            r = None
            if mine is not None and base is not None:
                every = seed_reading(seed, mine, base, tuple(sorted(set(design.kl_grid) | set(SECONDARY_KL))))
                for k, d in every.points.items():
                    reading.by_point.setdefault(k, []).append(d)
                r = SeedReading(seed, {k: d for k, d in every.points.items() if k in design.kl_grid})
            if r is None or not r.points:
                reading.left_out.append(seed)
            else:
                reading.readings.append(r)
        reading.test()
        readings.append(reading)
    if all(r.learned is False for r in readings) and design.agents_tested != "all":
        lines = "\n".join(r.line() for r in readings)
        if len(cory.runs) < design.min_seeds:  # as for PPO above: fewer seeds, the numbers shown and no verdict
            return MatchedKL(NOT_DECIDED, f"**{NOT_DECIDED}** — {len(cory.runs)} "
                             f"{METHOD_NAMES.get(cory.method, cory.method)} seed(s), the design needs "
                             f"{design.min_seeds}; so far no agent's final held-out reward is shown above the base "
                             f"model's beyond noise. {head}\n\n{lines}", readings, design)
        return MatchedKL(CORY_DID_NOT_LEARN, f"**{CORY_DID_NOT_LEARN}** — no CORY agent's final held-out reward is "
                         f"above the base model's beyond noise. {head}\n\n{lines}", readings, design)
    answer, summary = judge(readings, design, "at the same held-out KL")
    lines = [r.line() for r in readings]
    return MatchedKL(answer, f"**{answer}** — {summary} {learning.text} {head}\n\n" + "\n".join(lines),
                     readings, design)


def judge(readings: list[AgentReading], design: Design, where: str) -> tuple[str, str]:
    """The answers of the agents' tests (Holm over the agents judged) and the folder's, with a one-line summary;
    an agent that did not learn is not tested, and named as such in its line."""
    judged = [r for r in readings if r.judged]
    if not judged:
        return NOT_DECIDED, f"too few paired seeds with points to compare (the design needs {design.min_seeds})."
    higher = holm([r.p_higher for r in judged], design.alpha)
    below = holm([r.p_below_margin for r in judged], design.alpha)
    lower = holm([r.p_lower for r in judged], design.alpha)
    for r, h, b in zip(judged, higher, below):
        r.answer = YES if h else (NO if b else COULD_NOT_TELL)
    if any(r.answer == YES for r in judged) and not any(lower):
        return YES, f"a CORY agent's held-out reward is higher than PPO's {where}."
    if all(r.answer == NO for r in judged):
        return NO, (f"no CORY agent reaches a held-out reward above PPO's + {design.margin:g} {where}"
                    + (" (shown lower)" if all(lower) else "") + ".")
    return COULD_NOT_TELL, "neither shown higher nor shown not higher by the margin at these seeds."


# ----------------------------------------------------------------------------- the normaliser alone


def normaliser_alone(exp: Experiment, method: str = "cory_norm", reference: str = "cory") -> str:
    """``method`` (CORY with score normalisation) minus ``reference`` (CORY without), paired by seed, per agent:
    the held-out KL and reward at the last iteration both paths reached (matched iterations: how much "lower KL at
    lower reward" the normaliser makes by itself) and the held-out reward at matched held-out KL on the design's
    grid (whether it only moves CORY along its own reward-vs-KL path). Two-sided paired t-tests, descriptive (no
    Holm). Empty when either group is missing."""
    norm, ref = exp.main_group(method), exp.main_group(reference)
    if norm is None or ref is None:
        return ""
    design = load_design(exp.path)
    seeds = sorted(set(norm.runs) & set(ref.runs))
    lines = []
    for agent in norm.agents:
        if agent not in ref.agents:
            continue
        kl, reward, matched, last, used = [], [], [], [], []
        for seed in seeds:
            a, b = heldout_path(norm, seed, agent), heldout_path(ref, seed, agent)
            if a is None or b is None:
                continue
            end = min(a.iterations[-1], b.iterations[-1])
            ia, ib = np.flatnonzero(a.iterations == end), np.flatnonzero(b.iterations == end)
            if not (len(ia) and len(ib)):
                continue
            used.append(seed)
            last.append(int(end))
            kl.append(float(a.kl[ia[0]] - b.kl[ib[0]]))
            reward.append(float(a.reward[ia[0]] - b.reward[ib[0]]))
            r = seed_reading(seed, a, b, design.kl_grid)
            if r.points:
                matched.append(r.value)

        def read(values: list[float], unit: str) -> str:
            d = paired_diff(values)
            if d.n < 2:
                return f"{fmt(d.mean)}{unit} ({d.n} seed)"
            p = p_two_sided(d)
            return f"{'+' if d.mean >= 0 else ''}{fmt(d.mean)}{unit} ± {fmt(d.se)} (SE, {d.n} seeds; two-sided p {fmt(p)})"

        if not used:
            lines.append(f"- {norm.name(agent)} − {ref.name(agent)}: no paired seed with both held-out paths.")
            continue
        at = f"iteration {last[0]}" if len(set(last)) == 1 else f"iterations {min(last)}–{max(last)}"
        lines.append(f"- {norm.name(agent)} − {ref.name(agent)}, paired seeds {', '.join(map(str, used))}: at {at}, "
                     f"held-out KL {read(kl, ' nats')}, held-out reward {read(reward, '')}; at matched held-out KL "
                     f"(grid {', '.join(f'{k:g}' for k in design.kl_grid)}): {read(matched, '')}.")
    return "\n".join(lines)
