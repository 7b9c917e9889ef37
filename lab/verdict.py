"""The matched-iterations verdict of REPORT.md (secondary since the claim is read at matched KL, ``lab.matched_kl``):
does CORY reach similar task reward at lower KL than PPO at the same iteration? (Ma et al., NeurIPS 2024, Fig. 3.)

The rule is ``VERDICT_RULE``, which the report prints before the numbers: t-tests over the seeds' final values,
"similar reward" a non-inferiority test, Holm over one verdict's claims, and a negative below 80% power to show the
paper's effect read "could not tell (power N%)", never a plain "no".

A module of its own because the tests and their wording are the report's one judgement, easier to review apart
from the loading (``lab.results``) and the markdown (``lab.report``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from lab.learning import baseline_learned
from lab.curves import curve, Final, final_value, fmt_final, heldout_final, heldout_value
from lab.results import LAST_N, POLICY, REWARD_RANGES, Experiment, fmt, Group
from lab.stats import (ALPHA, POWER_TARGET, Diff, difference, holm, holm_adjusted, min_detectable, p_two_sided,
                            p_value, pct, power, trend)
from cory.tasks import registered

MIN_SEEDS = 3        # fewer seeds per method: the numbers are shown, no verdict
MARGIN_SHARE = 0.2   # "similar reward": CORY's reward is at most this share of PPO's reward gain below PPO's
# ... or this share of the reward's range, whichever is larger: where PPO barely gains (batch-8 CPU runs), a margin
# of a share of nothing would demand "not lower at all", which no number of seeds can show for equal rewards
MARGIN_RANGE_SHARE = 0.025  # VADER's [-1, 1]: 0.05; 0/1 correctness: 0.025
PAPER_KL_RATIO = 2.0  # the paper's effect: PPO's final KL twice CORY's, at similar reward
COMPARED = ("task_reward", "kl", "combined_reward")
SAME = 1e-9          # iteration-0 values this close (relative) count as the same draw


# ----------------------------------------------------------------------------- pairing

@dataclass
class Pairing:
    paired: bool
    why: str  # one sentence, printed


def _first_draw(group: Group, seed: int) -> tuple[int, float | None, float | None] | None:
    """(step, task reward, response length) of the agent answering from the query alone (PPO's policy, CORY's
    pioneer) at the run's first logged iteration: what the seed's prompts and length draws decide."""
    rows = [r for r in group.runs[seed].rows if isinstance(r.get("step"), int) and not isinstance(r["step"], bool)]
    if not rows:
        return None
    row = min(rows, key=lambda r: r["step"])
    agents = group.agents
    agent = row.get("pioneer") if row.get("pioneer") in agents else (agents[0] if agents else POLICY)
    return row["step"], row.get(f"{agent}/task_reward"), row.get(f"{agent}/response_length")


def _same(a, b) -> bool:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return False
    return math.isclose(float(a), float(b), rel_tol=SAME, abs_tol=SAME)


def pairing(base: Group, other: Group) -> Pairing:
    """Paired by seed when both groups ran the same seeds and, for every seed, their first iteration (before any
    update, both answering with the same starting model) gave the same task reward and answer length: the seed's
    prompts and length draws were shared, so seed-to-seed luck cancels in the differences."""
    if set(base.runs) != set(other.runs):
        return Pairing(False, f"unpaired (Welch): the seeds differ ({_seeds(base)} vs {_seeds(other)})")
    for seed in sorted(base.runs):
        a, b = _first_draw(base, seed), _first_draw(other, seed)
        if a is None or b is None or a[0] != b[0] or None in (a[1], b[1]):
            return Pairing(False, f"unpaired (Welch): seed {seed}'s first iteration cannot be compared")
        if not _same(a[1], b[1]) or (a[2] is not None and b[2] is not None and not _same(a[2], b[2])):
            return Pairing(False, f"unpaired (Welch): seed {seed}'s iteration-{a[0]} task reward or answer length "
                                  f"differs ({fmt(a[1])} vs {fmt(b[1])}), so the runs did not share their prompts "
                                  "and length draws")
    return Pairing(True, f"paired by seed: each of the {len(base.runs)} seeds' runs shared their prompts and their "
                         "stream of length draws (identical iteration-0 task reward and answer length)")


def _seeds(g: Group) -> str:
    return ",".join(map(str, sorted(g.runs)))


# ----------------------------------------------------------------------------- one agent against PPO

@dataclass
class Margin:
    """The non-inferiority margin of "similar reward" (``MARGIN_SHARE``, at least ``MARGIN_RANGE_SHARE``)."""

    start: float  # the baseline's seed-mean task reward at its first iteration (held-out: the base model's)
    final: float  # its seed-mean final task reward
    step: int     # that first iteration
    reward_range: tuple[float, float] | None = None
    heldout: bool = False  # read from the held-out evaluations of the final models

    @property
    def gain(self) -> float:
        return self.final - self.start

    @property
    def floor(self) -> float:
        if self.reward_range is None:
            return 0.0
        lo, hi = self.reward_range
        return MARGIN_RANGE_SHARE * (hi - lo)

    @property
    def value(self) -> float:
        return max(MARGIN_SHARE * max(self.gain, 0.0), self.floor)

    def text(self, base_name: str) -> str:
        share = MARGIN_SHARE * max(self.gain, 0.0)
        where = ("held-out reward gain (the base model's " if self.heldout else "reward gain (") + fmt(self.start)
        head = (f"margin = {MARGIN_SHARE:g} × {base_name}'s {where}"
                f"{'' if self.heldout else f' at iteration {self.step}'} → {fmt(self.final)} final)")
        if self.reward_range is not None:
            lo, hi = self.reward_range
            head += f", at least {MARGIN_RANGE_SHARE:g} × the reward's range [{lo:g}, {hi:g}]"
        head += f" = {fmt(self.value)}"
        if self.value == 0:
            head += (f" ({base_name}'s reward did not rise, so no drop is allowed: \"similar\" needs the reward shown "
                     f"not lower at all)")
        elif self.floor > share:
            head += f" (the floor: {base_name}'s gain is small)"
        return head


def _scored_reward(group: Group) -> str | None:
    """The reward the group's evaluations score with (a shaped training reward: the one it shapes)."""
    name = group.config_value("reward_model")
    spec = registered().get(group.config_value("task"))
    return spec.evaluation.scored_reward(name) if spec is not None else name


