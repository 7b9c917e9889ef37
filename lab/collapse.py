"""The paper's second claim: CORY resists the distribution collapse PPO falls into (at a large learning rate, PPO's
answers degenerate into repeated words while CORY's stay fluent; Ma et al., NeurIPS 2024, the GSM8K lr 1e-4 runs).

A final model has **collapsed** when its held-out distinct-2 (unique word bigrams over bigrams of its answers to the
held-out prompts) is under ``collapse_share`` of the base model's (``design.yaml``). Paired by seed, each CORY agent
against PPO: the seeds where exactly one of the two collapsed decide an exact one-sided sign test (McNemar's exact
test), Holm over the agents. Where PPO collapsed in fewer than half of the seeds, the setting did not make PPO
collapse and nothing is tested.

Beside the test, a descriptive reading (``at_matched_kl``, added after the collapse folder's test was decided): a
final model of a method that learns slower has moved less far from the base model, so it always looks less collapsed
at the last iteration. Distinct-2 and the gibberish-robust measures eval.jsonl records are read along each run's
held-out path at matched held-out KL (``lab.matched_kl.value_at``), each CORY agent minus PPO, paired by seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lab.design import load_design
from lab.matched_kl import SECONDARY_KL, HeldoutPath, heldout_path, paired_diff, value_at
from lab.curves import heldout_value
from lab.results import POLICY, Experiment, Group, finite, fmt
from lab.stats import holm, p_two_sided

YES, NO, COULD_NOT_TELL = "yes", "no", "could not tell"
PPO_DID_NOT_COLLAPSE, NOT_DECIDED = "not tested (PPO did not collapse)", "not decided"

RULE = (
    "**The collapse test** (`lab.collapse`). The paper's second claim: where PPO's answers degenerate, CORY's do "
    "not. A final model has _collapsed_ when its held-out distinct-2 is under the design's share of the base model's. "
    "Paired by seed, each CORY agent against PPO: the seeds where exactly one of the two collapsed decide an exact "
    "one-sided sign test (McNemar's), Holm over the two agents at the design's α. Per agent: _yes_ — PPO collapsed in "
    "more seeds than the agent beyond chance; _no_ — the agent collapsed in at least as many seeds as PPO; _could not "
    "tell_ — neither. The folder: _yes_ if an agent's is yes; _no_ if every agent's is no; else _could not tell_. "
    "Before it: _not tested (PPO did not collapse)_ when PPO collapsed in fewer than half of the seeds.")


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact p of ``wins`` or more successes in ``wins + losses`` fair coin flips (1 with none)."""
    n = wins + losses
    return float(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n) if n else 1.0


@dataclass
class FinalModel:
    seed: int
    distinct_2: float | None
    reward: float | None
    collapsed: bool | None
    sample: str = ""
    undefined: bool = False  # evaluated, and distinct-2 undefined: no held-out answer of two words or more


def undefined_distinct_2(result: dict | None) -> bool:
    """Whether an evaluation recorded distinct-2 as undefined (null: none of its answers holds two words, as a
    one-word task's do; ``cory.metrics.distinct_n``), not missing: such a model is neither collapsed nor not."""
    return isinstance(result, dict) and "distinct_2" in result and result["distinct_2"] is None


def _undefined_text(models) -> str:
    """" (distinct-2 undefined for seed 3: ...)" for the models whose held-out answers hold no two words."""
    seeds = [m.seed for m in models if m.undefined]
    return (f" (distinct-2 undefined for seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}: no held-out "
            "answer of two words or more, so not judged)" if seeds else "")


def final_models(group: Group, agent: str, floor: float) -> dict[int, FinalModel]:
    out = {}
    for seed, run in sorted(group.runs.items()):
        result = run.final_evaluation(agent) or {}
        d2 = finite(result.get("distinct_2"))
        samples = result.get("samples") or []
        first = samples[0] if samples and isinstance(samples[0], dict) else {}
        text = f"{first.get('query', '')}{first.get('response', '')}"
        out[seed] = FinalModel(seed, d2, heldout_value(result), None if d2 is None else d2 < floor,
                               " ".join(text.split())[:160], undefined_distinct_2(result))
    return out


