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

import json
import math
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml

LAST_N = 10
ALPHA = 0.05     # the verdict's one-sided Welch's t-tests
MIN_SEEDS = 3    # fewer seeds per method: the numbers are shown, no verdict
COMPARED = ("task_reward", "kl", "combined_reward")
AGENT_NAMES = {"policy": "", "llm1": "-LLM1", "llm2": "-LLM2"}
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
METHOD_NAMES = {
    "ppo": "PPO",
    "cory": "CORY",
    "cory_no_kt": "CORY w/o knowledge transfer",
    "cory_no_swap": "CORY w/o role exchange",
    "ppo_2x": "PPO, 2x model",
    "ppo_norm": "PPO with score normalisation",
    "cory_authors": "CORY with the authors' resets",
}
MAIN_METHODS = ("ppo", "cory")
# the two differences between the authors' runs and a like-for-like comparison (see cory.experiments)
CONFOUND_METHODS = ("ppo_norm", "cory_authors")
ABLATION_METHODS = ("cory_no_kt", "cory_no_swap", "ppo_2x")
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
_LABEL = re.compile(r"^(?P<method>.+?)(?:_kl(?P<kl>[0-9.eE+-]+))?$")


class ReportError(Exception):
    """The folder is not an experiment folder; the message is one line."""


def colour(method: str) -> str:
    if method in PALETTE:
        return PALETTE[method]
    # stable across runs and figures: derived from the name, not from the order of appearance
    return _SPARE_COLOURS[sum(map(ord, method)) % len(_SPARE_COLOURS)]


def parse_label(label: str) -> tuple[str, float | None]:
    """``cory_kl0.01`` -> ("cory", 0.01); ``ppo`` -> ("ppo", None)."""
    m = _LABEL.match(label)
    if m and m.group("kl") is not None:
        try:
            return m.group("method"), float(m.group("kl"))
        except ValueError:
            pass
    return label, None


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Rows that parse (a kill can cut the last line), and how many lines did not."""
    rows, bad = [], 0
    if not path.is_file():
        return rows, bad
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


# ----------------------------------------------------------------------------- loading

@dataclass
class SeedRun:
    seed: int
    path: Path
    rows: list[dict]
    config: dict

    def series(self, agent: str, metric: str) -> dict[int, float]:
        """step -> finite value; the last row wins when a step appears twice."""
        out = {}
        key = f"{agent}/{metric}"
        for row in self.rows:
            step = row.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                continue
            value = _finite(row.get(key))
            if value is None:
                out.pop(step, None)
            else:
                out[step] = value
        return out

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.rows if isinstance(r.get("step"), int)]
        return max(steps) if steps else None


@dataclass
class Group:
    """All seeds of one method at one KL coefficient (one folder under runs/)."""

    label: str
    method: str
    kl_coef: float | None  # from the folder name (the eta sweep)
    runs: dict[int, SeedRun] = field(default_factory=dict)

    @property
    def agents(self) -> list[str]:
        keys = {k.split("/", 1)[0] for r in self.runs.values() for row in r.rows for k in row if "/" in k}
        if "llm1" in keys or "llm2" in keys:
            return [a for a in ("llm1", "llm2") if a in keys]
        return ["policy"] if "policy" in keys else []

    @property
    def config_eta(self) -> float | None:
        """``init_kl_coef`` from the runs' config.yaml, when all of them agree."""
        etas = {_finite(r.config.get("init_kl_coef")) for r in self.runs.values()} - {None}
        return etas.pop() if len(etas) == 1 else None

    @property
    def eta_mismatch(self) -> bool:
        """The folder's suffix names another eta than its runs started from (a method that sets init_kl_coef
        itself, such as cory_authors, inside a --kl_coefs sweep)."""
        cfg = self.config_eta
        return self.kl_coef is not None and cfg is not None and not math.isclose(cfg, self.kl_coef, rel_tol=1e-9)

    @property
    def eta(self) -> float | None:
        """The KL coefficient the runs started from: their config, else the folder's suffix."""
        cfg = self.config_eta
        return cfg if cfg is not None else self.kl_coef

    def name(self, agent: str) -> str:
        base = METHOD_NAMES.get(self.method, self.method) + AGENT_NAMES.get(agent, f"-{agent}")
        return base if self.kl_coef is None else f"{base} (η={self.kl_coef:g})"

    def config_value(self, key: str):
        values = {json.dumps(r.config.get(key), sort_keys=True) for r in self.runs.values() if r.config}
        if not values:
            return None
        if len(values) > 1:
            return "varies by seed"
        return json.loads(values.pop())