def margin_of(base: Group, agent: str, final: Final) -> Margin | None:
    c = curve(base, agent, "task_reward")
    if c is None or not len(c.steps):
        return None
    reward_range = REWARD_RANGES.get(base.config_value("reward_model"))
    return Margin(float(c.values[:, 0].mean()), final.mean, int(c.steps[0]), reward_range)


@dataclass
class Comparison:
    """One agent of a method against a baseline on the per-seed final values, with the tests of the claim
    "similar task reward (non-inferior by the margin) at lower KL", r_c shown beside them."""

    agent: str
    name: str                  # e.g. "CORY-LLM1"
    base_name: str             # e.g. "PPO"
    fin: dict[str, Final]
    base: dict[str, Final]
    pair: Pairing = field(default_factory=lambda: Pairing(False, "unpaired (Welch)"))
    margin: Margin | None = None
    m: int = 1                 # claims in the verdict's family (for the power's level)
    holds: bool = False        # set by the verdict after Holm's correction

    @property
    def n(self) -> int:
        return min(f.n for f in (*self.fin.values(), *self.base.values()))

    @property
    def judged(self) -> bool:
        return self.n >= MIN_SEEDS

    def diff(self, metric: str) -> Diff:
        return difference(self.fin[metric], self.base[metric], self.pair.paired)

    @cached_property
    def d_reward(self) -> Diff:
        return self.diff("task_reward")

    @cached_property
    def d_kl(self) -> Diff:
        return self.diff("kl")

    @cached_property
    def d_rc(self) -> Diff:
        return self.diff("combined_reward")

    @property
    def delta(self) -> float:
        return self.margin.value if self.margin is not None else 0.0

    @cached_property
    def p_kl(self) -> float:          # KL lower than the baseline's
        return p_value(self.d_kl, "less")

    @cached_property
    def p_similar(self) -> float:     # reward above baseline − margin (non-inferiority)
        return p_value(self.d_reward, "greater", -self.delta)

    @cached_property
    def p_rc(self) -> float:          # r_c higher (shown, not part of the claim)
        return p_value(self.d_rc, "greater")

    @property
    def p_claim(self) -> float:
        """Intersection-union: the claim holds when both of its tests do, so its p is the larger of the two."""
        ps = [self.p_kl, self.p_similar]
        return max(ps) if all(math.isfinite(p) for p in ps) else float("nan")

    @property
    def level(self) -> float:
        return ALPHA / self.m  # Holm's strictest step: the power below is a lower bound

    @property
    def paper_kl_gap(self) -> float:
        """The paper's effect on KL: PPO's final KL twice the agent's, i.e. the agent's KL lower by half of PPO's."""
        return self.base["kl"].mean * (1 - 1 / PAPER_KL_RATIO)

    @property
    def power_kl(self) -> float:
        return power(self.paper_kl_gap, self.d_kl, self.level)

    @property
    def power_similar(self) -> float:
        """Chance of showing "similar" when the rewards are truly equal (the distance to the bound is the margin)."""
        return power(self.delta, self.d_reward, self.level)

    @property
    def power_claim(self) -> float:
        """Power to show the paper's effect (KL halved, reward equal), the two tests taken as independent."""
        return self.power_kl * self.power_similar

    @property
    def kl_ratio(self) -> float:
        """The paper's yardstick: the baseline's final KL over this agent's (the paper reports > 2 for PPO/CORY)."""
        mine = self.fin["kl"].mean
        return self.base["kl"].mean / mine if mine > 0 else float("nan")

    def line(self) -> str:
        versus = f"{self.name} vs {self.base_name}"
        nums = (f"task reward {fmt_final(self.fin['task_reward'])} vs {fmt_final(self.base['task_reward'])}",
                f"KL {fmt_final(self.fin['kl'])} vs {fmt_final(self.base['kl'])}",
                f"r_c {fmt_final(self.fin['combined_reward'])} vs {fmt_final(self.base['combined_reward'])}")
        ratio = f"KL ratio {self.base_name}/{self.name} = {fmt(self.kl_ratio)} (paper: > {PAPER_KL_RATIO:g})"
        if not self.judged:
            return (f"- {versus}: {nums[0]}; {nums[1]}; {nums[2]}; {ratio}. Not judged: {self.n} seed(s), "
                    f"the test needs {MIN_SEEDS}.")
        lvl = f"α/{self.m}" if self.m > 1 else "α"

        def part(d: Diff, p: float, held: str, not_held: str, mdd_what: str) -> str:
            how = " (no spread over seeds: decided by the sign)" if d.constant else ""
            corr = f", seed correlation {fmt(d.corr, 2)}" if d.paired and math.isfinite(d.corr) else ""
            verdict_word = held if (math.isfinite(p) and p < ALPHA) else not_held
            return (f"difference {fmt(d.mean)} ± {fmt(d.se)} (SE{corr}), one-sided p = {fmt(p)}{how}: {verdict_word}; "
                    f"{mdd_what} at 80% power ({lvl}): {fmt(min_detectable(d, self.level))}")

        outcome = "the claim holds" if self.holds else "the claim is not shown"
        return (f"- {versus} ({'paired' if self.pair.paired else 'unpaired'}, {self.n} seeds): "
                f"{nums[0]} ({part(self.d_reward, self.p_similar, 'similar (within the margin)', 'similar not shown', 'smallest margin showable')}); "
                f"{nums[1]} ({part(self.d_kl, self.p_kl, 'lower', 'lower not shown', 'smallest KL gap detectable')}); "
                f"{nums[2]} ({part(self.d_rc, self.p_rc, 'higher', 'higher not shown', 'smallest r_c gap detectable')}); "
                f"{ratio}. Claim p = {fmt(self.p_claim)}; power to show the paper's effect (KL halved to "
                f"{fmt(self.base['kl'].mean / PAPER_KL_RATIO)}, reward equal): {pct(self.power_claim)} "
                f"(KL test {pct(self.power_kl)}, similar-reward test {pct(self.power_similar)}) — {outcome}.")