@dataclass
class AgentCollapse:
    name: str
    pairs: list[tuple[FinalModel, FinalModel]]  # (PPO's, the agent's) per seed where both are known
    undefined: str = ""  # the seeds whose final model's distinct-2 is undefined (``_undefined_text``)
    p: float = float("nan")
    answer: str = "not tested"

    @property
    def wins(self) -> int:  # PPO collapsed, the agent did not
        return sum(1 for a, b in self.pairs if a.collapsed and not b.collapsed)

    @property
    def losses(self) -> int:
        return sum(1 for a, b in self.pairs if b.collapsed and not a.collapsed)

    @property
    def count(self) -> int:
        return sum(1 for _, b in self.pairs if b.collapsed)

    def line(self, judged: bool = True) -> str:
        d2 = [b.distinct_2 for _, b in self.pairs if b.distinct_2 is not None]
        reward = [b.reward for _, b in self.pairs if b.reward is not None]
        out = (f"- {self.name}: collapsed in {self.count} of {len(self.pairs)} seeds{self.undefined}; final held-out distinct-2 "
               f"{_mean_sd(d2)}, reward {_mean_sd(reward)}; seeds where only PPO collapsed {self.wins}, only "
               f"{self.name} {self.losses}")
        return out + (f": one-sided exact p {fmt(self.p)} — **{self.answer}**." if judged else " (not judged).")


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "n/a"
    a = np.asarray(values, dtype=float)
    return fmt(float(a.mean())) + (f" ± {fmt(float(a.std(ddof=1)))}" if len(a) > 1 else "")


@dataclass
class Collapse:
    answer: str
    text: str
    agents: list[AgentCollapse] = field(default_factory=list)


def threshold(exp: Experiment, design) -> tuple[float | None, float | None]:
    """The base model's held-out distinct-2 and the collapse threshold the design draws from it (None, None
    without the base model's evaluation)."""
    base = finite((exp.base_evaluation() or {}).get("distinct_2"))
    return base, None if base is None else design.collapse_share * base


def collapse_test(exp: Experiment) -> Collapse:
    design = load_design(exp.path)
    ppo, cory = exp.main_group("ppo"), exp.main_group("cory")
    base, floor = threshold(exp, design)
    if ppo is not None and cory is not None and undefined_distinct_2(exp.base_evaluation()):
        return Collapse(NOT_DECIDED, "**not decided** — distinct-2 is undefined here: the base model's held-out "
                                     "answers hold no two words (answers shorter than two words, as a one-word task's "
                                     "are), so there is no threshold and no model is called collapsed or not.")
    if ppo is None or cory is None or base is None:
        return Collapse(NOT_DECIDED, "**not decided** — it needs PPO and CORY runs and the base model's held-out "
                                     "distinct-2.")
    head = (f"Collapsed: final held-out distinct-2 under {design.collapse_share:g} × the base model's "
            f"{fmt(base)} = {fmt(floor)}; α = {design.alpha:g}, Holm over the agents (from {design.source}).")
    ppo_models = final_models(ppo, POLICY, floor)
    known = [m for m in ppo_models.values() if m.collapsed is not None]
    ppo_count = sum(1 for m in known if m.collapsed)
    ppo_line = (f"- {ppo.name(eta=False)}: collapsed in {ppo_count} of {len(known)} seeds"
                f"{_undefined_text(ppo_models.values())}; final held-out distinct-2 "
                f"{_mean_sd([m.distinct_2 for m in known])}, reward {_mean_sd([m.reward for m in known if m.reward is not None])}.")
    readings, models = [], [(ppo.name(POLICY), ppo_models)]
    for agent in cory.agents:
        mine = final_models(cory, agent, floor)
        models.append((cory.name(agent), mine))
        pairs = [(ppo_models[s], mine[s]) for s in sorted(set(ppo_models) & set(mine))
                 if ppo_models[s].collapsed is not None and mine[s].collapsed is not None]
        reading = AgentCollapse(cory.name(agent), pairs, undefined=_undefined_text(mine.values()))
        reading.p = sign_test_p(reading.wins, reading.losses)
        readings.append(reading)
    samples = _samples(models)
    if len(known) < design.min_seeds:
        # the numbers so far are shown (an interim look), no test
        return Collapse(NOT_DECIDED, f"**not decided** — {len(known)} PPO seed(s) with a held-out distinct-2, the "
                                     f"design needs {design.min_seeds}. {head}\n\n"
                        + "\n".join([ppo_line] + [r.line(judged=False) for r in readings]) + samples, readings)
    if 2 * ppo_count < len(known):
        answer = PPO_DID_NOT_COLLAPSE
        return Collapse(answer, f"**{answer}** — PPO collapsed in {ppo_count} of {len(known)} seeds, fewer than "
                                f"half: this setting does not make PPO collapse. {head}\n\n"
                        + "\n".join([ppo_line] + [r.line() for r in readings]) + samples, readings)
    for r, shown in zip(readings, holm([r.p for r in readings], design.alpha)):
        r.answer = YES if shown else (NO if r.count >= ppo_count else COULD_NOT_TELL)
    if any(r.answer == YES for r in readings):
        answer, summary = YES, "where PPO collapsed, a CORY agent did not, beyond chance."
    elif all(r.answer == NO for r in readings):
        answer, summary = NO, "every CORY agent collapsed in at least as many seeds as PPO."
    else:
        answer, summary = COULD_NOT_TELL, "CORY collapsed less often than PPO, but not beyond chance at these seeds."
    return Collapse(answer, f"**{answer}** — {summary} {head}\n\n"
                    + "\n".join([ppo_line] + [r.line() for r in readings]) + samples, readings)


