"""A hyperparameter search's summary: which settings made the baseline (PPO) learn, by a criterion fixed before the
runs (results/imdb_cpu_search/DESIGN.md).

    python -m lab.search results/imdb_cpu_search [--min_gain 0.3] [--min_distinct 0.5] [--max_minutes 60]
        [--within ITERATIONS]

Each sub-folder of the search is one setting, an experiment folder of the runner (``lab.experiments``) whose
runs evaluated themselves on held-out prompts (``eval_every``). A seed **meets the criterion** when, at some
evaluation point after iteration 0 (and at most ``within``), its held-out reward is at least ``min_gain`` above the
base model's (the iteration-0 evaluation: the same prompts and sampling) with distinct-2 at least ``min_distinct``
× the base model's (its answers still English; 0: no such bar), and its run took at most ``max_minutes`` (inf: no
limit). The defaults are the IMDB search's criterion; another design states its own with these flags. SUMMARY.md
and the figures are rebuilt from the committed metrics alone.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lab.errors import OneLineParser, ReportError, exit_on_error
from lab.figures import check_targets, generated_by, write_atomically
from lab.results import POLICY, Experiment, finite, fmt, load_experiment

MIN_GAIN = 0.3      # held-out reward above the base model's
MIN_DISTINCT = 0.5  # distinct-2 at least this share of the base model's
MAX_MINUTES = 60.0  # per PPO run on the 2-core machine (one core per run)


@dataclass(frozen=True)
class Criterion:
    """When a seed has learned, as a search's design fixes it before the runs (the defaults: the IMDB search's)."""
    min_gain: float = MIN_GAIN
    min_distinct: float = MIN_DISTINCT  # 0: no bar on distinct-2
    max_minutes: float = MAX_MINUTES    # inf: no limit on the run's wall time
    within: int | None = None           # the last iteration whose evaluation counts (None: any)

    def counts(self, iterations: int, row: dict, base: dict) -> bool:
        """Whether the evaluation at ``iterations`` may be the seed's best point."""
        return (iterations > 0 and (self.within is None or iterations <= self.within)
                and row["distinct_2"] >= self.min_distinct * base["distinct_2"])

    def options(self) -> str:
        """The command-line flags that state this criterion (only those that differ from the defaults)."""
        default = Criterion()
        return "".join(f" --{k} {v:g}" for k in ("min_gain", "min_distinct", "max_minutes", "within")
                       if (v := getattr(self, k)) != getattr(default, k))

    def text(self, bases: list[float]) -> str:
        """``bases``: each seed's base reading (its run's iteration-0 evaluation, which its gain is measured from)."""
        english = (f", with distinct-2 at least {self.min_distinct:g} × the base model's there"
                   if self.min_distinct > 0 else "")
        when = f" within {self.within} iterations" if self.within is not None else ""
        minutes = f", within {self.max_minutes:g} minutes per run" if math.isfinite(self.max_minutes) else ""
        low, high = (fmt(min(bases)), fmt(max(bases))) if bases else ("n/a", "n/a")
        base = low if low == high else f"its run's own iteration-0 reading, from {low} to {high} here"
        return (f"for every seed, PPO's held-out reward at least {self.min_gain:g} above the base model's "
                f"({base}) at some evaluation point{when}{english}{minutes}.")

# per task: its name in titles, what its held-out reward is (figure axis), and how its held-out set is read
TASKS = {
    "imdb": ("IMDB", "held-out task reward (VADER, −1…1)",
             "Held-out: the 110 built-in eval openings, 15-token answers sampled as in training, scored with plain VADER "
             "(whatever the training reward's form)"),
    "arithmetic": ("Arithmetic", "held-out accuracy, sampled as in training",
                   "Held-out: the task's 200 held-out problems (never drawn in training), answers of up to 20 tokens "
                   "sampled as in training, scored 0/1 (the reward is the accuracy; greedy accuracy is in each run's "
                   "eval.jsonl)"),
}