def _not_compared(name: str) -> str:
    return f"- {name}: task_reward, kl or combined_reward missing, not compared."


def common_end(series: list[tuple[Group, str]]) -> int | None:
    """The last iteration that every (group, agent) logged for all compared metrics: runs cut off at different
    iterations are compared over the iterations all of them reached."""
    ends = [c.steps[-1] for g, a in series for m in COMPARED
            for c in [curve(g, a, m)] if c is not None and len(c.steps)]
    return int(min(ends)) if ends else None


def compare(base: Group, other: Group, upto: int | None | str = "auto",
            base_model: float | None = None) -> tuple[list[Comparison], list[str]]:
    """Each agent of ``other`` against ``base``'s first agent, over the iterations up to ``upto`` ("auto": the
    last one all of them reached), Holm-corrected over the agents; returns (comparisons, names lacking metrics).
    With ``base_model`` (the base model's held-out reward) and a held-out evaluation of every final model, "similar
    reward" compares those evaluations; KL and r_c stay the training window's."""
    base_agent = base.agents[0] if base.agents else POLICY
    if upto == "auto":
        upto = common_end([(base, base_agent)] + [(other, a) for a in other.agents])
    ref = {m: final_value(base, base_agent, m, upto=upto) for m in COMPARED}
    if any(f is None for f in ref.values()):
        return [], [base.name(base_agent)]
    pair = pairing(base, other)
    heldout = {a: heldout_final(other, a) for a in other.agents}
    base_heldout = heldout_final(base, base_agent)
    held = base_heldout is not None and base_model is not None and all(f is not None for f in heldout.values())
    if held:  # "similar reward": the final models on held-out prompts, against the base model's start
        ref["task_reward"] = base_heldout
        margin = Margin(base_model, base_heldout.mean, 0, REWARD_RANGES.get(_scored_reward(base)), heldout=True)
    else:
        margin = margin_of(base, base_agent, ref["task_reward"])
    out, missing = [], []
    for agent in other.agents:
        fin = {m: final_value(other, agent, m, upto=upto) for m in COMPARED}
        if held:
            fin["task_reward"] = heldout[agent]
        if any(f is None for f in fin.values()):
            missing.append(other.name(agent))
        else:
            out.append(Comparison(agent, other.name(agent), base.name(base_agent), fin, ref, pair, margin))
    decide(out)
    return out, missing


