"""Does a run in one precision learn what a run in another learns? Held-out paths of PPO runs, paired by seed.

    python -m lab.equivalence results/imdb_cpu_bf16 results/imdb_cpu_matched_kl --upto 21

The first folder's PPO runs (the reference, e.g. fp32) against the second's (e.g. bf16), seed by seed, at every
held-out evaluation both made up to ``--upto`` iterations. Two runs of one setting with one seed already sample
different answers after the first update, so a pair is two draws of one setting: the check is a noise band, the
mean paired difference against ± 2 · sd · sqrt(2 / n), with sd the runs' spread over seeds at that point, pooled
over the two folders.
Writes ``EQUIVALENCE.md`` and ``fig_equivalence.png`` into the first folder.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.compute import logged_precision
from lab.errors import OneLineParser, ReportError, exit_on_error
from lab.figures import _axes, check_targets, generated_by, integer_iterations, save_figure, write_atomically
from lab.results import POLICY, Experiment, fmt, load_experiment
from lab.runs import rel

METRICS = (("task_reward", "held-out reward"), ("kl", "held-out KL"))


@dataclass
class Point:
    metric: str
    where: str          # "iteration N" or "path mean"
    diff: float         # mean paired difference, second − first
    band: float         # ± 2 · sd · sqrt(2 / n)

    @property
    def inside(self) -> bool:
        return abs(self.diff) <= self.band


def paths(exp: Experiment, metric: str, upto: int) -> dict[int, dict[int, float]]:
    group = exp.groups.get("ppo")
    if group is None:
        raise ReportError(f"{exp.path}: no PPO runs (runs/ppo/seed_N)")
    return {s: {i: v for i, v in run.heldout_series(POLICY, metric).items() if i <= upto}
            for s, run in sorted(group.runs.items())}


def compare(first: Experiment, second: Experiment, upto: int) -> tuple[list[int], list[int], list[Point]]:
    """(seeds, iterations, points): every held-out point both folders' runs of a seed share, and the path means."""
    out = []
    seeds, iterations = [], []
    for metric, _ in METRICS:
        a, b = paths(first, metric, upto), paths(second, metric, upto)
        seeds = sorted(s for s in set(a) & set(b) if a[s] and b[s])
        if len(seeds) < 2:
            raise ReportError(f"{len(seeds)} seed(s) evaluated in both folders: the check needs 2 or more")
        iterations = sorted(set.intersection(*(set(a[s]) & set(b[s]) for s in seeds)) - {0})  # 0: the base model
        if not iterations:
            raise ReportError("no held-out evaluation after iteration 0 that every seed's runs share")
        x = np.array([[a[s][i] for i in iterations] for s in seeds])
        y = np.array([[b[s][i] for i in iterations] for s in seeds])
        n = len(seeds)
        for j, it in enumerate(iterations):
            out.append(Point(metric, f"iteration {it}", float((y[:, j] - x[:, j]).mean()), band(x[:, j], y[:, j])))
        out.append(Point(metric, "path mean", float((y.mean(1) - x.mean(1)).mean()), band(x.mean(1), y.mean(1))))
    return seeds, iterations, out


def band(x: np.ndarray, y: np.ndarray) -> float:
    """± 2 standard errors of the mean difference of two independent draws of one setting per seed: 2 · sd ·
    sqrt(2/n), sd pooled over both folders' seeds (one folder's sd from 3 seeds can come out near 0 by chance)."""
    sd = math.sqrt((x.var(ddof=1) + y.var(ddof=1)) / 2)
    return 2 * sd * math.sqrt(2 / len(x))


def verdict(points: list[Point], last: int) -> tuple[bool, str]:
    """Equivalent: the path means and the last point inside their bands for both metrics, and at most one other
    point outside."""
    key = [p for p in points if p.where in ("path mean", f"iteration {last}")]
    others = [p for p in points if p not in key and not p.inside]
    ok = all(p.inside for p in key) and len(others) <= 1
    out = [p for p in points if not p.inside]
    why = ("every point inside its band" if not out else
           "outside: " + "; ".join(f"{p.metric} at {p.where} ({fmt(p.diff)} against ± {fmt(p.band)})" for p in out))
    return ok, why


def seconds_per_iteration(exp: Experiment, seeds: list[int]) -> float | None:
    """The median training iteration of the compared seeds' PPO runs (a folder may hold more seeds than the check
    pairs: another experiment's later seeds, made at another load)."""
    runs = exp.groups["ppo"].runs
    times = [r.get("time/iteration_s") for s in seeds if s in runs for r in runs[s].rows]
    times = [t for t in times if isinstance(t, (int, float))]
    return float(np.median(times)) if times else None


