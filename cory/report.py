"""Plots and REPORT.md for an experiment folder written by ``python -m cory.experiments``.

    python -m cory.report results/NAME

The folder holds ``runs/<method>[_kl<eta>]/seed_<s>/{metrics.jsonl,samples.jsonl,config.yaml}`` and,
when the runner made it, ``runs.json`` (what was run, by which command, at which commit, how long).
Everything in REPORT.md is computed from those files, so a fresh clone rebuilds the same report.

Conventions, stated again in the report itself:
* curves are aligned by ``step``; the mean and the band use only the steps that every seed of a method
  logged with a finite value;
* std is the sample standard deviation over seeds (ddof=1), absent with one seed;
* a "final" value is a seed's mean over the last 10 aligned iterations (all of them if fewer), then
  mean +- std of that over seeds;
* the verdict (``VERDICT_RULE``) compares each CORY agent with PPO by one-sided Welch's t-tests over the
  per-seed final values at alpha 0.05: "yes" only when both agents show lower KL and higher r_c with a task
  reward not shown to be lower; no verdict with fewer than 3 seeds per method. The confounds ``ppo_norm`` and
  ``cory_authors`` get the same test on extra lines and their own figures, beside PPO and CORY.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from cory.results import (ABLATION_METHODS, AGENT_NAMES, CONFOUND_METHODS, LAST_N, MAIN_METHODS, METHOD_NAMES,
                          Experiment, Final, Group, ReportError, curve, final_value, finite, fmt, fmt_final,
                          load_experiment, read_jsonl, setting_name, sweep_points)

ALPHA = 0.05     # the verdict's one-sided Welch's t-tests
MIN_SEEDS = 3    # fewer seeds per method: the numbers are shown, no verdict
COMPARED = ("task_reward", "kl", "combined_reward")
# (key in metrics.jsonl after "<agent>/", figure file stem, title, y-axis label)
METRICS = {
    "task_reward": ("task reward", "task reward ({reward}), batch mean"),
    "kl": ("KL to the reference model", "KL(π‖π₀), nats per response (sum over tokens)"),
    "combined_reward": ("combined reward r_c", "r_c = task reward − η·KL"),
    "response_length": ("response length", "response length (tokens)"),
}
MAIN_FIGURE_METRICS = ("task_reward", "kl", "combined_reward", "response_length")
REWARD_UNITS = {
    "vader": "VADER compound score, −1…1",
    "distilbert-imdb": "distilbert-imdb positive logit",
    "correctness": "fraction of correct answers",
}
# one colour per method in every figure; an agent is told apart by the line style (LLM2 dashed)
PALETTE = {
    "ppo": "#d62728",
    "cory": "#1f77b4",
    "cory_no_kt": "#2ca02c",
    "cory_no_swap": "#9467bd",
    "ppo_2x": "#ff7f0e",
    "ppo_norm": "#8c564b",
    "cory_authors": "#17becf",
}
_SPARE_COLOURS = ("#e377c2", "#7f7f7f", "#bcbd22", "#843c39", "#5254a3")
LINESTYLES = {"policy": "-", "llm1": "-", "llm2": "--"}


def colour(method: str) -> str:
    if method in PALETTE:
        return PALETTE[method]
    # stable across runs and figures: derived from the name, not from the order of appearance
    return _SPARE_COLOURS[sum(map(ord, method)) % len(_SPARE_COLOURS)]


# ----------------------------------------------------------------------------- verdict

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


# ----------------------------------------------------------------------------- figures

def _axes(title: str, xlabel: str, ylabel: str, size=(7.5, 4.6)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=120, layout="constrained")
    FigureCanvasAgg(fig)  # Agg, without touching pyplot's global backend
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=9)
    return fig, ax


def _reward_unit(exp: Experiment) -> str:
    name = exp.any_config("reward_model")
    return REWARD_UNITS.get(name, str(name) if name else "task's reward")



def plot_metric(exp: Experiment, path: Path, metric: str, series: list[tuple[Group, str]],
                refs: list[tuple[Group, str]] = (), title: str = "") -> list[str]:
    """One figure: mean line and ±std band per (group, agent); ``refs`` as thin lines without band.
    Returns notes on alignment (seeds of different lengths, missing seeds)."""
    head, ylabel = METRICS[metric]
    fig, ax = _axes(f"{setting_name(exp)}: {title or head} per iteration (mean ± std over seeds)",
                    "iteration", ylabel.format(reward=_reward_unit(exp)))
    notes = []
    drawn = 0
    for (group, agent), is_ref in [(s, False) for s in series] + [(r, True) for r in refs]:
        c = curve(group, agent, metric)
        if c is None or not len(c.steps):
            if not is_ref:
                notes.append(f"{group.name(agent)}: no `{agent}/{metric}` values.")
            continue
        n = len(c.seeds)
        label = f"{group.name(agent)} ({n} seed{'s' * (n != 1)})" + (" [reference]" if is_ref else "")
        ax.plot(c.steps, c.mean, color=colour(group.method), linestyle=LINESTYLES.get(agent, "-"),
                linewidth=1.0 if is_ref else 1.8, alpha=0.55 if is_ref else 1.0, label=label)
        if not is_ref and n >= 2:
            ax.fill_between(c.steps, c.mean - c.std, c.mean + c.std, color=colour(group.method),
                            alpha=0.12 if agent == "llm2" else 0.2, linewidth=0)
        drawn += 1
        if not is_ref and c.trimmed:
            lengths = ", ".join(f"seed {s}: {k}" for s, k in c.lengths.items())
            notes.append(f"{group.name(agent)} {metric}: seeds logged different steps ({lengths}); the curve "
                         f"and the final value use the {len(c.steps)} steps present in all of them.")
        if not is_ref and c.missing_seeds:
            notes.append(f"{group.name(agent)} {metric}: seed(s) {c.missing_seeds} have no values and are left out.")
    if drawn:
        ax.legend(fontsize=8, loc="best")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.savefig(path)
    return notes



def plot_sweep(exp: Experiment, path: Path, points) -> None:
    fig, ax = _axes(f"{setting_name(exp)}: final task reward vs final KL over the KL coefficient η",
                    "final KL(π‖π₀), nats per response", f"final task reward ({_reward_unit(exp)})")
    kls = []
    for (method, agent), pts in sorted(points.items()):
        x = np.array([p[2].mean for p in pts])
        y = np.array([p[1].mean for p in pts])
        xerr = np.array([p[2].std if p[2].n >= 2 else 0.0 for p in pts])
        yerr = np.array([p[1].std if p[1].n >= 2 else 0.0 for p in pts])
        name = METHOD_NAMES.get(method, method) + AGENT_NAMES.get(agent, f"-{agent}")
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, color=colour(method), linestyle=LINESTYLES.get(agent, "-"),
                    marker="o", markersize=4, capsize=2, linewidth=1.5, label=name)
        for (eta, _, _), xi, yi in zip(pts, x, y):
            ax.annotate(f"η={eta:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=colour(method))
        kls += list(x)
    positive = [k for k in kls if k > 0]
    if positive and len(positive) == len(kls) and max(positive) / min(positive) > 50:
        ax.set_xscale("log")
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path)


# ----------------------------------------------------------------------------- markdown

def _md_cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _ordered_groups(exp: Experiment) -> list[Group]:
    order = {m: i for i, m in enumerate(MAIN_METHODS + CONFOUND_METHODS + ABLATION_METHODS)}
    return sorted(exp.groups.values(),
                  key=lambda g: (g.kl_coef is not None, order.get(g.method, len(order)), g.method, g.kl_coef or 0))


def final_table(exp: Experiment) -> str:
    rows = []
    for g in _ordered_groups(exp):
        for agent in g.agents:
            fins = {m: final_value(g, agent, m) for m in ("task_reward", "kl", "combined_reward", "response_length")}
            some = next((f for f in fins.values() if f is not None), None)
            window = f"{some.steps[0]}–{some.steps[1]}" if some else "–"
            rows.append([g.name(agent), fmt(g.eta) if g.eta is not None else "?", some.n if some else 0,
                         window] + [fmt_final(f) for f in fins.values()])
    if not rows:
        return "_No metrics yet._"
    return _table(["method / agent", "η (start)", "seeds", "iterations averaged", "task reward", "KL",
                   "r_c", "response length (tokens)"], rows)


def _one_line(text) -> str:
    return str(text).replace("```", "'''").replace("\n", " ⏎ ")


def samples_section(exp: Experiment, per_step: int = 3) -> str:
    parts = []
    for g in _ordered_groups(exp):
        if g.kl_coef is not None:
            continue  # the sweep would multiply the samples; its numbers are in the table
        seed = min(g.runs)
        rows, _ = read_jsonl(g.runs[seed].path / "samples.jsonl")
        rows = [r for r in rows if isinstance(r.get("step"), int)]
        if not rows:
            parts.append(f"**{METHOD_NAMES.get(g.method, g.method)}** (seed {seed}): no samples.jsonl.")
            continue
        first, last = min(r["step"] for r in rows), max(r["step"] for r in rows)
        lines = []
        for step in sorted({first, last}):
            lines.append(f"iteration {step}:")
            for r in [r for r in rows if r["step"] == step][:per_step]:
                if "response" in r:
                    lines.append(f"  [r={_reward(r.get('reward'))}] {_one_line(r.get('query', ''))} ⟶ "
                                 f"{_one_line(r['response'])}")
                else:
                    pio = r.get("pioneer", "pioneer")
                    obs = {"llm1": "llm2", "llm2": "llm1"}.get(pio, "observer")
                    lines.append(f"  [{pio.upper()} pioneer r={_reward(r.get('pioneer_reward'))}] "
                                 f"{_one_line(r.get('query', ''))} ⟶ {_one_line(r.get('pioneer_response', ''))}")
                    lines.append(f"  [{obs.upper()} observer r={_reward(r.get('observer_reward'))}] "
                                 f"{_one_line(r.get('query', ''))} ⟶ {_one_line(r.get('observer_response', ''))}")
        parts.append(f"**{METHOD_NAMES.get(g.method, g.method)}** (seed {seed}, first and last iteration):\n\n"
                     "```text\n" + "\n".join(lines) + "\n```")
    return "\n\n".join(parts) if parts else "_No samples._"


def _reward(x) -> str:
    x = finite(x)
    return "n/a" if x is None else f"{x:+.3f}"


def _duration(seconds) -> str:
    if seconds is None:
        return "?"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


SETTING_FIELDS = ("model_name", "reward_model", "dataset", "steps", "batch_size", "mini_batch_size",
                  "ppo_epochs", "learning_rate", "init_kl_coef", "adap_kl_ctrl", "score_norm", "use_peft",
                  "response_length_min", "response_length_max", "swap_period", "knowledge_transfer",
                  "other_reward_coef", "reset_on_swap")


def provenance_section(exp: Experiment) -> str:
    rj = exp.runs_json
    out = []
    invocations = rj.get("invocations") or []
    if invocations:
        out.append("Commands (in order; each skips the runs already finished):\n")
        for inv in invocations:
            commit = inv.get("git_commit") or "unknown"
            dirty = " (with uncommitted changes)" if inv.get("git_dirty") else ""
            out.append(f"- `{inv.get('command', '?')}` — started {inv.get('started', '?')}, git commit "
                       f"`{commit}`{dirty}; ran {inv.get('ran', '?')}, skipped {inv.get('skipped', '?')}, "
                       f"failed {inv.get('failed', '?')}")
        out.append("")
    else:
        out.append("_No runs.json: the commands, commit and wall times are unknown; the settings below come "
                   "from each run's config.yaml._\n")
    if rj.get("preset") or rj.get("task"):
        out.append(f"Task `{rj.get('task', '?')}`, preset `{rj.get('preset', '?')}` "
                   f"(`configs/{rj.get('task', '<task>')}/<ppo|cory>_{rj.get('preset', '<preset>')}.yaml`).\n")
    runs = rj.get("runs") or {}
    rows = []
    for g in _ordered_groups(exp):
        wall, per_it = 0.0, []
        for seed, run in g.runs.items():
            rec = runs.get(f"{g.label}/seed_{seed}", {})
            wall += sum(a.get("wall_time_s") or 0 for a in rec.get("attempts", []))
            per_it += [v for v in (finite(r.get("time/iteration_s")) for r in run.rows) if v is not None]
        script = next((r.get("script") for k, r in runs.items() if k.startswith(g.label + "/")), None)
        rows.append([g.label, script or "?", ", ".join(map(str, sorted(g.runs))),
                     _duration(wall) if wall else "?", f"{np.mean(per_it):.1f} s" if per_it else "?"])
    if rows:
        out.append(_table(["run group", "script", "seeds", "wall time (all seeds)", "time per iteration"], rows))
        out.append("")
    groups = _ordered_groups(exp)
    if groups:
        cfg_rows = []
        for key in SETTING_FIELDS:
            values = [g.config_value(key) for g in groups]
            if all(v is None for v in values):
                continue
            cfg_rows.append([key] + [fmt(v) if isinstance(v, float) else ("–" if v is None else v) for v in values])
        if cfg_rows:
            out.append("Settings, from each run's config.yaml (– = not a field of that method):\n")
            out.append(_table(["field", *(g.label for g in groups)], cfg_rows))
            out.append("")
    if runs:
        lines = []
        for key, rec in sorted(runs.items()):
            for a in rec.get("attempts", []):
                status = a.get("exit_status")
                status = "cut off (no exit status)" if status is None else f"exit {status}"
                lines.append(f"{key}: [{a.get('mode', '?')}, {status}, {_duration(a.get('wall_time_s'))}] "
                             f"{a.get('command', '?')}")
        if lines:
            out.append("<details><summary>Every training command run</summary>\n\n```text\n"
                       + "\n".join(lines) + "\n```\n</details>\n")
    return "\n".join(out)


# ----------------------------------------------------------------------------- the report

def build_report(path: str | Path) -> Path:
    """Write the figures and REPORT.md into ``path``; returns REPORT.md's path."""
    exp = load_experiment(path)
    root = exp.path
    notes = list(exp.notes)
    figures: list[tuple[str, str]] = []

    main = [(exp.main_group(m), a) for m in MAIN_METHODS if exp.main_group(m) is not None
            for a in exp.main_group(m).agents]
    if exp.main_eta is not None:
        notes.append(f"No runs at the preset's KL coefficient: the main figures use η={exp.main_eta:g}, the largest "
                     "coefficient of the sweep that PPO and CORY share.")
    if main:
        for metric in MAIN_FIGURE_METRICS:
            name = f"fig_{metric}.png"
            notes += plot_metric(exp, root / name, metric, main)
            figures.append((name, f"{METRICS[metric][0]}: PPO vs CORY (paper Fig. 3)"))
    confounds = [(g, a) for m in CONFOUND_METHODS for g in [exp.main_group(m)] if g is not None for a in g.agents]
    if confounds:
        for metric in ("task_reward", "kl", "combined_reward"):
            name = f"fig_confounds_{metric}.png"
            notes += plot_metric(exp, root / name, metric, confounds, refs=main,
                                 title=f"confounds, {METRICS[metric][0]}")
            figures.append((name, f"{METRICS[metric][0]}: confounds, PPO with score normalisation and CORY with "
                                  "the authors' resets, PPO and CORY as thin reference lines"))
    ablations = [(g, a) for m in ABLATION_METHODS for g in [exp.groups.get(m)] if g is not None for a in g.agents]
    if ablations:
        for metric in ("task_reward", "kl", "combined_reward"):
            name = f"fig_ablation_{metric}.png"
            notes += plot_metric(exp, root / name, metric, ablations, refs=main,
                                 title=f"ablations, {METRICS[metric][0]}")
            figures.append((name, f"{METRICS[metric][0]}: ablations (paper Fig. 6)"))
    points = sweep_points(exp)
    if points:
        plot_sweep(exp, root / "fig_kl_sweep.png", points)
        figures.append(("fig_kl_sweep.png", "final task reward vs final KL over η (paper Fig. 2c)"))

    for g in _ordered_groups(exp):
        if g.eta_mismatch:
            notes.append(f"`{g.label}`: its runs started from init_kl_coef {fmt(g.config_eta)}, not the folder's "
                         f"η={fmt(g.kl_coef)} (the method sets it itself); it is left out of the η sweep.")
    failed = [k for k, r in (exp.runs_json.get("runs") or {}).items() if r.get("status") == "failed"]
    if failed:
        notes.append(f"Failed runs (their partial metrics, if any, are included): {', '.join(sorted(failed))}.")

    v = verdict(exp)
    md = [f"# CORY vs PPO: {setting_name(exp)}", "",
          "Generated by `python -m cory.report " + _rel(root) + "` from the metrics in this folder; "
          "rerun it to rebuild this file and the figures.", "",
          "## Verdict", "",
          VERDICT_RULE, "",
          v.text, "", "## Figures", ""]
    md += [f"![{cap}]({name})\n\n_{name}: {cap}._\n" for name, cap in figures] or ["_No figures: no metrics yet._\n"]
    md += ["## Final values", "",
           f"Each seed's mean over its last {LAST_N} aligned iterations (all of them if fewer), then mean ± "
           "sample std (ddof=1) over seeds. KL is the full-vocabulary KL(π‖π₀) summed over response tokens "
           "(nats); r_c = task reward − η·KL with the η in force at that iteration.", "",
           final_table(exp), "",
           "## Samples", "",
           "A few queries and answers from the first and the last iteration (lowest seed); a collapsed policy "
           "shows here as repeated or degenerate text. r is the task reward of that answer.", "",
           samples_section(exp), "",
           "## What was run", "", provenance_section(exp), "",
           "## Notes", "",
           "- Curves are aligned by iteration; the mean, the band and the final values of a method use only the "
           "iterations that every one of its seeds logged with a finite value.",
           "- Shaded bands are ± one sample std over seeds (none with a single seed). CORY's LLM2 is drawn "
           "dashed, in its method's colour."]
    md += [f"- {n}" for n in notes]
    report = root / "REPORT.md"
    report.write_text("\n".join(md).rstrip() + "\n")
    return report


def _rel(path: Path) -> str:
    """The folder as seen from the repository root (stable, unlike the caller's working directory)."""
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv) or len(argv) != 1:
        usage = "usage: python -m cory.report RESULTS_DIR   (writes REPORT.md and fig_*.png into RESULTS_DIR)"
        if any(a in ("-h", "--help") for a in argv):
            print(usage)
            raise SystemExit(0)
        print(f"error: expected one results folder, got {len(argv)} arguments; {usage}", file=sys.stderr)
        raise SystemExit(2)
    try:
        report = build_report(argv[0])
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    print(f"report: {report}")


if __name__ == "__main__":
    main()