def decide(comps: list[Comparison]) -> None:
    """The agents' claims as one family: Holm over their intersection-union p-values sets ``holds``."""
    for c in comps:
        c.m = len(comps)
    judged = [c for c in comps if c.judged]
    for c, held in zip(judged, holm([c.p_claim for c in judged])):
        c.holds = held


def _trend_line(series: list[tuple[Group, str]], steps: tuple[int, int]) -> str | None:
    parts = []
    for g, agent in series:
        slopes = trend(g, agent, "kl", steps)
        if slopes is None:
            continue
        sd = f" ± {fmt(slopes.std(ddof=1))}" if len(slopes) >= 2 else ""
        parts.append(f"{g.name(agent)} {'+' if slopes.mean() >= 0 else ''}{fmt(slopes.mean())}{sd}")
    if not parts:
        return None
    return (f"- KL trend over the window (each seed's least-squares slope over iterations {steps[0]}–{steps[1]}, "
            f"nats per iteration, mean ± std over seeds): {', '.join(parts)}. A slope well above 0 means the KL was "
            "still rising, so the final values depend on where the window ends.")


VERDICT_RULE = (
    "Does CORY reach similar task reward at lower KL than PPO, as the paper claims (arXiv 2410.06101, Fig. 3)? "
    f"The rule (fixed before the numbers): a seed's _final value_ is its mean over the last {LAST_N} iterations up to "
    "the last iteration every compared run reached (the window is named below, with each seed's KL slope over it). "
    "Each CORY agent (LLM1, LLM2) is compared with PPO by t-tests over the per-seed final values: _paired_ by seed "
    "when PPO's and CORY's runs of every seed shared their prompts and the seed's stream of answer lengths (checked: "
    "identical iteration-0 task reward and answer length; CORY takes two lengths from that stream per iteration, "
    "PPO one, so after iteration 0 the prompts stay shared and the lengths do not), so that seed-to-seed luck "
    "cancels; otherwise _unpaired_ (Welch), "
    "and the report says why. Where every compared run's final model was evaluated on held-out prompts, its task "
    "reward there is the reward the tests read (the base model's held-out reward is then the start of PPO's gain); "
    "KL and r_c stay the training window's. The claim for one agent is _similar task reward at lower KL_: "
    f"_lower KL_ is a one-sided test of CORY's KL < PPO's; _similar task reward_ is a non-inferiority test: CORY's "
    f"reward is shown to be above PPO's minus a margin of {MARGIN_SHARE:g} × PPO's reward gain (PPO's seed-mean final "
    "reward minus its seed-mean reward at the first iteration), and at least "
    f"{MARGIN_RANGE_SHARE:g} × the width of the reward's range where it is known (VADER [-1, 1]: "
    f"{MARGIN_RANGE_SHARE * 2:g}; 0/1 correctness: {MARGIN_RANGE_SHARE:g}), so more "
    "seeds make this test sharper, not stricter. The claim holds when both tests do (an intersection–union test: its "
    "p is the larger of the two). The agents' claims form one family, corrected by Holm's method at "
    f"α = {ALPHA:g}: _yes_: the claim holds for every agent; _partly_: for some agent (with no true effect, "
    f"_partly_ or _yes_ fires at most {ALPHA:.0%} of the time); otherwise the answer is a negative, and its "
    "_power_ decides how it reads. Power is the chance to show the paper's own effect (PPO's final KL twice the "
    "agent's, task reward equal) with the observed spread, at Holm's strictest level α/m, the KL and the "
    "similar-reward test taken as independent; a verdict's power is the smallest of its agents'. "
    f"_no (power N%)_ needs N ≥ {POWER_TARGET:.0%}; below it the answer is _could not tell (power N%)_. Each "
    "comparison also gives the smallest difference it would detect at 80% power. r_c (task reward − η·KL) and the "
    f"KL ratio (PPO's final KL over the agent's; the paper reports > {PAPER_KL_RATIO:g}) are shown, not part of the "
    "claim (r_c nearly repeats the KL test at a fixed η). With no spread over seeds a test is decided by the sign "
    f"of the difference and marked so. _too few seeds_: a method has fewer than {MIN_SEEDS} seeds (numbers shown, no "
    "verdict); _not decided_: metrics are missing.")


