"""The verdict of REPORT.md: does CORY reach similar task reward at lower KL and higher r_c than PPO?

``verdict`` compares each CORY agent with PPO by one-sided Welch's t-tests over the per-seed final values
(``cory.results.final_value``) at alpha 0.05, by the rule spelled out in ``VERDICT_RULE`` (printed in the report):
"yes" only when both agents show lower KL and higher r_c with a task reward not shown to be lower; no verdict with
fewer than 3 seeds per method. ``confound_lines`` gives the same test against the confounds ``ppo_norm`` and
``cory_authors``, beside the answer. A module of its own because the test and its wording are the report's one
judgement, and they are easier to review apart from the loading and the markdown.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cory.results import LAST_N, Experiment, Final, Group, curve, final_value, fmt, fmt_final

ALPHA = 0.05     # the verdict's one-sided Welch's t-tests
MIN_SEEDS = 3    # fewer seeds per method: the numbers are shown, no verdict
COMPARED = ("task_reward", "kl", "combined_reward")


@dataclass
class Verdict:
    answer: str  # "yes" | "partly" | "no" | "too few seeds" | "not decided"
    text: str


@dataclass
class WelchResult:
    """A one-sided Welch's t-test over per-seed final values."""

    p: float                # one-sided p-value; NaN when undefined (a group with < 2 seeds, or both constant and equal)
    constant: bool = False  # both groups constant over seeds: decided by the sign of the difference