@dataclass
class SeedResult:
    seed: int
    base: float                 # the base model's held-out reward (iteration 0)
    points: dict[int, dict]     # iterations -> held-out row
    minutes: float | None       # the run's wall time
    meets: bool
    best: tuple[int, float] | None  # (iterations, reward) of the best point that keeps its English
    iterations: int             # training iterations logged: fewer than the setting's steps if it was cut off

    @property
    def final(self) -> dict:
        return self.points[max(self.points)]


@dataclass
class Setting:
    name: str
    changes: str
    exp: Experiment
    seeds: list[SeedResult]
    seconds_per_iteration: float | None
    steps: int | None
    notes: list[str] = field(default_factory=list)  # what of its folder was skipped, and why

    @property
    def cut_off(self) -> list[SeedResult]:
        """The seeds stopped before the setting's steps (their "final" is their last evaluation point)."""
        return [r for r in self.seeds if self.steps and r.iterations < self.steps]

    def seeds_cell(self) -> str:
        cut = [f"seed {r.seed} cut off at {r.iterations}" for r in self.cut_off]
        return str(len(self.seeds)) + (f" ({'; '.join(cut)})" if cut else "")

    @property
    def meets(self) -> bool:
        return bool(self.seeds) and all(s.meets for s in self.seeds)


def _wall_minutes(exp: Experiment, key: str) -> float | None:
    attempts = ((exp.runs_json.get("runs") or {}).get(key) or {}).get("attempts") or []
    times = [a.get("wall_time_s") for a in attempts if isinstance(a.get("wall_time_s"), (int, float))]
    return sum(times) / 60 if times else None


def seed_result(exp: Experiment, label: str, seed: int, criterion: Criterion,
                notes: list[str] | None = None) -> SeedResult | None:
    """One seed's reading of the criterion; None when it has no base point (iteration 0) and a later one. A held-out
    row without a finite reward, KL or distinct-2 (a NaN written as null) is skipped and named in ``notes``."""
    run = exp.groups[label].runs[seed]
    where = f"`{exp.path.name}/{label}/seed_{seed}`"
    points = {}
    for r in run.heldout:
        if r.get("agent") != POLICY or not isinstance(r.get("iterations"), int):
            continue
        if all(finite(r.get(k)) is not None for k in ("task_reward", "kl", "distinct_2")):
            points[r["iterations"]] = r
        elif notes is not None:
            notes.append(f"{where}: its held-out row at iteration {r['iterations']} has no finite reward, KL or "
                         "distinct-2 (eval.jsonl); skipped.")
    if 0 not in points or len(points) < 2:
        if notes is not None:
            notes.append(f"{where}: no held-out evaluation of the base model (iteration 0) and a later one in "
                         "eval.jsonl; left out.")
        return None
    base = points[0]
    counted = [(i, r["task_reward"]) for i, r in sorted(points.items()) if criterion.counts(i, r, base)]
    best = max(counted, key=lambda p: p[1], default=None)
    minutes = _wall_minutes(exp, f"{label}/seed_{seed}")
    meets = (best is not None and best[1] - base["task_reward"] >= criterion.min_gain
             and (minutes is None or minutes <= criterion.max_minutes))
    return SeedResult(seed, base["task_reward"], points, minutes, meets, best, len(run.rows))


# fields that do not make one setting differ from another: the run's identity, its length and its bookkeeping
_SAME_SETTING = {"seed", "steps", "output_dir", "save_every", "keep_checkpoints", "save_total_limit", "samples_per_step",
                 "report_to", "resume", "overwrite", "on_nonfinite", "max_pass_tokens"}


def _changes(config: dict, base: dict) -> str:
    """The resolved fields in which ``config`` differs from the base setting's, e.g. "learning_rate 0.0001"."""
    changed = {k: v for k, v in config.items() if k not in _SAME_SETTING and base.get(k) != v}
    return ", ".join(f"{k} {v}" for k, v in sorted(changed.items())) or "—"