@dataclass
class Verdict:
    answer: str  # "yes" | "partly" | "no" | "could not tell" | "too few seeds" | "not decided"
    text: str
    power: float = float("nan")


def negative_answer(power_: float) -> str:
    return "no" if math.isfinite(power_) and power_ >= POWER_TARGET else "could not tell"


NOT_LEARNED = "not tested (PPO did not learn)"


def verdict(exp: Experiment) -> Verdict:
    """First whether the baseline learned (``LEARNING_RULE``); only then, did the CORY agents reach similar task
    reward at lower KL than PPO (``VERDICT_RULE``)?"""
    ppo, cory = exp.main_group("ppo"), exp.main_group("cory")
    if ppo is None or cory is None:
        missing = " and ".join(m for m, g in (("ppo", ppo), ("cory", cory)) if g is None)
        return Verdict("not decided", f"No finished comparison: no {missing} runs with metrics.")
    for g in (ppo, cory):
        if lost := g.without_config():
            paths = ", ".join(f"`{g.runs[s].path.parent.name}/{g.runs[s].path.name}/config.yaml`" for s in lost)
            return Verdict("not decided", f"**not decided** — {paths} is missing or unreadable, so whether "
                           f"{'that run was' if len(lost) == 1 else 'those runs were'} made with the same settings "
                           "as the others cannot be told: put it back, or move the run to a folder of its own.")
        if differ := g.differing_settings():
            return Verdict("not decided", f"**not decided** — {g.name(g.agents[0]).split('-')[0]}'s runs were made "
                           f"with different settings ({differ}): a comparison pools only runs of the same settings; "
                           "move the odd runs to a folder of their own.")
    learning = baseline_learned(exp, ppo)
    if learning.learned is False:
        return Verdict(NOT_LEARNED, f"**{NOT_LEARNED}** — {learning.text.split(' — ', 1)[1]} So the comparison "
                       "below tests nothing: the final values are shown for the record, and none of their "
                       "differences is a finding.")
    v = _claim(exp, ppo, cory)
    return Verdict(v.answer, f"{learning.text}\n\n{v.text}", v.power)