@dataclass
class Experiment:
    path: Path
    groups: dict[str, Group]
    runs_json: dict
    notes: list[str]

    def main_group(self, method: str) -> Group | None:
        """The method's run at the preset's KL coefficient (no sweep suffix), else see ``main_eta``."""
        g = self.groups.get(method)
        if g is not None and g.runs:
            return g
        eta = self.main_eta
        if eta is None:
            return None
        for g in self.groups.values():
            if g.method == method and g.kl_coef == eta and g.runs:
                return g
        return None

    @property
    def main_eta(self) -> float | None:
        """With sweep runs only, the comparison uses the largest eta that PPO and CORY share."""
        if any(self.groups.get(m) and self.groups[m].runs for m in MAIN_METHODS):
            return None
        shared = None
        for m in MAIN_METHODS:
            etas = {g.kl_coef for g in self.groups.values() if g.method == m and g.kl_coef is not None and g.runs}
            shared = etas if shared is None else shared & etas
        return max(shared) if shared else None

    def any_config(self, key: str):
        for g in self.groups.values():
            v = g.config_value(key)
            if v is not None:
                return v
        return None


def load_experiment(path: str | Path) -> Experiment:
    root = Path(path)
    if not root.is_dir():
        raise ReportError(f"{path}: folder not found")
    runs_root = root / "runs"
    if not runs_root.is_dir():
        raise ReportError(f"{path}: no runs/ folder; is it an experiment folder written by cory.experiments?")
    runs_json = {}
    notes = []
    if (root / "runs.json").is_file():
        try:
            runs_json = json.loads((root / "runs.json").read_text())
        except json.JSONDecodeError:
            notes.append("runs.json is not valid JSON; the commands and wall times are missing.")
    groups: dict[str, Group] = {}
    for label_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        method, kl = parse_label(label_dir.name)
        group = Group(label_dir.name, method, kl)
        for seed_dir in sorted(p for p in label_dir.iterdir() if p.is_dir()):
            m = re.fullmatch(r"seed_(\d+)", seed_dir.name)
            if not m:
                notes.append(f"`{label_dir.name}/{seed_dir.name}` ignored: not a seed_<n> folder.")
                continue
            rows, bad = _read_jsonl(seed_dir / "metrics.jsonl")
            if bad:
                notes.append(f"`{label_dir.name}/{seed_dir.name}`: {bad} unreadable line(s) in metrics.jsonl skipped.")
            if not rows:
                notes.append(f"`{label_dir.name}/{seed_dir.name}`: no metrics yet; left out.")
                continue
            config = {}
            if (seed_dir / "config.yaml").is_file():
                try:
                    config = yaml.safe_load((seed_dir / "config.yaml").read_text()) or {}
                except yaml.YAMLError:
                    notes.append(f"`{label_dir.name}/{seed_dir.name}`: config.yaml unreadable.")
            group.runs[int(m.group(1))] = SeedRun(int(m.group(1)), seed_dir, rows, config)
        if group.runs:
            groups[label_dir.name] = group
    return Experiment(root, groups, runs_json, notes)


# ----------------------------------------------------------------------------- statistics

def _std(values: np.ndarray, axis=0) -> np.ndarray:
    """Sample std over seeds (ddof=1); NaN with a single seed (no spread to show)."""
    n = values.shape[axis]
    if n < 2:
        return np.full(np.delete(values.shape, axis), np.nan)
    return values.std(axis=axis, ddof=1)


