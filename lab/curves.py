"""A run group's curves and final values, the numbers the report, the verdict and the figures are built on.

``curve`` aligns one metric of one agent over the seeds of a ``lab.results.Group``, ``heldout_curve`` the same for
the runs' own held-out evaluations; ``final_value`` takes each seed's mean over the last ``LAST_N`` aligned
iterations, ``heldout_final`` each seed's held-out reward of its final models.

Conventions:
* curves are aligned by ``step``; the mean and the band use only the steps that every seed of a method
  logged with a finite value;
* std is the sample standard deviation over seeds (ddof=1), absent with one seed;
* a "final" value is a seed's mean over the last 10 aligned iterations (all of them if fewer), then
  mean +- std of that over seeds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lab.labels import fmt
from lab.results import LAST_N, Experiment, Group, finite


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


def heldout_curve(group: Group, agent: str, metric: str = "task_reward") -> Curve | None:
    """``curve`` for the runs' own held-out evaluations (eval.jsonl), by completed iterations."""
    per_seed = {s: r.heldout_series(agent, metric) for s, r in sorted(group.runs.items())}
    present = {s: d for s, d in per_seed.items() if d}
    if not present:
        return None
    common = sorted(set.intersection(*(set(d) for d in present.values())))
    values = np.array([[d[i] for i in common] for d in present.values()], dtype=float).reshape(len(present),
                                                                                              len(common))
    return Curve(np.array(common, dtype=int), values, list(present),
                 {s: len(d) for s, d in present.items()}, [s for s, d in per_seed.items() if not d])


# the reward an evaluation reports: reward tasks' task_reward, else pass@k tasks' accuracy
HELDOUT_KEYS = ("task_reward", "accuracy")


def heldout_value(result: dict | None) -> float | None:
    """The reward a held-out evaluation reports (the first finite one of ``HELDOUT_KEYS``), else None."""
    for key in HELDOUT_KEYS:
        if (v := finite((result or {}).get(key))) is not None:
            return v
    return None


def heldout_final(group: Group, agent: str) -> Final | None:
    """Each seed's held-out task reward of its final ``agent`` model (``SeedRun.final_evaluation``), as a Final of
    one value per seed; None unless every seed of the group has one."""
    values = []
    for seed, run in sorted(group.runs.items()):
        value = heldout_value(run.final_evaluation(agent))
        if value is None:
            return None
        values.append(value)
    return Final(np.array(values), 1, sorted(group.runs), None) if values else None


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


def fmt_final(f: Final | None) -> str:
    """A final value in the report: "mean ± std" over seeds, "mean (1 seed)", or "n/a"."""
    if f is None or not f.n:
        return "n/a"
    if f.n < 2:
        return f"{fmt(f.mean)} (1 seed)"
    return f"{fmt(f.mean)} ± {fmt(f.std)}"