def _samples(models: list[tuple[str, dict[int, FinalModel]]]) -> str:
    """The first held-out answer of every final model (named), what collapse looks like, or does not."""
    lines = [f"  - {name} seed {m.seed}{' (collapsed)' if m.collapsed else ''}: “{m.sample}”"
             for name, per_seed in models for m in per_seed.values() if m.sample]
    return ("\n- The first held-out answer of each final model:\n" + "\n".join(lines)) if lines else ""


# ----------------------------------------------------------------------------- at matched held-out KL (descriptive)

# where the collapse folder's PPO degenerated (held-out distinct-2 from 0.89 at 14 nats to under 0.1 by 46-72): read
# too wherever a folder's paths reach them, beside the design's grid and the claim's SECONDARY_KL
COLLAPSE_KL = (10.0, 20.0, 30.0, 40.0)

# (eval.jsonl key, name, which way a difference reads); distinct-2 counts gibberish (digit strings, token salad) as
# diverse, the base model's log-likelihood of the answers and the share that parses do not
MEASURES = (
    ("distinct_2", "Held-out distinct-2", "> 0: the agent's answers more diverse"),
    ("base_logprob", "The base model's mean per-token log-likelihood of the answers (`base_logprob`)",
     "> 0: the agent's answers likelier under the base model, as gibberish is not"),
    ("parseable_share", "The share of answers that parse (`parseable_share`)",
     "> 0: more of the agent's answers parse"),
)
ALWAYS_RECORDED = ("distinct_2", "base_logprob")  # parseable_share only for a task that parses answers

MATCHED_RULE = (
    "_Descriptive, not a pre-registered test_ (added after the collapse folder's test was decided; no answer is drawn "
    "from it and its p values are not corrected for the many readings). At the last iteration a method that learns "
    "slower has moved less far from the base model, so it always looks less collapsed. Here each run's held-out "
    "evaluations form a path of (held-out KL, measure), read where the run first reaches each KL as the claim's "
    "reward is (`lab.matched_kl.value_at`), each CORY agent minus PPO paired by seed: mean ± SE over the seeds "
    "whose two paths reached that KL, and a two-sided paired t-test's p; beside it, the same seeds' difference at the "
    "last iteration both paths evaluated (the final one, for runs that finished). Distinct-2 counts gibberish (digit "
    "strings, emoji, token salad) as diverse; the base model's log-likelihood of the answers (`base_logprob`) and, for "
    "a task that parses its answers, the share that parses (`parseable_share`) do not, and are read the same way "
    "where the runs recorded them.")


@dataclass
class MatchedPoint:
    """One agent's reading of one measure at one held-out KL: per paired seed that reached it, the agent's value
    minus PPO's there and at the last iteration both paths evaluated."""
    agent: str
    key: str
    kl: float
    seeds: list[int]
    matched: list[float]
    last: list[float]

    def cells(self, all_seeds: int) -> list[str]:
        seeds = (str(len(self.seeds)) if len(self.seeds) == all_seeds else
                 f"{len(self.seeds)} (seed{'s' if len(self.seeds) > 1 else ''} {', '.join(map(str, self.seeds))})")
        return [self.agent, f"{self.kl:g}", seeds, *_signed(self.matched), *_signed(self.last)]


