"""The statistics behind the report's verdicts: one-sided t-tests of a difference of per-seed final values (paired
or Welch), their power and smallest detectable difference (noncentral t), Holm's correction, and a seed's trend.
Apart from ``lab.verdict`` so that the rules there read as rules."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from lab.curves import Final, curve
from lab.results import Group

ALPHA = 0.05         # family-wise level of each verdict
POWER_TARGET = 0.8   # a negative result with less power than this reads "could not tell"


def _t():
    from scipy import stats

    return stats


@dataclass
class Diff:
    """The difference ``other − base`` of one metric's per-seed final values, with the standard error and degrees
    of freedom of its t statistic: paired (the per-seed differences) or unpaired (Welch)."""

    paired: bool
    mean: float   # estimated mean difference other − base
    se: float     # its standard error; 0: no spread; NaN: fewer than 2 seeds
    df: float     # degrees of freedom of the t; NaN when undefined
    n: int        # pairs (paired) or the smaller group (unpaired)
    corr: float = float("nan")  # paired: correlation of the two methods' per-seed values

    @property
    def constant(self) -> bool:
        return self.se == 0


def difference(other: Final, base: Final, paired: bool) -> Diff:
    """``other − base`` over the per-seed values. Paired: over the seeds both have, one difference per seed;
    unpaired: Welch's standard error and Welch–Satterthwaite degrees of freedom."""
    if paired:
        b = dict(zip(base.seeds, base.per_seed))
        common = [s for s in other.seeds if s in b]
        x = np.array([v for s, v in zip(other.seeds, other.per_seed) if s in b], dtype=float)
        y = np.array([b[s] for s in common], dtype=float)
        d = x - y
        n = len(d)
        if n < 2:
            return Diff(True, float(d.mean()) if n else float("nan"), float("nan"), float("nan"), n)
        corr = float("nan")
        if np.ptp(x) > 0 and np.ptp(y) > 0:
            corr = float(np.corrcoef(x, y)[0, 1])
        return Diff(True, float(d.mean()), _se(d.std(ddof=1) / math.sqrt(n), x, y), float(n - 1), n, corr)
    x, y = np.asarray(other.per_seed, dtype=float), np.asarray(base.per_seed, dtype=float)
    nx, ny = len(x), len(y)
    if nx < 2 or ny < 2:
        mean = float(x.mean() - y.mean()) if nx and ny else float("nan")
        return Diff(False, mean, float("nan"), float("nan"), min(nx, ny))
    vx, vy = x.var(ddof=1) / nx, y.var(ddof=1) / ny
    se = _se(math.sqrt(vx + vy), x, y)
    df = (vx + vy) ** 2 / (vx ** 2 / (nx - 1) + vy ** 2 / (ny - 1)) if se > 0 else float(nx + ny - 2)
    return Diff(False, float(x.mean() - y.mean()), se, float(df), min(nx, ny))


def _se(se: float, x: np.ndarray, y: np.ndarray) -> float:
    """0 when the spread is rounding error (the mean of ten 0.1s is not exactly 0.1): such values are constant."""
    scale = max(float(np.abs(x).max(initial=0.0)), float(np.abs(y).max(initial=0.0)))
    return 0.0 if se <= 1e-12 * scale else float(se)


def p_value(d: Diff, direction: str, bound: float = 0.0) -> float:
    """One-sided p of the t-test of ``d.mean`` against ``bound``: ``direction`` "less" tests difference < bound,
    "greater" difference > bound. With no spread (se 0) the sign decides: p = 0 when the difference lies strictly
    the tested way, 1 the other way, NaN when it sits on the bound (the limit of the test as the spread goes to 0)."""
    if not math.isfinite(d.mean) or not math.isfinite(d.se):
        return float("nan")
    gap = d.mean - bound
    if d.se == 0:
        if gap == 0:
            return float("nan")
        return 0.0 if (gap < 0) == (direction == "less") else 1.0
    from scipy.special import stdtr  # Student's t CDF; scipy.stats' frozen distributions cost 20x more per call

    t = gap / d.se
    return float(stdtr(d.df, t) if direction == "less" else stdtr(d.df, -t))


def p_two_sided(d: Diff) -> float:
    """Two-sided p of the t-test of ``d.mean`` against 0 (NaN without a standard error)."""
    return min(1.0, 2 * min(p_value(d, "less"), p_value(d, "greater"))) if math.isfinite(d.se) else float("nan")


def power(effect: float, d: Diff, alpha: float) -> float:
    """Chance that the one-sided t-test at level ``alpha`` rejects when the true difference lies ``effect`` beyond
    the tested bound (noncentral t, with the observed standard error and degrees of freedom)."""
    if not (math.isfinite(effect) and math.isfinite(d.se) and math.isfinite(d.df)) or d.df <= 0:
        return float("nan")
    if d.se == 0:
        return 1.0 if effect > 0 else 0.0
    if effect / d.se > 60:
        return 1.0  # beyond what scipy's noncentral t evaluates reliably; the power is 1 to many digits
    st = _t()
    with warnings.catch_warnings():  # scipy's noncentral t warns on extreme noncentralities; the value stands
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(st.nct.sf(st.t.ppf(1 - alpha, d.df), d.df, effect / d.se))


def min_detectable(d: Diff, alpha: float, target: float = POWER_TARGET) -> float:
    """The smallest true difference (beyond the tested bound) that the test would find with ``target`` power."""
    if not (math.isfinite(d.se) and math.isfinite(d.df)) or d.df <= 0:
        return float("nan")
    if d.se == 0:
        return 0.0
    from scipy.optimize import brentq

    hi = d.se
    for _ in range(60):
        if power(hi, d, alpha) >= target:
            break
        hi *= 2
    else:
        return float("nan")
    return float(brentq(lambda e: power(e, d, alpha) - target, 0.0, hi, xtol=d.se * 1e-6))


def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down rejections at family-wise level ``alpha`` (a NaN p is never rejected)."""
    ps = [p if math.isfinite(p) else 1.0 for p in pvalues]
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [False] * len(ps)
    for rank, i in enumerate(order):
        if ps[i] < alpha / (len(ps) - rank):
            out[i] = True
        else:
            break
    return out


def trend(group: Group, agent: str, metric: str, steps: tuple[int, int]) -> np.ndarray | None:
    """Each seed's least-squares slope of ``metric`` per iteration over the window ``steps`` (inclusive)."""
    c = curve(group, agent, metric)
    if c is None:
        return None
    keep = (c.steps >= steps[0]) & (c.steps <= steps[1])
    if keep.sum() < 3:
        return None
    x = c.steps[keep].astype(float)
    return np.array([np.polyfit(x, row[keep], 1)[0] for row in c.values])


def pct(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    if 0 < p < 0.005:
        return "<1%"  # not "0%": some power is left
    if 0.995 <= p < 1:
        return ">99%"
    return f"{100 * p:.0f}%"


def holm_adjusted(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values (reject at α exactly when the adjusted p < α)."""
    ps = [p if math.isfinite(p) else 1.0 for p in pvalues]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out
