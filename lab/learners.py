"""A learner pilot's summary: with another advantage estimator (``advantage_estimator``: rloo, grpo), does each
method learn, what does an iteration cost against GAE's, and does CORY's observer still use the pioneer's answer?

    python -m lab.learners results/arithmetic_cpu_rloo_pilot [--against results/arithmetic_cpu_horizon]
        [--min_gain 0.15]

The folder is an experiment folder of the runner (``lab.experiments``, its PPO and CORY runs at one estimator);
``--against`` is one of the same task at GAE, read alongside. For every method, agent and seed, from the run's own
held-out evaluations (``eval.jsonl``, answers sampled as in training; iteration 0 is the base model): the accuracy
at iteration 0, the best after it and where, the last, and the held-out KL at the last. A seed **learned** when its
best is at least ``min_gain`` above its own iteration 0 (the pilot's design fixes ``min_gain`` before its runs).
s / iteration is the median of the run's ``time/iteration_s`` after its first iteration (its evaluations not
included), and a learner's cost is set against GAE's only among runs that computed alike: the same precision on the
same kind of CPU, as each run's log states it (``precision: bf16 (auto on a CPU with AVX-512 BF16 ...)``), since
bf16 on AVX-512 BF16 runs an iteration 1.24-1.48x faster than fp32 and a machine can be faster still. The
knowledge transfer of the CORY runs is lab.transfer's tables, in training and on the held-out questions.
Descriptive: the pilot says whether a comparison of the learners is worth designing, and claims none. SUMMARY.md
and fig_learners.png are rebuilt from the committed files alone.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cory.run.targets import stopped_as_interrupt
from lab.collapse import markdown_table
from lab.errors import OneLineParser, ReportError, exit_on_error
from lab.figures import check_targets, generated_by, integer_iterations, save_figure, write_atomically
from lab.compute import compute_of
from lab.results import METHOD_NAMES, Experiment, Group, finite, fmt, load_experiment, setting_name
from cory.metrics import TRANSFER_KEYS
from lab.transfer import NAMES, RULE, heldout_lines, recorded, sawtooth_lines, training_windows

MIN_GAIN = 0.15  # the learner issue's bar: held-out accuracy at least the base model's + 0.15
METHODS = ("ppo", "cory")


@dataclass(frozen=True)
class AgentSeed:
    """One agent of one run, read off its held-out evaluations."""
    name: str             # "PPO", "CORY-LLM1", ...
    seed: int
    base: float           # held-out accuracy at iteration 0 (the base model)
    best: tuple[int, float] | None  # (iterations, accuracy) of the best evaluation after iteration 0
    last: tuple[int, float] | None  # the last evaluation after iteration 0
    last_kl: float | None
    seconds: float | None  # median s / iteration after the first
    compute: str = "?"     # "bf16, AVX-512 BF16": the precision and the CPU's kind, from the run's log

    def learned(self, min_gain: float) -> bool:
        return self.best is not None and self.best[1] - self.base >= min_gain - 1e-12


def estimator(group: Group) -> str:
    """The group's learner, "rloo, K = 4"; a run from before the switch (no such field) is GAE's."""
    name = group.config_value("advantage_estimator") or "gae"
    k = group.config_value("num_generations") or 1
    return str(name) if k == 1 else f"{name}, K = {k}"


def _load(folder: str | Path) -> Experiment:
    """The folder's runs, their names without the learner: the summary names it beside each (its learner column,
    its legend, its headings), as ``estimator`` writes it."""
    exp = load_experiment(folder)
    for group in exp.groups.values():
        group.learner_in_name = False
    return exp


def _median_iteration_s(group: Group, seed: int) -> float | None:
    times = [t for row in group.runs[seed].rows
             if isinstance(row.get("step"), int) and row["step"] > 0
             and (t := finite(row.get("time/iteration_s"))) is not None]
    return float(np.median(times)) if times else None


def read_agent(group: Group, agent: str, seed: int, notes: list[str]) -> AgentSeed | None:
    """``agent`` of ``seed``'s run; None (named in ``notes``) without an iteration-0 evaluation and a later one."""
    run = group.runs[seed]
    accuracy, kl = run.heldout_series(agent, "task_reward"), run.heldout_series(agent, "kl")
    later = sorted(i for i in accuracy if i > 0)
    if 0 not in accuracy or not later:
        notes.append(f"`{group.label}/seed_{seed}`: no held-out evaluation of {group.name(agent)} at iteration 0 "
                     "and a later one (eval.jsonl); left out.")
        return None
    best = max(later, key=lambda i: (accuracy[i], -i))  # the earliest of equal bests
    return AgentSeed(group.name(agent), seed, accuracy[0], (best, accuracy[best]), (later[-1], accuracy[later[-1]]),
                     kl.get(later[-1]), _median_iteration_s(group, seed),
                     compute_of(run.path.parents[2], group.label, seed))  # <folder>/runs/<label>/seed_<n>