@dataclass
class Curve:
    """One metric of one agent, aligned over seeds."""

    steps: np.ndarray          # steps present (finite) in every seed
    values: np.ndarray         # seeds x steps
    seeds: list[int]
    lengths: dict[int, int]    # seed -> how many steps it logged with a finite value
    missing_seeds: list[int]   # seeds that have no value of this metric at all

    @property
    def mean(self) -> np.ndarray:
        return self.values.mean(axis=0)

    @property
    def std(self) -> np.ndarray:
        return _std(self.values)

    @property
    def trimmed(self) -> bool:
        return any(n != len(self.steps) for n in self.lengths.values())

    def final(self, last: int = LAST_N, upto: int | None = None) -> "Final":
        """Each seed's mean over the last ``last`` aligned steps (those <= ``upto`` when given)."""
        n = len(self.steps) if upto is None else int(np.searchsorted(self.steps, upto, side="right"))
        k = min(last, n)
        window = self.values[:, n - k:n]
        steps = (int(self.steps[n - k]), int(self.steps[n - 1])) if k else None
        return Final(window.mean(axis=1) if k else np.array([]), k, self.seeds, steps)


@dataclass
class Final:
    per_seed: np.ndarray  # each seed's mean over the last ``last`` aligned iterations
    last: int
    seeds: list[int]
    steps: tuple[int, int] | None = None  # first and last iteration of that window

    @property
    def n(self) -> int:
        return len(self.per_seed)

    @property
    def mean(self) -> float:
        return float(self.per_seed.mean()) if self.n else float("nan")

    @property
    def std(self) -> float:
        return float(self.per_seed.std(ddof=1)) if self.n >= 2 else float("nan")


def curve(group: Group, agent: str, metric: str) -> Curve | None:
    per_seed = {s: r.series(agent, metric) for s, r in sorted(group.runs.items())}
    present = {s: d for s, d in per_seed.items() if d}
    if not present:
        return None
    common = sorted(set.intersection(*(set(d) for d in present.values())))
    values = np.array([[d[step] for step in common] for d in present.values()], dtype=float)
    values = values.reshape(len(present), len(common))
    return Curve(np.array(common, dtype=int), values, list(present),
                 {s: len(d) for s, d in present.items()}, [s for s, d in per_seed.items() if not d])


def final_value(group: Group, agent: str, metric: str, last: int = LAST_N, upto: int | None = None) -> Final | None:
    c = curve(group, agent, metric)
    if c is None or not len(c.steps):
        return None
    f = c.final(last, upto)
    return f if f.n and f.last else None


def pooled_std(a: Final, b: Final) -> float:
    """Pooled sample std of two groups of seeds; 0 when neither has a spread (one seed each)."""
    dof = (a.n - 1) + (b.n - 1)
    if dof <= 0:
        return 0.0
    ss = sum((f.n - 1) * f.std ** 2 for f in (a, b) if f.n >= 2)
    return math.sqrt(ss / dof)


# ----------------------------------------------------------------------------- verdict

@dataclass
class Verdict:
    answer: str  # "yes" | "partly" | "no" | "too few seeds" | "not decided"
    text: str