def _signed(values: list[float]) -> list[str]:
    """"mean ± SE" and the two-sided paired p of per-seed differences."""
    d = paired_diff(values)
    mean = f"{'+' if d.mean >= 0 else ''}{fmt(d.mean)}"
    return [mean + (f" ± {fmt(d.se)}" if d.n > 1 else " (1 seed)"), fmt(p_two_sided(d))]


def _last_common(a: HeldoutPath, b: HeldoutPath) -> float:
    """``a``'s value minus ``b``'s at the last iteration both evaluated (NaN, shown n/a, if none)."""
    end = max(set(a.iterations.tolist()) & set(b.iterations.tolist()), default=None)
    if end is None:
        return float("nan")
    return float(a.values[a.iterations == end][0] - b.values[b.iterations == end][0])


@dataclass
class MatchedCollapse:
    text: str
    points: list[MatchedPoint] = field(default_factory=list)
    not_recorded: list[str] = field(default_factory=list)  # measures no held-out row of these runs holds


def at_matched_kl(exp: Experiment) -> MatchedCollapse | None:
    """Each CORY agent's (``cory``, and ``cory_norm`` where run) held-out distinct-2 and gibberish-robust measures
    minus PPO's at matched held-out KL, descriptive; None without held-out paths of PPO and a CORY method."""
    design = load_design(exp.path)
    ppo = exp.main_group("ppo")
    corys = [g for g in (exp.main_group("cory"), exp.main_group("cory_norm")) if g is not None]
    grid = sorted(set(design.kl_grid) | set(SECONDARY_KL) | set(COLLAPSE_KL))
    if ppo is None or not any(heldout_path(ppo, s, POLICY) is not None and heldout_path(g, s, a) is not None
                              for g in corys for a in g.agents for s in set(g.runs) & set(ppo.runs)):
        return None
    points, missing = [], []
    lines = [MATCHED_RULE, "", f"Held-out KL read (nats): {', '.join(f'{k:g}' for k in grid)} — the design's grid, "
             "the claim's secondary points and where the collapse folder's PPO degenerated — each where reached."]
    for key, name, sense in MEASURES:
        rows, pairs = [], 0
        for g in corys:
            for agent in g.agents:
                paths = {s: (heldout_path(g, s, agent, key), heldout_path(ppo, s, POLICY, key))
                         for s in sorted(set(g.runs) & set(ppo.runs))}
                paths = {s: p for s, p in paths.items() if p[0] is not None and p[1] is not None}
                pairs = max(pairs, len(paths))
                for k in grid:
                    point = MatchedPoint(g.name(agent), key, k, [], [], [])
                    for s, (mine, theirs) in paths.items():
                        a, b = value_at(mine, k), value_at(theirs, k)
                        if a is not None and b is not None:
                            point.seeds.append(s)
                            point.matched.append(a - b)
                            point.last.append(_last_common(mine, theirs))
                    if point.seeds:
                        points.append(point)
                        rows.append(point.cells(len(paths)))
        if not pairs and key == "distinct_2" and any(undefined_distinct_2(r) for g in (ppo, *corys)
                                                     for run in g.runs.values() for r in run.heldout):
            lines += ["", f"{name} is undefined along these paths (null where no held-out answer holds two words, "
                          "as a one-word task's do): not read."]
            continue
        if not pairs:
            if key in ALWAYS_RECORDED:
                missing.append(key)
                lines += ["", f"{name} was not recorded for these runs (older runs: their held-out evaluations "
                              "predate it)."]
            continue
        lines += ["", f"**{name}**, agent minus PPO ({sense}):", "",
                  markdown_table(["agent − PPO", "held-out KL (nats)", "paired seeds", "at matched KL (mean ± SE)",
                                  "p", "at the last iteration, same seeds", "p"], rows)
                  if rows else "_No paired seed's paths reached a KL read._"]
    return MatchedCollapse("\n".join(lines), points, missing)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(row) + " |" for row in rows])
