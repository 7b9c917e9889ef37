"""The η frontier's verdict (paper Fig. 2c): does CORY's final task reward against final KL lie above PPO's over
the KL coefficients both ran? ``FRONTIER_RULE`` is printed in REPORT.md before the numbers."""
from __future__ import annotations

import math
from dataclasses import dataclass

from cory.lab.results import POLICY, Experiment, Final, Group, final_value, fmt, fmt_final
from cory.lab.stats import ALPHA, POWER_TARGET, Diff, difference, holm, min_detectable, p_value, pct, power
from cory.lab.verdict import MIN_SEEDS, PAPER_KL_RATIO, Pairing, common_end, negative_answer, pairing

FRONTIER_RULE = (
    "Does CORY's frontier of final task reward against final KL lie above PPO's (paper Fig. 2c)? The test: at each "
    "starting KL coefficient η that both methods ran, a point's score is its _reward at that η_, final task reward − "
    "η·final KL (per seed, over the same window as above, with the starting η for both methods, so the adaptive "
    "controller's drift does not enter). A higher score at the same η is a point above the line of slope η through "
    "the other method's point, the trade-off that η prices; lying above at every η is what \"the frontier lies "
    "above\" means here. Each CORY agent is compared with PPO at each η by a one-sided t-test of a higher score "
    "(paired by seed when the runs shared their draws, as above), and all agent × η tests form one family, "
    f"Holm-corrected at α = {ALPHA:g}. _yes_: every test holds; _partly_: some do (at which η is listed); otherwise "
    "a negative, read by its power as above: the chance, at Holm's strictest level, to show the paper's effect "
    "(PPO's KL twice CORY's at equal reward, i.e. a score higher by η × half of PPO's KL), the smallest over the "
    f"tests; _no_ needs ≥ {POWER_TARGET:.0%}, else _could not tell (power N%)_.")


@dataclass
class FrontierTest:
    eta: float
    agent: str
    name: str
    ppo: Group
    cory: Group
    d: Diff
    base: Final     # PPO's scores at this η
    ppo_kl: float
    pair: Pairing
    m: int = 1
    holds: bool = False

    @property
    def p(self) -> float:
        return p_value(self.d, "greater")

    @property
    def power(self) -> float:
        return power(self.eta * self.ppo_kl * (1 - 1 / PAPER_KL_RATIO), self.d, ALPHA / self.m)


def _score(g: Group, agent: str, eta: float, upto: int | None) -> Final | None:
    r, kl = final_value(g, agent, "task_reward", upto=upto), final_value(g, agent, "kl", upto=upto)
    if r is None or kl is None or list(r.seeds) != list(kl.seeds):
        return None
    return Final(r.per_seed - eta * kl.per_seed, r.last, r.seeds, r.steps)


def frontier_groups(exp: Experiment, method: str) -> dict[float, Group]:
    """η -> the group of ``method`` that started from it: the sweep's folders (``<method>_kl<η>``) and the
    preset's own run at its η; a folder whose runs started from another η than its name is left out."""
    out = {g.kl_coef: g for g in exp.groups.values() if g.method == method and g.kl_coef is not None
           and not g.eta_mismatch and g.runs}
    g = exp.groups.get(method)
    if g is not None and g.runs and g.eta is not None:
        out.setdefault(g.eta, g)
    return out


@dataclass
class Frontier:
    answer: str
    text: str
    tests: list[FrontierTest]
    power: float = float("nan")


def frontier(exp: Experiment) -> Frontier | None:
    """The test of ``FRONTIER_RULE``; None when PPO and CORY share fewer than 2 values of η."""
    ppo_at, cory_at = frontier_groups(exp, "ppo"), frontier_groups(exp, "cory")
    etas = sorted(set(ppo_at) & set(cory_at))
    if len(etas) < 2:
        return None
    tests, lines, short = [], [], []
    for eta in etas:
        p, c = ppo_at[eta], cory_at[eta]
        upto = common_end([(p, POLICY)] + [(c, a) for a in c.agents])
        base = _score(p, POLICY, eta, upto)
        kl = final_value(p, POLICY, "kl", upto=upto)
        if base is None or kl is None:
            continue
        pair = pairing(p, c)
        for agent in c.agents:
            mine = _score(c, agent, eta, upto)
            if mine is None:
                continue
            if min(mine.n, base.n) < MIN_SEEDS:
                short.append(f"{c.name(agent)}: {min(mine.n, base.n)} seeds")
                continue
            tests.append(FrontierTest(eta, agent, c.name(agent), p, c, difference(mine, base, pair.paired), base,
                                      kl.mean, pair))
    if short and not tests:
        return Frontier("too few seeds", f"**too few seeds** — the test needs {MIN_SEEDS} seeds per method and η "
                                         f"({'; '.join(short)}).", [])
    if not tests:
        return Frontier("not decided", "**not decided** — task_reward or kl missing at the shared η values.", [])
    for t in tests:
        t.m = len(tests)
    for t, held in zip(tests, holm([t.p for t in tests])):
        t.holds = held
    pw = min((t.power for t in tests), key=lambda p: p if math.isfinite(p) else -1.0)
    held = [t for t in tests if t.holds]
    if short:
        answer, label = "too few seeds", "too few seeds"
        summary = f"Some η lack {MIN_SEEDS} seeds ({'; '.join(short)}); the tests below are shown without a verdict."
    elif len(held) == len(tests):
        answer, label = "yes", f"yes (power {pct(pw)})"
        summary = "At every η, every CORY agent's reward at that η was higher than PPO's."
    elif held:
        answer, label = "partly", f"partly (power {pct(pw)})"
        summary = "Higher at " + ", ".join(f"η={t.eta:g} ({t.name})" for t in held) + "; not shown elsewhere."
    else:
        answer = negative_answer(pw)
        label = f"{answer} (power {pct(pw)})"
        summary = ("No CORY agent's reward-at-η was shown higher than PPO's at any η"
                   + ("." if answer == "no" else f"; with {pct(pw)} power this is no evidence against the claim."))
    for t in tests:
        lines.append(f"- η={t.eta:g}, {t.name} vs PPO ({'paired' if t.pair.paired else 'unpaired'}, {t.d.n} seeds): "
                     f"score difference {fmt(t.d.mean)} ± {fmt(t.d.se)} (SE), one-sided p = {fmt(t.p)}: "
                     f"{'higher' if t.holds else 'higher not shown'} after Holm; power for the paper's effect "
                     f"(+{fmt(t.eta * t.ppo_kl * (1 - 1 / PAPER_KL_RATIO))}) {pct(t.power)}; smallest difference "
                     f"detectable at 80% power {fmt(min_detectable(t.d, ALPHA / t.m))}"
                     f"; PPO's score {fmt_final(t.base)}.")
    text = (f"**{label}** — {summary} {len(tests)} tests over η = {', '.join(f'{e:g}' for e in etas)}.\n\n"
            + "\n".join(lines))
    return Frontier(answer, text, tests, pw)