def _fmt(x: float, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _pm(f: Final | None) -> str:
    if f is None or not f.n:
        return "n/a"
    if f.n < 2:
        return f"{_fmt(f.mean)} (1 seed)"
    return f"{_fmt(f.mean)} ± {_fmt(f.std)}"


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
            return f"one-sided p = {_fmt(test.p)}{how}: {yes if holds else no}"

        versus = f"{self.name} vs {self.base_name}"
        nums = (f"task reward {_pm(self.fin['task_reward'])} vs {_pm(self.base['task_reward'])}",
                f"KL {_pm(self.fin['kl'])} vs {_pm(self.base['kl'])}",
                f"r_c {_pm(self.fin['combined_reward'])} vs {_pm(self.base['combined_reward'])}")
        ratio = f"KL ratio {self.base_name}/{self.name} = {_fmt(self.kl_ratio)} (paper: > 2)"
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
    where = f" at η={_fmt(cory.kl_coef)}" if cory.kl_coef is not None else ""
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
        lines.append(f"- For scale: PPO's KL went from {_fmt(kl.mean[:k].mean())} (first {k} iterations) "
                     f"to {_fmt(kl.mean[-k:].mean())} (last {k}).")
    extra = confound_lines(exp, ppo, cory)
    return Verdict(answer, head + "\n\n" + "\n".join(lines) + ("\n\n" + extra if extra else ""))


def confound_lines(exp: Experiment, ppo: Group, cory: Group) -> str:
    """The same test against the two confounds, when their runs exist: CORY vs PPO with CORY's score normalisation
    (``ppo_norm``), and CORY as the authors' code runs it (``cory_authors``) vs PPO. Not part of the answer."""
    parts = []
    norm, authors = exp.main_group("ppo_norm"), exp.main_group("cory_authors")

    def setting(g: Group, key: str) -> str:
        v = g.config_value(key)
        return "?" if v is None else (_fmt(v) if isinstance(v, float) else str(v).lower())

    pairs = []
    if norm is not None:
        pairs.append((f"CORY vs PPO with score normalisation (`ppo_norm`; score_norm: {norm.label} "
                      f"{setting(norm, 'score_norm')}, {cory.label} {setting(cory, 'score_norm')})", norm, cory))
    if authors is not None:
        pairs.append(("CORY with the authors' resets (`cory_authors`: Adam, the KL controller and the score statistics "
                      f"reset at each role exchange; reset_on_swap {setting(authors, 'reset_on_swap')}, η from "
                      f"{_fmt(authors.eta)}) vs PPO (η from {_fmt(ppo.eta)})", ppo, authors))
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


def _setting(exp: Experiment) -> str:
    task = exp.runs_json.get("task") or exp.any_config("task") or "?"
    preset = exp.runs_json.get("preset")
    return f"{str(task).upper()}" + (f", {preset} preset" if preset else "")


def plot_metric(exp: Experiment, path: Path, metric: str, series: list[tuple[Group, str]],
                refs: list[tuple[Group, str]] = (), title: str = "") -> list[str]:
    """One figure: mean line and ±std band per (group, agent); ``refs`` as thin lines without band.
    Returns notes on alignment (seeds of different lengths, missing seeds)."""
    head, ylabel = METRICS[metric]
    fig, ax = _axes(f"{_setting(exp)}: {title or head} per iteration (mean ± std over seeds)",
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


def sweep_points(exp: Experiment) -> dict[tuple[str, str], list[tuple[float, Final, Final]]]:
    """(method, agent) -> [(eta, final task reward, final KL)] sorted by eta, for methods with >= 2 etas."""
    by_method: dict[str, dict[float, Group]] = {}
    for g in exp.groups.values():
        if g.kl_coef is not None and not g.eta_mismatch:  # a folder that did not run at its eta is no sweep point
            by_method.setdefault(g.method, {})[g.kl_coef] = g
    for g in exp.groups.values():  # the preset's own eta joins the sweep unless already swept
        if g.kl_coef is None and g.method in by_method and g.eta is not None:
            by_method[g.method].setdefault(g.eta, g)
    out = {}
    for method, groups in by_method.items():
        if len(groups) < 2:
            continue
        for agent in next(iter(groups.values())).agents:
            pts = []
            for eta, g in sorted(groups.items()):
                r, kl = final_value(g, agent, "task_reward"), final_value(g, agent, "kl")
                if r is not None and kl is not None:
                    pts.append((eta, r, kl))
            if pts:
                out[(method, agent)] = pts
    return out


def plot_sweep(exp: Experiment, path: Path, points) -> None:
    fig, ax = _axes(f"{_setting(exp)}: final task reward vs final KL over the KL coefficient η",
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
            rows.append([g.name(agent), _fmt(g.eta) if g.eta is not None else "?", some.n if some else 0,
                         window] + [_pm(f) for f in fins.values()])
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
        rows, _ = _read_jsonl(g.runs[seed].path / "samples.jsonl")
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
    x = _finite(x)
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
            per_it += [v for v in (_finite(r.get("time/iteration_s")) for r in run.rows) if v is not None]
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
            cfg_rows.append([key] + [_fmt(v) if isinstance(v, float) else ("–" if v is None else v) for v in values])
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
            notes.append(f"`{g.label}`: its runs started from init_kl_coef {_fmt(g.config_eta)}, not the folder's "
                         f"η={_fmt(g.kl_coef)} (the method sets it itself); it is left out of the η sweep.")
    failed = [k for k, r in (exp.runs_json.get("runs") or {}).items() if r.get("status") == "failed"]
    if failed:
        notes.append(f"Failed runs (their partial metrics, if any, are included): {', '.join(sorted(failed))}.")

    v = verdict(exp)
    md = [f"# CORY vs PPO: {_setting(exp)}", "",
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