def _common_config(folders: list[Path]) -> dict:
    """The resolved fields every setting's PPO runs share (so that each setting shows what sets it apart)."""
    configs = []
    for folder in folders:
        group = load_experiment(folder).groups.get("ppo")
        configs += [run.config for run in group.runs.values()] if group else []
    if not configs:
        return {}
    return {k: v for k, v in configs[0].items() if all(c.get(k) == v for c in configs[1:])}


def load_setting(folder: Path, base_config: dict, criterion: Criterion, name: str | None = None,
                 seeds: list[int] | None = None) -> Setting | None:
    """One setting: the PPO runs of an experiment folder (``seeds``: only these); what of it is skipped is in its
    ``notes``. A folder that cannot be read as an experiment (two folders of one seed, ...) is refused."""
    exp = load_experiment(folder)
    group = exp.groups.get("ppo")
    if group is None:
        return None
    notes = [f"`{folder.name}`: {note}" for note in exp.notes]
    missing = sorted(set(seeds or []) - set(group.runs))
    if missing:
        raise ReportError(f"--also: {folder} has no PPO run of seed {', '.join(map(str, missing))}")
    chosen = [s for s in sorted(group.runs) if seeds is None or s in seeds]
    config = group.runs[chosen[0]].config if chosen else {}
    results = [r for s in chosen if (r := seed_result(exp, "ppo", s, criterion, notes)) is not None]
    times = [row["time/iteration_s"] for s in chosen for row in group.runs[s].rows
             if isinstance(row.get("time/iteration_s"), (int, float)) and row.get("step", 0) > 0]
    steps = config.get("steps")
    label = (name or folder.name) + (f" ({steps} it.)" if steps else "")
    return Setting(label, _changes(config, base_config), exp, results, float(np.median(times)) if times else None,
                   steps, notes)