def build(first_dir: str, second_dir: str, upto: int) -> Path:
    first, second = load_experiment(first_dir), load_experiment(second_dir)
    check_targets(Path(first_dir), "EQUIVALENCE.md", writer="lab.equivalence")
    seeds, iterations, points = compare(first, second, upto)
    ok, why = verdict(points, iterations[-1])
    names = [_precision(e) for e in (first, second)]
    rows = ["| metric | where | mean paired difference (" + f"{names[1]} − {names[0]}) | band ± | inside |",
            "|---|---|---|---|---|"]
    rows += [f"| {dict(METRICS)[p.metric]} | {p.where} | {fmt(p.diff)} | {fmt(p.band)} | "
             f"{'yes' if p.inside else '**no**'} |" for p in points]
    t = [seconds_per_iteration(e, seeds) for e in (first, second)]
    speed = (f"Median seconds per training iteration (evaluations excluded), as these runs were made (several at "
             f"a time on one machine, so a loaded figure, not a benchmark): {names[0]} {fmt(t[0])}, {names[1]} "
             f"{fmt(t[1])}, ratio {fmt(t[0] / t[1]) if t[0] and t[1] else 'n/a'}.")
    _figure(first, second, names, upto, Path(first_dir) / "fig_equivalence.png")
    root = Path(first_dir)
    text = "\n".join([
        f"# {names[1]} against {names[0]}: the same learning?", "",
        generated_by("lab.equivalence", f"{rel_to_repo(first_dir)} {rel_to_repo(second_dir)} --upto {upto}") + " from the "
        "runs' eval.jsonl; rerun it to rebuild this file and the figure.", "",
        f"PPO runs of seeds {', '.join(map(str, seeds))}: `{rel_to_repo(first_dir)}` ({names[0]}) against "
        f"`{rel_to_repo(second_dir)}` ({names[1]}), held-out evaluations at iterations {', '.join(map(str, iterations))} "
        "(the base model at 0 is the same for both). Each pair is two draws of one setting (the first update "
        "already samples other answers), so the check is a noise band: the mean paired difference against ± 2 · sd "
        "· sqrt(2/n), sd the runs' spread over seeds at that point, pooled over both precisions. Equivalent when the path means and "
        "the last point lie inside their bands for both metrics and at most one other point falls outside; with "
        "few seeds this catches only a large effect of the precision (about 1.6 seed sds with 3 seeds).", "",
        f"**{'Equivalent within the seeds noise' if ok else 'Not shown equivalent'}** — {why}.", "",
        *rows, "", speed, "",
        "![held-out reward and KL along training, both precisions](fig_equivalence.png)", ""])
    write_atomically(root / "EQUIVALENCE.md", text)
    return root / "EQUIVALENCE.md"


def _precision(exp: Experiment) -> str:
    """The runs' configured precision, with what ``auto`` resolved to where their logs say (``precision: X (why)``,
    the first line a run prints; its last attempt's, ``lab.compute.logged_precision``)."""
    values = set()
    for seed, run in exp.groups["ppo"].runs.items():
        value = str(run.config.get("precision"))
        log = exp.path / "logs" / "ppo" / f"seed_{seed}.log"
        said = logged_precision(log) if value == "auto" else None
        value = f"auto → {said[0]}" if said else value
        values.add(value)
    return "/".join(sorted(values))


def rel_to_repo(path: str) -> str:
    """The folder as the repository's commands name it (the runner's ``rel``), whatever the working directory."""
    return rel(Path(path).resolve())


def _figure(first: Experiment, second: Experiment, names: list[str], upto: int, path: Path) -> None:
    fig, ax = _axes("held-out reward (left) and KL (right) along training", "iterations completed",
                    "held-out reward")
    ax2 = ax.twinx()
    integer_iterations(ax)
    for exp, name, style in ((first, names[0], "-"), (second, names[1], "--")):
        for (metric, _), axis, colour in zip(METRICS, (ax, ax2), ("#1f77b4", "#d62728")):
            p = paths(exp, metric, upto)
            for s, d in p.items():
                its = sorted(d)
                axis.plot(its, [d[i] for i in its], linestyle=style, color=colour, linewidth=0.9, alpha=0.7,
                          label=f"{dict(METRICS)[metric]}, {name}" if s == min(p) else None)
    ax2.set_ylabel("held-out KL (nats)")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(ReportError, prog="python -m lab.equivalence",
                      description="Compare the held-out paths of two folders' PPO runs, seed by seed.")
    p.add_argument("first", help="the reference folder (its runs/ppo/seed_N); EQUIVALENCE.md is written here")
    p.add_argument("second", help="the folder compared with it")
    p.add_argument("--upto", type=int, default=10 ** 9, help="the last iteration compared (default: all)")
    with exit_on_error((ReportError,)):
        args = p.parse_args(argv)
        print(build(args.first, args.second, args.upto))


if __name__ == "__main__":
    main()
