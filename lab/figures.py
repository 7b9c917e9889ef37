"""The figures of REPORT.md, drawn on matplotlib's Agg canvas (no pyplot, no display).

``plot_metric`` draws one metric per iteration, mean line and ±std band over seeds for each (group, agent), with
other runs as thin reference lines; ``plot_sweep`` draws the final task reward against the final KL over the KL
coefficient eta (the points come from ``lab.results.sweep_points``). One colour per method in every figure, LLM2
dashed. Apart from lab.report so that the markdown and the plotting each stay one level, and so that matplotlib
is imported only when a figure is drawn.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cory.errors import ConfigError
from lab.errors import ReportError
from lab.results import (AGENT_NAMES, LLM1, LLM2, METHOD_NAMES, POLICY, REWARD_RANGES, curve, Experiment, Group,
                              heldout_curve, heldout_value, setting_name)
from cory.targets import target_refusal, text_refusal, write_whole

# key in metrics.jsonl after "<agent>/" -> (title, y-axis label; {reward} is the reward's unit)
METRICS = {
    "task_reward": ("task reward", "task reward ({reward}), batch mean"),
    "kl": ("KL to the reference model", "KL(π‖π₀), nats per response (sum over tokens)"),
    "combined_reward": ("combined reward r_c", "r_c = task reward − η·KL"),
    "response_length": ("response length", "response length (tokens)"),
    "distinct_2": ("distinct-2 of the answers", "distinct-2 (unique word bigrams / bigrams), batch"),
    "repeat4_share": ("answers repeating a token 4+ times in a row", "share of the batch's answers"),
}
DEGENERATION_METRICS = ("distinct_2", "repeat4_share")
MAIN_FIGURE_METRICS = ("task_reward", "kl", "combined_reward", "response_length")
REWARD_UNITS = {
    "vader": "VADER compound score, −1…1",
    "vader-scaled": "3 × VADER compound score, −3…3",
    "vader-gain": "VADER(query + answer) − VADER(query)",
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
    "cory_norm": "#e377c2",
}
_SPARE_COLOURS = ("#e377c2", "#7f7f7f", "#bcbd22", "#843c39", "#5254a3")
LINESTYLES = {POLICY: "-", LLM1: "-", LLM2: "--"}


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` whole or not at all (``cory.targets.write_whole``), so that a report stopped
    mid-write leaves the old figure, never a cut one; a target that is not a regular file is refused."""
    path = Path(path)
    write_atomically(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".") or "png"))


def check_targets(folder: Path, *names: str) -> None:
    """Before anything is drawn: no file a command writes into ``folder`` (``names``, and every figure already
    there) is a pipe, a device or a folder, which writing it would replace, and ``folder``'s name is text the
    files can hold (the report writes it); a ReportError naming the first."""
    refusal = text_refusal(Path(folder).absolute(), "folder")
    if refusal:
        raise ReportError(refusal)
    for path in [Path(folder) / name for name in names] + sorted(Path(folder).glob("fig_*.png")):
        refusal = target_refusal(path, path.name)
        if refusal:
            raise ReportError(refusal)


def write_atomically(path: Path, text) -> None:
    """``path.write_text(text)``, whole or not at all (see ``save_figure``); ``text`` may be ``fill(tmp)``."""
    try:
        write_whole(path, text)
    except ConfigError as e:  # a pipe or a device in the folder: the commands drawing figures report a ReportError
        raise ReportError(str(e)) from None


def colour(method: str) -> str:
    if method in PALETTE:
        return PALETTE[method]
    # stable across runs and figures: derived from the name, not from the order of appearance
    return _SPARE_COLOURS[sum(map(ord, method)) % len(_SPARE_COLOURS)]


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


def _reward_unit(exp: Experiment, scored: bool = False) -> str:
    """The training reward's unit; ``scored``: the unit an evaluation scores in (a shaped reward's own)."""
    name = exp.any_config("reward_model")
    if scored:
        from cory.tasks import registered

        spec = registered().get(exp.runs_json.get("task") or exp.any_config("task"))
        name = spec.evaluation.scored_reward(name) if spec is not None else name
    return REWARD_UNITS.get(name, str(name) if name else "task's reward")