def _mean(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    return fmt(float(np.mean(values))) + (f" ± {fmt(float(np.std(values, ddof=1)))}" if len(values) > 1 else "")


def summary_table(settings: list[Setting], against: str = "changes from `base`", english: bool = True) -> str:
    points = sorted({i for s in settings for r in s.seeds for i in r.points if i > 0})
    head = (["setting", f"{against} (resolved configs)", "seeds", "s / iteration"] + [f"held-out reward at {i}" for i in points]
            + [f"best gain over base{' (English)' if english else ''}", "final KL (held-out)", "final distinct-2", "minutes per run",
               "meets the criterion"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in settings:
        cells = [f"`{s.name}`", s.changes, s.seeds_cell(), fmt(s.seconds_per_iteration) if s.seconds_per_iteration
                 else "–"]
        cells += [_mean([r.points[i]["task_reward"] for r in s.seeds if i in r.points]) for i in points]
        cells += [_mean([r.best[1] - r.base if r.best else None for r in s.seeds]),
                  _mean([r.final["kl"] for r in s.seeds]), _mean([r.final["distinct_2"] for r in s.seeds]),
                  _mean([r.minutes for r in s.seeds]),
                  f"{'**yes**' if s.meets else 'no'} ({sum(r.meets for r in s.seeds)} of {len(s.seeds)} seeds)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(settings: list[Setting], path: Path, metric: str, ylabel: str, base: float | None, task: str = "IMDB") -> None:
    from lab.figures import _axes, integer_iterations, save_figure

    fig, ax = _axes(f"{task}, CPU search: held-out {metric.replace('_', ' ')} of PPO (mean over seeds)",
                    "iterations completed", ylabel, size=(8.5, 5.2))
    integer_iterations(ax)
    cmap = __import__("matplotlib").colormaps["tab20"]
    for k, s in enumerate(settings):
        steps = sorted(set.intersection(*(set(r.points) for r in s.seeds))) if s.seeds else []
        if not steps:
            continue
        y = [np.mean([r.points[i][metric] for r in s.seeds]) for i in steps]
        ax.plot(steps, y, marker="o", markersize=3, linewidth=2.2 if s.meets else 1.2, color=cmap(k % 20),
                linestyle="-" if s.meets else "--", label=f"{s.name}{' ✓' if s.meets else ''}")
    if base is not None:
        ax.axhline(base, color="#555555", linestyle=":", linewidth=1.5, label=f"base model ({base:.3g})")
    ax.legend(fontsize=7, loc="best", ncol=2)
    save_figure(fig, path)


def _ranking(settings: list[Setting], base_d2: float | None) -> str:
    """The design's rule for the choice: the settings that meet the criterion with every seed run to the end, by
    their mean held-out reward at the last evaluation point; a final distinct-2 under the English bar is named. A
    one-seed run (a check such as trl's stock step, not a candidate) is not ranked."""
    def final_mean(s: Setting, metric: str) -> float:
        return float(np.mean([r.final[metric] for r in s.seeds]))

    whole = [s for s in settings if s.meets and len(s.seeds) >= 2 and not s.cut_off]
    whole.sort(key=lambda s: -final_mean(s, "task_reward"))
    items = []
    for rank, s in enumerate(whole, 1):
        d2 = final_mean(s, "distinct_2")
        note = (f" (final distinct-2 {fmt(d2)}: under {MIN_DISTINCT:g} × the base model's, its answers degenerate "
                "by the end)" if base_d2 and d2 < MIN_DISTINCT * base_d2 else "")
        items.append(f"{rank}. `{s.name}` {fmt(final_mean(s, 'task_reward'))}{note}")
    if not items:
        return ""
    return ("Ranked by the design's rule (mean held-out reward at the last evaluation point, among the settings "
            "that meet the criterion with 2 seeds or more, every one run to the end): " + "; ".join(items) + ".")


def build_summary(root: str | Path, criterion: Criterion = Criterion(), also: list[str] = ()) -> Path:
    """SUMMARY.md and the figures of the search in ``root`` (each sub-folder with runs/ a setting); ``also``:
    settings kept elsewhere, as "NAME=FOLDER:SEEDS" (e.g. a comparison's PPO runs that are a search stage)."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root}: folder not found")
    folders = sorted(p for p in root.iterdir() if (p / "runs").is_dir())
    if not folders:
        raise ReportError(f"{root}: no setting folders (sub-folders with runs/ written by lab.experiments)")
    check_targets(root, "SUMMARY.md", writer="lab.search")
    base_config = {}
    if (root / "base" / "runs").is_dir():
        base_group = load_experiment(root / "base").groups.get("ppo")
        base_config = next(iter(base_group.runs.values())).config if base_group else {}
    else:  # no base setting: each setting's changes are the fields in which the settings differ
        base_config = _common_config(folders)
    settings = [s for f in folders if (s := load_setting(f, base_config, criterion)) is not None]
    for item in also:
        name, _, where = item.partition("=")
        folder, _, seeds = where.rpartition(":")
        if not (name and folder and seeds):
            raise ReportError(f"--also: expected NAME=FOLDER:SEEDS, got {item!r}")
        try:
            chosen = [int(x) for x in seeds.split(",")]
        except ValueError:
            raise ReportError(f"--also {item}: seeds must be comma-separated integers, got {seeds!r}") from None
        setting = load_setting(Path(folder), base_config, criterion, name, chosen)
        if setting is None:
            raise ReportError(f"--also: {folder} holds no PPO runs")
        settings.append(setting)
    # the longer runs last, each stage's settings in the order of their best held-out gain
    settings.sort(key=lambda s: (s.steps or 0, -np.mean([r.best[1] - r.base for r in s.seeds if r.best] or [-9])))
    bases = [r.base for s in settings for r in s.seeds]
    base = float(np.mean(bases)) if bases else None
    base_d2 = [r.points[0]["distinct_2"] for s in settings for r in s.seeds]
    task = next((r.config.get("task") for s in settings for r in s.exp.groups["ppo"].runs.values()), "imdb")
    title, reward_axis, heldout = TASKS.get(task, (task, "held-out task reward", f"Held-out: the {task} task's "
                                                   "held-out examples, answers sampled as in training"))
    plot(settings, root / "fig_search_reward.png", "task_reward", reward_axis, base, title)
    plot(settings, root / "fig_search_kl.png", "kl", "held-out KL(π‖π₀), nats per answer", None, title)
    plot(settings, root / "fig_search_distinct_2.png", "distinct_2", "held-out distinct-2",
         float(np.mean(base_d2)) if base_d2 else None, title)
    met = [s.name for s in settings if s.meets]
    ranking = _ranking(settings, float(np.mean(base_d2)) if base_d2 else None)
    options = criterion.options()
    md = [f"# {title} on a CPU: the search for a preset where PPO learns", "",
          generated_by("lab.search", f"{root.as_posix()}{options}{''.join(f' --also {a}' for a in also)}") + " from the "
          "metrics in its folders; the design "
          "(grid, criterion, budget), fixed before the runs, is in [DESIGN.md](DESIGN.md).", "",
          f"Criterion: {criterion.text(bases)} "
          + (f"**Met by: {', '.join(f'`{n}`' for n in met)}.**" if met else "**No setting met it.**"), "",
          *([ranking, ""] if ranking else []),
          summary_table(settings, "changes from `base`" if (root / "base" / "runs").is_dir() else "what sets it apart",
                        english=criterion.min_distinct > 0),
          "",
          f"{heldout}; mean ± std over seeds. s / iteration: the median over the runs' "
          "iterations (two runs at a time, one core each). Minutes per run: the run's wall time from `runs.json`, "
          "its evaluations included.", "",
          "![held-out reward](fig_search_reward.png)", "", "![held-out KL](fig_search_kl.png)", "",
          "![held-out distinct-2](fig_search_distinct_2.png)", ""]
    notes = [note for s in settings for note in s.notes]
    if notes:  # what was skipped, named: a damaged or missing file must not change the table unseen
        md += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    out = root / "SUMMARY.md"
    write_atomically(out, "\n".join(md))
    return out


def _check_bounds(args) -> None:
    """--min_gain a finite number, --min_distinct a finite one from 0, --max_minutes a positive one (inf: no limit),
    --within a positive number of iterations: a NaN would meet nothing and read as "no setting met it"."""
    if not math.isfinite(args.min_gain):
        raise ReportError(f"--min_gain: expected a finite number, got {args.min_gain}")
    if not (math.isfinite(args.min_distinct) and args.min_distinct >= 0):
        raise ReportError(f"--min_distinct: expected a finite share of the base model's distinct-2 from 0 (0: no "
                          f"bar), got {args.min_distinct}")
    if args.within is not None and args.within < 1:
        raise ReportError(f"--within: expected a positive number of iterations, got {args.within}")
    if math.isnan(args.max_minutes) or args.max_minutes <= 0:
        raise ReportError(f"--max_minutes: expected a positive number of minutes, got {args.max_minutes}")


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(ReportError, prog="python -m lab.search", description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--min_gain", type=float, default=MIN_GAIN,
                   help=f"held-out reward above the base model's at some evaluation (default {MIN_GAIN:g})")
    p.add_argument("--min_distinct", type=float, default=MIN_DISTINCT,
                   help=f"distinct-2 at least this share of the base model's at the best point (default {MIN_DISTINCT:g}; "
                   "0: no bar)")
    p.add_argument("--max_minutes", type=float, default=MAX_MINUTES,
                   help=f"a run's wall time at most this (default {MAX_MINUTES:g}; inf: no limit)")
    p.add_argument("--within", type=int, default=None, metavar="ITERATIONS",
                   help="only evaluations at or before this iteration count (default: any)")
    p.add_argument("--also", action="append", default=[], metavar="NAME=FOLDER:SEEDS",
                   help="a setting kept in another experiment folder (its PPO runs of these seeds)")
    with exit_on_error((ReportError,), files=lambda: args.folder, interrupted="the files written so far are whole"):
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        _check_bounds(args)
        criterion = Criterion(args.min_gain, args.min_distinct, args.max_minutes, args.within)
        print(f"summary: {build_summary(args.folder, criterion, args.also)}")


if __name__ == "__main__":
    main()