def read_folder(exp: Experiment, notes: list[str]) -> list[tuple[str, list[AgentSeed]]]:
    """(estimator, agent-seeds) per method group of the folder, PPO's first."""
    out = []
    for label, group in sorted(exp.groups.items()):
        if group.method not in METHODS or not group.runs:
            continue
        rows = [r for agent in group.agents for seed in sorted(group.runs)
                if (r := read_agent(group, agent, seed, notes)) is not None]
        out.append((METHODS.index(group.method), estimator(group), rows))
    return [(est, rows) for _, est, rows in sorted(out, key=lambda t: t[0])]


def _point(p: tuple[int, float] | None) -> str:
    return "–" if p is None else f"{fmt(p[1])} ({p[0]})"


def seed_table(folders: list[tuple[str, list[tuple[str, list[AgentSeed]]]]], min_gain: float) -> str:
    rows = [[where, est, a.name, str(a.seed), fmt(a.base), _point(a.best), _point(a.last), fmt(a.last_kl),
             "**yes**" if a.learned(min_gain) else "no", fmt(a.seconds), a.compute]
            for where, groups in folders for est, agents in groups for a in agents]
    return markdown_table(["folder", "learner", "agent", "seed", "iteration 0", "best (at)", "last (at)",
                           "KL at last", f"learned (≥ +{min_gain:g})", "s / iteration", "precision, CPU"], rows)


def cost_lines(folders: list[tuple[str, list[tuple[str, list[AgentSeed]]]]]) -> list[str]:
    """Per method: each learner's median s / iteration over its seeds, per precision and CPU kind, and the ratio to
    GAE's where GAE ran alike (an unknown kind, "?", is set against nothing)."""
    by_method: dict[str, dict[tuple[str, str], list[float]]] = {}
    for _, groups in folders:
        for est, agents in groups:
            method = agents[0].name.split("-")[0] if agents else "?"
            seen = {(a.seed, a.compute): a.seconds for a in agents if a.seconds is not None}
            for (_, compute), s in seen.items():
                by_method.setdefault(method, {}).setdefault((est, compute), []).append(s)
    lines = []
    for method, by_est in by_method.items():
        medians = {key: float(np.median(v)) for key, v in by_est.items() if v}
        parts = []
        for (est, compute), s in medians.items():
            gae = medians.get(("gae", compute)) if compute != "?" else None
            ratio = (f" ({fmt(s / gae)}x GAE's alike)" if gae else " (no GAE run alike)") if est != "gae" else ""
            n = len(by_est[est, compute])
            parts.append(f"{est} on {compute}: {fmt(s)} s ({n} seed{'' if n == 1 else 's'})" + ratio)
        if parts:
            lines.append(f"- {method}: " + "; ".join(parts))
    return lines