def _claim(exp: Experiment, ppo: Group, cory: Group) -> Verdict:
    """The paper's claim, tested once the baseline learned."""
    series = [(ppo, POLICY)] + [(cory, a) for a in cory.agents]
    upto = common_end(series)
    if any(final_value(ppo, POLICY, m, upto=upto) is None for m in COMPARED):
        return Verdict("not decided", "PPO's runs lack task_reward, kl or combined_reward metrics.")
    comps, missing = compare(ppo, cory, upto, heldout_value(exp.base_evaluation()))
    lines = [c.line() for c in comps] + [_not_compared(name) for name in missing]
    if not comps:
        return Verdict("not decided", "CORY's runs lack the metrics to compare.\n" + "\n".join(lines))
    base = comps[0].base
    n_ppo, n_cory = base["task_reward"].n, min(min(f.n for f in c.fin.values()) for c in comps)
    held = [c for c in comps if c.holds]
    pw = min((c.power_claim for c in comps), key=lambda p: p if math.isfinite(p) else -1.0)
    pw_text = f"power to show the paper's effect {pct(pw)}"
    if min(n_ppo, n_cory) < MIN_SEEDS:
        answer, label = "too few seeds", "too few seeds"
        summary = (f"No verdict: the test needs at least {MIN_SEEDS} seeds per method (PPO has {n_ppo}, CORY "
                   f"{n_cory}). The numbers follow without a judgement.")
    elif len(held) == len(comps) and not missing:
        answer, label = "yes", f"yes ({pw_text})"
        summary = ("Every CORY agent reached a task reward shown within the margin of PPO's at lower KL "
                   f"(Holm-corrected, family-wise α = {ALPHA:g}), as the paper claims.")
    elif held:
        others = [c.name for c in comps if not c.holds] + missing
        answer, label = "partly", f"partly ({pw_text})"
        summary = (f"Only {' and '.join(c.name for c in held)} showed similar task reward at lower KL"
                   + (f"; {' and '.join(others)} did not" if others else "") + " (Holm-corrected, family-wise "
                   f"α = {ALPHA:g}; see below).")
    else:
        answer = negative_answer(pw)
        label = f"{answer} (power {pct(pw)})"
        summary = "No CORY agent showed similar task reward at lower KL"
        if answer == "no":
            summary += (f", and the design had {pct(pw)} power to show the paper's effect: the claim is not "
                        "reproduced here.")
        else:
            summary += (f", but with this spread and these seeds the design had only {pct(pw)} power to show the "
                        f"paper's effect (it needs {POWER_TARGET:.0%}): this is no evidence against the claim.")
    first, end = base["kl"].steps
    where = f" at η={fmt(cory.kl_coef)}" if cory.kl_coef is not None else ""
    head = (f"**{label}** — {summary} Final values{where}: each seed's mean over iterations {first}–{end}, "
            f"then mean ± std over seeds (PPO {n_ppo} seed{'s' * (n_ppo != 1)}, "
            f"CORY {n_cory} seed{'s' * (n_cory != 1)})"
            + ("; task reward: each final model's held-out reward (the base model's is the start)"
               if comps[0].margin is not None and comps[0].margin.heldout else "")
            + f"; tests {comps[0].pair.why}; similar-reward "
            f"{comps[0].margin.text('PPO') if comps[0].margin else 'margin: n/a'}.")
    if any(c is not None and len(c.steps) and c.steps[-1] > end
           for g, a in series for c in [curve(g, a, "task_reward")]):
        head += (f" The runs did not all reach the same iteration: they are compared up to iteration {end}, "
                 "the last one all of them logged.")
    tr = _trend_line(series, (first, end))
    if tr:
        lines.append(tr)
    kl = curve(ppo, POLICY, "kl")
    if kl is not None and len(kl.steps) >= 2:
        k = min(LAST_N, len(kl.steps) // 2) or 1
        lines.append(f"- For scale: PPO's KL went from {fmt(kl.mean[:k].mean())} (first {k} iterations) "
                     f"to {fmt(kl.mean[-k:].mean())} (last {k}).")
    extra = confound_lines(exp, ppo, cory)
    return Verdict(answer, head + "\n\n" + "\n".join(lines) + ("\n\n" + extra if extra else ""), pw)


def confound_lines(exp: Experiment, ppo: Group, cory: Group) -> str:
    """The same test against the two confounds, when their runs exist: CORY vs PPO with CORY's score normalisation
    (``ppo_norm``), and CORY as the authors' code runs it (``cory_authors``) vs PPO. Not part of the answer."""
    parts = []
    norm, authors, cory_norm = exp.main_group("ppo_norm"), exp.main_group("cory_authors"), exp.main_group("cory_norm")

    def setting(g: Group, key: str) -> str:
        v = g.config_value(key)
        return "?" if v is None else (fmt(v) if isinstance(v, float) else str(v).lower())

    pairs = []
    if norm is not None:
        pairs.append((f"CORY vs PPO with score normalisation (`ppo_norm`; score_norm: {norm.label} "
                      f"{setting(norm, 'score_norm')}, {cory.label} {setting(cory, 'score_norm')})", norm, cory))
    if cory_norm is not None:
        pairs.append(("CORY with score normalisation (`cory_norm`, as the authors run it; score_norm "
                      f"{setting(cory_norm, 'score_norm')}) vs PPO (score_norm {setting(ppo, 'score_norm')})",
                      ppo, cory_norm))
    if authors is not None:
        pairs.append(("CORY with the authors' resets (`cory_authors`: Adam, the KL controller and the score statistics "
                      f"reset at each role exchange; reset_on_swap {setting(authors, 'reset_on_swap')}, η from "
                      f"{fmt(authors.eta)}) vs PPO (η from {fmt(ppo.eta)})", ppo, authors))
    for title, base, other in pairs:
        comps, missing = compare(base, other)
        if comps:
            first, end = comps[0].base["kl"].steps
            title += f", iterations {first}–{end}, {comps[0].pair.why}"
            if comps[0].margin:
                title += f"; {comps[0].margin.text(comps[0].base_name)}"
        parts.append(f"{title}:\n\n" + "\n".join([c.line() for c in comps] + [_not_compared(n) for n in missing]))
    return ("Confounds, same test (not part of the answer above):\n\n" + "\n\n".join(parts)) if parts else ""


# ----------------------------------------------------------------------------- ablations

ABLATIONS = (("cory_no_kt", "cory"), ("cory_no_swap", "cory"), ("ppo_2x", "ppo"))


def ablation_lines(exp: Experiment) -> str:
    """Each ablation against the method it ablates, agent by agent (LLM1 with LLM1): two-sided tests, paired when the
    seeds shared their draws, Holm-corrected per ablation; descriptive (the paper's Fig. 6 states directions)."""
    parts = []
    for method, of in ABLATIONS:
        abl, ref = exp.groups.get(method), exp.main_group(of)
        if abl is None or ref is None:
            continue
        pair = pairing(ref, abl)
        agents = [a for a in abl.agents if a in ref.agents]
        upto = common_end([(ref, a) for a in agents] + [(abl, a) for a in agents])
        tests = []
        for agent in agents:
            for metric in ("task_reward", "kl"):
                a, b = final_value(abl, agent, metric, upto=upto), final_value(ref, agent, metric, upto=upto)
                if a is None or b is None or min(a.n, b.n) < MIN_SEEDS:
                    continue
                d = difference(a, b, pair.paired)
                tests.append((agent, metric, a, b, d, p_two_sided(d)))
        if not tests:
            continue
        ps = [t[5] for t in tests]
        m = len(tests)
        window = tests[0][2].steps
        lines = []
        for (agent, metric, a, b, d, p), rej, pa in zip(tests, holm(ps), holm_adjusted(ps)):
            what = "task reward" if metric == "task_reward" else "KL"
            corr = f", seed correlation {fmt(d.corr, 2)}" if d.paired and math.isfinite(d.corr) else ""
            lines.append(f"- {abl.name(agent)} vs {ref.name(agent)}, {what}: {fmt_final(a)} vs {fmt_final(b)}; "
                         f"difference {fmt(d.mean)} ± {fmt(d.se)} (SE{corr}), two-sided p = {fmt(p)}, Holm-adjusted "
                         f"over the {m} tests {fmt(pa)}: {'beyond noise' if rej else 'not beyond noise'}; smallest "
                         f"difference detectable at 80% power (α/{m}/2 each side): {fmt(min_detectable(d, ALPHA / m / 2))}.")
        parts.append(f"{abl.name(eta=False)} vs {ref.name(eta=False)}, iterations "
                     f"{window[0]}–{window[1]}, {pair.why}:\n\n" + "\n".join(lines))
    return ("Ablations against the method they ablate, agent by agent (two-sided tests, Holm-corrected over each "
            f"ablation's tests at α = {ALPHA:g}; not part of the answer):\n\n" + "\n\n".join(parts)) if parts else ""