def _bounds(exp: Experiment, metric: str) -> tuple[float | None, float | None]:
    """Where a band is cut: KL and lengths are never negative; a bounded reward stays in its range. (r_c is
    not cut: its bounds depend on the KL.)"""
    if metric in ("kl", "response_length"):
        return 0.0, None
    if metric in DEGENERATION_METRICS:
        return 0.0, 1.0
    if metric == "task_reward":
        return REWARD_RANGES.get(exp.any_config("reward_model"), (None, None))
    return None, None


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
            lo, hi = _bounds(exp, metric)
            ax.fill_between(c.steps, np.clip(c.mean - c.std, lo, hi), np.clip(c.mean + c.std, lo, hi),
                            color=colour(group.method), alpha=0.12 if agent == LLM2 else 0.2, linewidth=0)
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
    save_figure(fig, path)
    return notes


def plot_sweep(exp: Experiment, path: Path, points) -> None:
    """The η frontier: each seed's final (KL, task reward) as a small point, each η's mean ± std over seeds as a
    large one, joined in η order, one colour per method (LLM2 dashed)."""
    fig, ax = _axes(f"{setting_name(exp)}: final task reward vs final KL over the KL coefficient η",
                    "final KL(π‖π₀), nats per response", f"final task reward ({_reward_unit(exp)})")
    kls = []
    for (method, agent), pts in sorted(points.items()):
        x = np.array([p[2].mean for p in pts])
        y = np.array([p[1].mean for p in pts])
        xerr = np.array([p[2].std if p[2].n >= 2 else 0.0 for p in pts])
        yerr = np.array([p[1].std if p[1].n >= 2 else 0.0 for p in pts])
        name = METHOD_NAMES.get(method, method) + AGENT_NAMES.get(agent, f"-{agent}")
        for _, r, kl in pts:  # one point per seed, matched by seed
            kl_by_seed = dict(zip(kl.seeds, kl.per_seed))
            xs = [kl_by_seed[s] for s in r.seeds if s in kl_by_seed]
            ys = [v for s, v in zip(r.seeds, r.per_seed) if s in kl_by_seed]
            ax.scatter(xs, ys, s=10, color=colour(method), alpha=0.35, linewidths=0,
                       marker="o" if agent != LLM2 else "^")
            kls += xs
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, color=colour(method), linestyle=LINESTYLES.get(agent, "-"),
                    marker="o", markersize=6, capsize=2, linewidth=1.5, label=f"{name} (mean ± std per η)")
        for (eta, _, _), xi, yi in zip(pts, x, y):
            ax.annotate(f"η={eta:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=colour(method))
        kls += list(x)
    positive = [k for k in kls if k > 0]
    if positive and len(positive) == len(kls) and max(positive) / min(positive) > 50:
        ax.set_xscale("log")
    ax.legend(fontsize=8, loc="best")
    save_figure(fig, path)


def plot_heldout(exp: Experiment, path: Path, series: list[tuple[Group, str]], base: float | None) -> bool:
    """Held-out task reward against iterations (the runs' own evaluations, eval.jsonl: mean ± std over seeds), or
    each final model's evaluation (eval_<task>.json) as a point at the runs' end, with the base model's as a
    grey line. False (and nothing drawn) when no run was evaluated."""
    fig, ax = _axes(f"{setting_name(exp)}: held-out task reward (mean ± std over seeds)",
                    "iterations completed", f"held-out task reward ({_reward_unit(exp, scored=True)})")
    drawn = 0
    for group, agent in series:
        style = dict(color=colour(group.method), linestyle=LINESTYLES.get(agent, "-"))
        c = heldout_curve(group, agent)
        if c is not None and len(c.steps):
            n = len(c.seeds)
            ax.plot(c.steps, c.mean, marker="o", markersize=3, linewidth=1.8,
                    label=f"{group.name(agent)} ({n} seed{'s' * (n != 1)})", **style)
            if n >= 2:
                ax.fill_between(c.steps, c.mean - c.std, c.mean + c.std, color=style["color"], alpha=0.15, linewidth=0)
            drawn += 1
            continue
        finals = [(run.last_step, heldout_value(run.final_evaluation(agent))) for run in group.runs.values()]
        finals = [(x + 1, y) for x, y in finals if x is not None and y is not None]
        if finals:
            xs, ys = np.array(finals, dtype=float).T
            ax.errorbar([xs.mean()], [ys.mean()], yerr=[ys.std(ddof=1) if len(ys) > 1 else 0.0], marker="o",
                        capsize=3, color=style["color"], label=f"{group.name(agent)}, final ({len(ys)} seeds)")
            drawn += 1
    if not drawn:
        return False
    if base is not None:
        ax.axhline(base, color="#555555", linestyle=":", linewidth=1.5, label=f"base model ({base:.3g})")
    ax.legend(fontsize=8, loc="best")
    save_figure(fig, path)
    return True


def plot_reward_vs_kl(exp: Experiment, path: Path, series: list[tuple[Group, str]], base: float | None,
                      grid: tuple[float, ...] = ()) -> bool:
    """The matched-KL reading's picture: held-out reward against held-out KL along training (eval.jsonl), every
    seed's path thin, the mean path per method and agent (mean KL and mean reward at each evaluation) thick, the
    base model as a point at KL 0 and the design's KL grid as vertical lines. False when no run has a path."""
    fig, ax = _axes(f"{setting_name(exp)}: held-out reward against held-out KL along training",
                    "held-out KL(π‖π₀), nats per answer", f"held-out task reward ({_reward_unit(exp, scored=True)})")
    drawn = 0
    for group, agent in series:
        kl, reward = heldout_curve(group, agent, "kl"), heldout_curve(group, agent, "task_reward")
        if kl is None or reward is None or len(kl.steps) < 2:
            continue
        steps = np.intersect1d(kl.steps, reward.steps)
        seeds = [s for s in kl.seeds if s in reward.seeds]
        k = kl.values[[kl.seeds.index(s) for s in seeds]][:, np.isin(kl.steps, steps)]
        r = reward.values[[reward.seeds.index(s) for s in seeds]][:, np.isin(reward.steps, steps)]
        style = dict(color=colour(group.method), linestyle=LINESTYLES.get(agent, "-"))
        for row_k, row_r in zip(k, r):
            ax.plot(row_k, row_r, linewidth=0.7, alpha=0.35, **style)
        ax.plot(k.mean(axis=0), r.mean(axis=0), marker="o", markersize=3, linewidth=2.0,
                label=f"{group.name(agent)} ({len(seeds)} seed{'s' * (len(seeds) != 1)}, iterations "
                      f"{steps[0]}–{steps[-1]})", **style)
        drawn += 1
    if not drawn:
        return False
    if base is not None:
        ax.plot([0.0], [base], marker="*", markersize=12, color="#555555", linestyle="none",
                label=f"base model ({base:.3g})")
    for k in grid:
        ax.axvline(k, color="#999999", linewidth=0.8, linestyle=":")
    ax.legend(fontsize=8, loc="best")
    save_figure(fig, path)
    return True


def plot_distinct_2(exp: Experiment, path: Path, series: list[tuple[Group, str]], base: float | None,
                    floor: float | None) -> bool:
    """The collapse test's picture: held-out distinct-2 against iterations (eval.jsonl), every seed thin, the mean
    per method and agent thick, the base model's as a dotted line and the design's collapse threshold dashed.
    False when no run has a held-out path."""
    fig, ax = _axes(f"{setting_name(exp)}: held-out distinct-2 along training (collapse: under the dashed line)",
                    "iterations completed", "held-out distinct-2 (distinct bigrams / bigrams)")
    drawn = 0
    for group, agent in series:
        c = heldout_curve(group, agent, "distinct_2")
        if c is None or len(c.steps) < 2:
            continue
        style = dict(color=colour(group.method), linestyle=LINESTYLES.get(agent, "-"))
        for row in c.values:
            ax.plot(c.steps, row, linewidth=0.7, alpha=0.35, **style)
        n = len(c.seeds)
        ax.plot(c.steps, c.mean, marker="o", markersize=3, linewidth=2.0,
                label=f"{group.name(agent)} ({n} seed{'s' * (n != 1)})", **style)
        drawn += 1
    if not drawn:
        return False
    if base is not None:
        ax.axhline(base, color="#555555", linestyle=":", linewidth=1.5, label=f"base model ({base:.3g})")
    if floor is not None:
        ax.axhline(floor, color="#aa2222", linestyle="--", linewidth=1.2, label=f"collapse threshold ({floor:.3g})")
    ax.set_ylim(0.0, 1.02)
    ax.legend(fontsize=8, loc="lower left")
    save_figure(fig, path)
    return True