def plot(folders: list[tuple[str, Experiment]], path: Path, title: str, bar: float | None) -> None:
    """Held-out accuracy against iterations, one panel per agent; each learner of each folder a colour (GAE's
    folders may differ in precision and CPU), each seed a line; ``bar``: the accuracy that counts as learned
    (dotted)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = ["PPO", "CORY-LLM1", "CORY-LLM2"]
    fig = Figure(figsize=(12, 3.8), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3, sharey=True)
    colours = {}
    for where, exp in folders:
        for group in exp.groups.values():
            if group.method not in METHODS:
                continue
            est = estimator(group)
            c = colours.setdefault((est, where), ["#1f77b4", "#d62728", "#ff7f0e", "#9467bd", "#2ca02c",
                                                  "#8c564b"][len(colours) % 6])
            for agent in group.agents:
                ax = axes[names.index(group.name(agent))] if group.name(agent) in names else None
                for seed, run in sorted(group.runs.items()):
                    series = run.heldout_series(agent, "task_reward")
                    if ax is not None and series:
                        its = sorted(series)
                        ax.plot(its, [series[i] for i in its], color=c, marker="o", markersize=2.5, linewidth=1,
                                label=f"{est} ({where})" if seed == min(group.runs) else None)
    for ax, name in zip(axes, names):
        if bar is not None:
            ax.axhline(bar, color="#777777", linestyle=":", linewidth=1, label="learned from here")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("iterations", fontsize=9)
        integer_iterations(ax)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("held-out accuracy (sampled)", fontsize=9)
    fig.suptitle(title, fontsize=11)
    save_figure(fig, path)


def transfer_lines(groups: list[tuple[str, Group]]) -> list[str]:
    lines = []
    for est, group in groups:
        if recorded(group):
            name = METHOD_NAMES.get(group.method, group.method)
            lines += [f"**{name} with {est}**, in training (each seed's mean over a stint of roles, then over seeds):",
                      "",
                      markdown_table(["iterations", "observer", *(NAMES[k] for k in TRANSFER_KEYS)],
                                     training_windows(group)), ""]
            held_out = heldout_lines(group)
            if held_out:
                lines += [*held_out, ""]
            sawtooth = sawtooth_lines(group)
            if sawtooth:
                lines += [*sawtooth, ""]
    return ([RULE, ""] + lines) if lines else ["No CORY run here recorded the transfer.", ""]


def build_summary(root: str | Path, against: str | Path | list | None = None, min_gain: float = MIN_GAIN) -> Path:
    if not math.isfinite(min_gain) or min_gain < 0:  # before anything is read
        raise ReportError(f"--min_gain: expected a finite number, got {min_gain:g}; allowed: 0 or more (the held-out "
                          "accuracy above a run's own iteration 0 that counts as learned)")
    root = Path(root)
    against = [] if against is None else [against] if isinstance(against, (str, Path)) else list(against)
    if not (root / "runs").is_dir():
        raise ReportError(f"{root}: no runs/ folder (an experiment folder written by lab.experiments)")
    seen = {root.resolve(): root}
    for other in against:
        if not (Path(other) / "runs").is_dir():
            raise ReportError(f"--against {other}: no runs/ folder (an experiment folder written by lab.experiments)")
        if Path(other).resolve() in seen:  # its rows would be read, and counted, twice
            first = seen[Path(other).resolve()]
            raise ReportError(f"--against {other}: {'the folder summarised' if first is root else 'given already'} "
                              f"({first}); give each other folder once, and not the folder itself")
        seen[Path(other).resolve()] = Path(other)
    check_targets(root, "SUMMARY.md", writer="lab.learners")  # opens none but regular files: a pipe is a target here
    notes: list[str] = []
    exps = [(root.name, _load(root))] + [(Path(other).name, _load(other)) for other in against]
    read = [(where, read_folder(exp, notes)) for where, exp in exps]
    notes += [f"`{where}`: {note}" for where, exp in exps for note in exp.notes]
    ours = read[0][1]
    agents = [a for _, rows in ours for a in rows]
    learned = sum(a.learned(min_gain) for a in agents)
    title = f"{setting_name(exps[0][1])}: the learner pilot"
    bases = [a.base for a in agents]
    plot(exps, root / "fig_learners.png", title, float(np.mean(bases)) + min_gain if bases else None)
    arguments = (root.as_posix() + "".join(f" --against {Path(other).as_posix()}" for other in against)
                 + (f" --min_gain {min_gain:g}" if min_gain != MIN_GAIN else ""))
    invocations = exps[0][1].runs_json.get("invocations") or []
    md = [f"# {title}", "",
          generated_by("lab.learners", arguments) + f" from the metrics in the folder{'s' if against else ''}; "
          + ("the design, fixed before the runs, is in [DESIGN.md](DESIGN.md). " if (root / "DESIGN.md").is_file()
             else "") + "Descriptive: no comparison is claimed.", "",
          *(["Runs: " + "; ".join(f"`{i.get('command')}` at {str(i.get('git_commit'))[:7]}"
                                  + (" (with uncommitted changes)" if i.get("git_dirty") else "")  # as the report
                                  for i in invocations), ""]
            if invocations else []),
          f"**Learned** (best held-out accuracy after iteration 0 at least {min_gain:g} above the run's own "
          f"iteration 0): **{learned} of {len(agents)}** agent-seeds of `{root.name}`.", "",
          seed_table(read, min_gain), "",
          "Held-out: the task's held-out questions, answers sampled as in training; \"(at)\": iterations completed. "
          "s / iteration: the median over a run's iterations after the first, its evaluations not included.", "",
          "**Cost per iteration** (median over seeds, per precision and CPU kind as each run's log states them; "
          "a ratio only against GAE's runs alike; runs of another folder may come from another commit or a busier "
          "machine, see each folder's runs.json):", "", *cost_lines(read), "",
          "![held-out accuracy](fig_learners.png)", "",
          "## Knowledge transfer", "",
          *transfer_lines([(estimator(g), g) for g in exps[0][1].groups.values() if g.method == "cory" and g.runs])]
    if notes:
        md += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    out = root / "SUMMARY.md"
    write_atomically(out, "\n".join(md))
    return out


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(ReportError, prog="python -m lab.learners", description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--against", action="append", default=None,
                   help="an experiment folder of the same task at GAE, read alongside (may be given again)")
    p.add_argument("--min_gain", type=float, default=MIN_GAIN,
                   help=f"held-out accuracy above iteration 0 that counts as learned (default {MIN_GAIN:g})")
    # SUMMARY.md and the figure are written whole (write_atomically, save_figure): a stop, SIGTERM too, leaves each
    # as it was and no temporary file
    with exit_on_error((ReportError,), files=lambda: args.folder, interrupted="the files written so far are whole"):
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        with stopped_as_interrupt():
            summary = build_summary(args.folder, args.against, args.min_gain)
    print(f"summary: {summary}")


if __name__ == "__main__":
    main()