def welch(a: Final, b: Final, alternative: str) -> WelchResult:
    """Welch's t-test (unequal variances) of ``a`` against ``b`` over the per-seed values, one-sided:
    ``alternative`` "less" tests mean(a) < mean(b), "greater" mean(a) > mean(b).

    When both groups are constant (no spread: Welch's t is undefined, scipy gives NaN or ±inf) and differ, the sign
    of the difference decides: p = 0 when it points the tested way, 1 otherwise (the limit of the test as the
    spread goes to 0); constant and equal: p is NaN (no difference shown either way)."""
    x, y = np.asarray(a.per_seed, dtype=float), np.asarray(b.per_seed, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return WelchResult(float("nan"))
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        diff = x[0] - y[0]
        if diff == 0:
            return WelchResult(float("nan"), True)
        return WelchResult(0.0 if (diff < 0) == (alternative == "less") else 1.0, True)
    import warnings

    from scipy import stats

    with warnings.catch_warnings():  # nearly identical values: scipy warns of precision loss, the answer stands
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind(x, y, equal_var=False, alternative=alternative)
    return WelchResult(float(res.pvalue))


@dataclass
class Comparison:
    """One agent of a method against a baseline, on the three compared metrics' per-seed final values."""

    agent: str
    name: str                  # e.g. "CORY-LLM1"
    base_name: str             # e.g. "PPO"
    fin: dict[str, Final]
    base: dict[str, Final]

    @property
    def n(self) -> int:
        return min(f.n for f in (*self.fin.values(), *self.base.values()))

    @property
    def judged(self) -> bool:
        return self.n >= MIN_SEEDS

    @cached_property
    def reward_lower(self) -> WelchResult:  # tested: the agent's task reward < the baseline's
        return welch(self.fin["task_reward"], self.base["task_reward"], "less")

    @cached_property
    def kl_lower(self) -> WelchResult:
        return welch(self.fin["kl"], self.base["kl"], "less")

    @cached_property
    def rc_higher(self) -> WelchResult:
        return welch(self.fin["combined_reward"], self.base["combined_reward"], "greater")

    @property
    def similar(self) -> bool:
        """Task reward not shown to be lower (NaN p: no difference shown)."""
        return self.judged and not self.reward_lower.p < ALPHA

    @property
    def lower_kl(self) -> bool:
        return self.judged and self.kl_lower.p < ALPHA

    @property
    def higher_rc(self) -> bool:
        return self.judged and self.rc_higher.p < ALPHA

    @property
    def met(self) -> bool:
        return self.similar and self.lower_kl and self.higher_rc

    @property
    def kl_ratio(self) -> float:
        """The paper's yardstick: the baseline's final KL over this agent's (the paper reports > 2 for PPO/CORY)."""
        mine = self.fin["kl"].mean
        return self.base["kl"].mean / mine if mine > 0 else float("nan")

    def line(self) -> str:
        def p(test: WelchResult, holds: bool, yes: str, no: str) -> str:
            how = " (both constant over seeds: decided by the sign)" if test.constant else ""
            return f"one-sided p = {fmt(test.p)}{how}: {yes if holds else no}"

        versus = f"{self.name} vs {self.base_name}"
        nums = (f"task reward {fmt_final(self.fin['task_reward'])} vs {fmt_final(self.base['task_reward'])}",
                f"KL {fmt_final(self.fin['kl'])} vs {fmt_final(self.base['kl'])}",
                f"r_c {fmt_final(self.fin['combined_reward'])} vs {fmt_final(self.base['combined_reward'])}")
        ratio = f"KL ratio {self.base_name}/{self.name} = {fmt(self.kl_ratio)} (paper: > 2)"
        if not self.judged:
            return (f"- {versus}: {nums[0]}; {nums[1]}; {nums[2]}; {ratio}. Not judged: {self.n} seed(s), "
                    f"the test needs {MIN_SEEDS}.")
        outcome = "all three hold" if self.met else "not all three hold"
        return (f"- {versus}: {nums[0]} ({p(self.reward_lower, self.similar, 'not shown to be lower', 'lower')}); "
                f"{nums[1]} ({p(self.kl_lower, self.lower_kl, 'lower', 'lower not shown')}); "
                f"{nums[2]} ({p(self.rc_higher, self.higher_rc, 'higher', 'higher not shown')}); "
                f"{ratio} — {outcome}.")


def _not_compared(name: str) -> str:
    return f"- {name}: task_reward, kl or combined_reward missing, not compared."


def _common_end(series: list[tuple[Group, str]]) -> int | None:
    """The last iteration that every (group, agent) logged for all compared metrics: runs cut off at different
    iterations are compared over the iterations all of them reached."""
    ends = [c.steps[-1] for g, a in series for m in COMPARED
            for c in [curve(g, a, m)] if c is not None and len(c.steps)]
    return int(min(ends)) if ends else None


def compare(base: Group, other: Group, upto: int | None | str = "auto") -> tuple[list[Comparison], list[str]]:
    """Each agent of ``other`` against ``base``'s first agent, over the iterations up to ``upto`` ("auto": the
    last one all of them reached); returns (comparisons, names of the agents or baseline lacking metrics)."""
    base_agent = base.agents[0] if base.agents else "policy"
    if upto == "auto":
        upto = _common_end([(base, base_agent)] + [(other, a) for a in other.agents])
    ref = {m: final_value(base, base_agent, m, upto=upto) for m in COMPARED}
    if any(f is None for f in ref.values()):
        return [], [base.name(base_agent)]
    out, missing = [], []
    for agent in other.agents:
        fin = {m: final_value(other, agent, m, upto=upto) for m in COMPARED}
        if any(f is None for f in fin.values()):
            missing.append(other.name(agent))
        else:
            out.append(Comparison(agent, other.name(agent), base.name(base_agent), fin, ref))
    return out, missing


VERDICT_RULE = (
    "Does CORY reach similar task reward at lower KL and higher r_c than PPO, as the paper claims? The rule: "
    f"a seed's final value is its mean over its last {LAST_N} aligned iterations, up to the last iteration that "
    "every compared run reached; each CORY agent (LLM1, LLM2) is compared with PPO by Welch's t-test (unequal "
    f"variances) over those per-seed values, one-sided, at α = {ALPHA:g}. _lower KL_: the agent's KL is below "
    f"PPO's with p < {ALPHA:g}; _higher r_c_: its r_c is above PPO's with p < {ALPHA:g}; _similar task reward_: "
    f"its task reward is not shown to be lower than PPO's (the test of \"CORY < PPO\" gives p ≥ {ALPHA:g}), which "
    "means \"not shown to be lower\", not \"shown to be equal\": with few seeds a real drop can go undetected. A KL "
    "or r_c comparison that fails reads _not shown_; a task reward shown to be lower reads _lower_. When both "
    "methods' per-seed values are constant (no spread, no t), a comparison is decided by the sign of the "
    "difference and marked so (constant values over seeds suggest the seed did not change the runs). "
    "_yes_: both agents meet all three; _partly_: one agent meets all three, or some agent has lower KL or "
    "higher r_c; "
    "_no_: no agent has lower KL or higher r_c; "
    f"_too few seeds_: a method has fewer than {MIN_SEEDS} seeds (the numbers are shown, no verdict); "
    "_not decided_: metrics are missing. The KL ratio (PPO's final KL over the agent's) is the paper's own "
    "yardstick (it reports > 2); it is shown, not tested.")


def verdict(exp: Experiment) -> Verdict:
    """Did both CORY agents reach similar task reward at lower KL and higher r_c than PPO (``VERDICT_RULE``)?"""
    ppo, cory = exp.main_group("ppo"), exp.main_group("cory")
    if ppo is None or cory is None:
        missing = " and ".join(m for m, g in (("ppo", ppo), ("cory", cory)) if g is None)
        return Verdict("not decided", f"No finished comparison: no {missing} runs with metrics.")
    upto = _common_end([(ppo, "policy")] + [(cory, a) for a in cory.agents])
    if any(final_value(ppo, "policy", m, upto=upto) is None for m in COMPARED):
        return Verdict("not decided", "PPO's runs lack task_reward, kl or combined_reward metrics.")
    comps, missing = compare(ppo, cory, upto)
    lines = [c.line() for c in comps] + [_not_compared(name) for name in missing]
    if not comps:
        return Verdict("not decided", "CORY's runs lack the metrics to compare.\n" + "\n".join(lines))
    base = comps[0].base
    n_ppo, n_cory = base["task_reward"].n, min(min(f.n for f in c.fin.values()) for c in comps)
    met = [c for c in comps if c.met]
    if min(n_ppo, n_cory) < MIN_SEEDS:
        answer = "too few seeds"
        summary = (f"No verdict: the test needs at least {MIN_SEEDS} seeds per method (PPO has {n_ppo}, CORY "
                   f"{n_cory}). The numbers follow without a judgement.")
    elif {c.agent for c in met} >= {"llm1", "llm2"}:
        answer = "yes"
        summary = ("Both CORY agents reached a task reward not shown to be lower than PPO's, at lower KL and "
                   f"higher r_c (one-sided Welch's t-test, p < {ALPHA:g}), as the paper claims.")
    elif met or any(c.lower_kl or c.higher_rc for c in comps):
        answer = "partly"
        if met:
            others = [c.name for c in comps if not c.met] + missing
            summary = (f"Only {' and '.join(c.name for c in met)} met all three comparisons"
                       + (f"; {' and '.join(others)} did not" if others else "") + " (see below).")
        else:
            summary = "A CORY agent had lower KL or higher r_c, but no CORY agent met all three (see below)."
    else:
        answer = "no"
        summary = ("No CORY agent had significantly lower KL or higher r_c than PPO: the paper's claim is not "
                   "reproduced here.")
    first, end = base["task_reward"].steps
    where = f" at η={fmt(cory.kl_coef)}" if cory.kl_coef is not None else ""
    head = (f"**{answer}** — {summary} Final values{where}: each seed's mean over iterations {first}–{end}, "
            f"then mean ± std over seeds (PPO {n_ppo} seed{'s' * (n_ppo != 1)}, "
            f"CORY {n_cory} seed{'s' * (n_cory != 1)}).")
    if any(c is not None and len(c.steps) and c.steps[-1] > end
           for g, a in [(ppo, "policy")] + [(cory, a) for a in cory.agents] for c in [curve(g, a, "task_reward")]):
        head += (f" The runs did not all reach the same iteration: they are compared up to iteration {end}, "
                 "the last one all of them logged.")
    kl = curve(ppo, "policy", "kl")
    if kl is not None and len(kl.steps) >= 2:
        k = min(LAST_N, len(kl.steps) // 2) or 1
        lines.append(f"- For scale: PPO's KL went from {fmt(kl.mean[:k].mean())} (first {k} iterations) "
                     f"to {fmt(kl.mean[-k:].mean())} (last {k}).")
    extra = confound_lines(exp, ppo, cory)
    return Verdict(answer, head + "\n\n" + "\n".join(lines) + ("\n\n" + extra if extra else ""))


def confound_lines(exp: Experiment, ppo: Group, cory: Group) -> str:
    """The same test against the two confounds, when their runs exist: CORY vs PPO with CORY's score normalisation
    (``ppo_norm``), and CORY as the authors' code runs it (``cory_authors``) vs PPO. Not part of the answer."""
    parts = []
    norm, authors = exp.main_group("ppo_norm"), exp.main_group("cory_authors")

    def setting(g: Group, key: str) -> str:
        v = g.config_value(key)
        return "?" if v is None else (fmt(v) if isinstance(v, float) else str(v).lower())

    pairs = []
    if norm is not None:
        pairs.append((f"CORY vs PPO with score normalisation (`ppo_norm`; score_norm: {norm.label} "
                      f"{setting(norm, 'score_norm')}, {cory.label} {setting(cory, 'score_norm')})", norm, cory))
    if authors is not None:
        pairs.append(("CORY with the authors' resets (`cory_authors`: Adam, the KL controller and the score statistics "
                      f"reset at each role exchange; reset_on_swap {setting(authors, 'reset_on_swap')}, η from "
                      f"{fmt(authors.eta)}) vs PPO (η from {fmt(ppo.eta)})", ppo, authors))
    for title, base, other in pairs:
        comps, missing = compare(base, other)
        if comps:
            first, end = comps[0].base["task_reward"].steps
            title += f", iterations {first}–{end}"
        parts.append(f"{title}:\n\n" + "\n".join([c.line() for c in comps] + [_not_compared(n) for n in missing]))
    if not parts:
        return ""
    return ("Confounds, same test (not part of the answer above):\n\n" + "\n\n".join(parts))
