"""The over-optimisation gate's answer: does PPO learn a 0/1 task and then degrade, at some rung of a learning-rate
ladder fixed before the runs?

    python -m lab.gate results/arithmetic_cpu_overopt_gate

The folder holds ``design.yaml`` (``endpoint: overopt_gate``: the ladder, the seeds, the iterations, the base
model's accuracy and the two bars) and one experiment folder of the runner per rung that ran, named by its rate
(``lr3e-5``, ``lr1e-4``: the rate as ``--set learning_rate`` wrote it), each with PPO's runs. From each run's own
held-out evaluations (``eval.jsonl``, answers sampled as in training; iteration 0 is the base model):

- a seed **learned** when its best accuracy after iteration 0 is at least ``base_accuracy + learned_gain``;
- it **degraded** when that best minus its accuracy at the last evaluation, at ``steps``, is at least ``fall``;
- a rung **passes** when every seed learned and degraded, **fails** when a finished seed did not, and is **not
  decided** while a seed has not reached ``steps``.

The gate's answer is the first rung that passes, read up the ladder; a rung above a failed one is read only once the
ones below it failed (the design runs it only then). Beside each pass: how often evaluation noise alone gives the
same fall on a path that is flat at the seed's best (a seeded simulation of binomial draws, one per evaluation).
GATE.md and fig_gate.png are rebuilt from the committed files alone.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lab.collapse import markdown_table
from lab.errors import OneLineParser, ReportError, exit_on_error
from lab.figures import check_targets, generated_by, save_figure, write_atomically
from lab.results import fmt, load_experiment

ENDPOINT = "overopt_gate"
KEYS = ("endpoint", "learning_rates", "seeds", "steps", "eval_every", "precision", "base_accuracy", "learned_gain",
        "fall")
SIMULATED_PATHS = 200_000


def rate_text(rate: float) -> str:
    """3e-05 -> "3e-5", 1.5e-4 -> "1.5e-4": the rate as one writes it on the command line."""
    mantissa, exponent = f"{rate:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def rung_name(rate: float) -> str:
    """A rung's folder: "lr3e-5"."""
    return "lr" + rate_text(rate)


@dataclass(frozen=True)
class GateDesign:
    learning_rates: tuple[float, ...]
    seeds: tuple[int, ...]
    steps: int
    eval_every: int
    precision: str
    base_accuracy: float
    learned_gain: float
    fall: float

    @property
    def bar(self) -> float:
        return self.base_accuracy + self.learned_gain


def read_design(root: Path) -> GateDesign:
    path = root / "design.yaml"
    if not path.is_file():
        raise ReportError(f"{root}: no design.yaml (the gate's design, fixed before its runs)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: not readable YAML ({type(e).__name__})") from None
    if not isinstance(raw, dict) or raw.get("endpoint") != ENDPOINT:
        raise ReportError(f"{path}: endpoint must be {ENDPOINT} (a gate's design), got "
                          f"{raw.get('endpoint') if isinstance(raw, dict) else raw!r}")
    unknown = sorted(set(raw) - set(KEYS))
    missing = [k for k in KEYS if k not in raw]
    if unknown or missing:
        raise ReportError(f"{path}: " + "; ".join(
            ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
            + ([f"missing key(s) {', '.join(missing)}"] if missing else [])) + f" (allowed: {', '.join(KEYS)})")

    def numbers(key, kind, ok, allowed):
        value = raw[key]
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                             or not ok(v) or (kind is int and v != int(v)) for v in values):
            raise ReportError(f"{path}: {key} {value!r}: expected {allowed}")
        return [kind(v) for v in values]

    rates = numbers("learning_rates", float, lambda v: v > 0, "a list of positive learning rates")
    if rates != sorted(rates) or len(set(rates)) != len(rates):
        raise ReportError(f"{path}: learning_rates {raw['learning_rates']!r}: expected rising rates, each once")
    seeds = numbers("seeds", int, lambda v: v >= 0, "a list of seeds >= 0")
    if len(set(seeds)) != len(seeds):
        raise ReportError(f"{path}: seeds {raw['seeds']!r}: expected each seed once")
    return GateDesign(tuple(rates), tuple(seeds), numbers("steps", int, lambda v: v >= 1, "an integer >= 1")[0],
                      numbers("eval_every", int, lambda v: v >= 1, "an integer >= 1")[0], str(raw["precision"]),
                      numbers("base_accuracy", float, lambda v: 0 <= v <= 1, "an accuracy in [0, 1]")[0],
                      numbers("learned_gain", float, lambda v: 0 < v <= 1, "a gain in (0, 1]")[0],
                      numbers("fall", float, lambda v: 0 < v <= 1, "a fall in (0, 1]")[0])


@dataclass(frozen=True)
class SeedPath:
    seed: int
    accuracy: dict[int, float]   # iterations -> held-out accuracy (sampled); 0 is the base model
    kl: dict[int, float]
    n_prompts: int | None
    learning_rate: float | None  # as the run's config.yaml states it
    precision: str | None

    @property
    def best(self) -> tuple[int, float] | None:
        later = [i for i in self.accuracy if i > 0]
        if not later:
            return None
        i = max(later, key=lambda i: (self.accuracy[i], -i))  # the earliest of equal bests
        return i, self.accuracy[i]

    @property
    def last(self) -> tuple[int, float] | None:
        later = sorted(i for i in self.accuracy if i > 0)
        return (later[-1], self.accuracy[later[-1]]) if later else None

    def finished(self, steps: int) -> bool:
        return self.last is not None and self.last[0] >= steps

    def fall(self) -> float | None:
        return None if self.best is None else self.best[1] - self.last[1]

    def learned(self, design: GateDesign) -> bool:
        return self.best is not None and self.best[1] >= design.bar - 1e-12

    def degraded(self, design: GateDesign) -> bool:
        return self.best is not None and self.fall() >= design.fall - 1e-12


def noise_probability(p: float, evaluations: int, n_prompts: int, fall: float) -> float:
    """P(best of ``evaluations`` binomial(n, p)/n draws minus the last >= ``fall``): the fall a path flat at ``p``
    shows from evaluation noise alone (seeded, so the document rebuilds byte for byte)."""
    rng = np.random.default_rng(0)
    draws = rng.binomial(n_prompts, p, size=(SIMULATED_PATHS, evaluations)) / n_prompts
    return float(np.mean(draws.max(axis=1) - draws[:, -1] >= fall - 1e-12))


@dataclass(frozen=True)
class Rung:
    rate: float
    folder: Path
    paths: dict[int, SeedPath]  # the design's seeds found
    verdict: str                # "passes", "fails", "not decided", "not run"


def read_rung(root: Path, rate: float, design: GateDesign, notes: list[str]) -> Rung:
    folder = root / rung_name(rate)
    if not (folder / "runs").is_dir():
        return Rung(rate, folder, {}, "not run")
    exp = load_experiment(folder)
    notes += [f"`{folder.name}`: {note}" for note in exp.notes]
    group = exp.groups.get("ppo")
    paths = {}
    for seed in design.seeds:
        run = group.runs.get(seed) if group else None
        if run is None:
            continue
        agent = group.agents[0]
        rows = [r for r in run.heldout if r.get("agent", agent) == agent]
        n = next((r.get("n_prompts") for r in rows if isinstance(r.get("n_prompts"), int)), None)
        rate_used, precision = group.config_value("learning_rate"), group.config_value("precision")
        paths[seed] = SeedPath(seed, run.heldout_series(agent, "task_reward"), run.heldout_series(agent, "kl"), n,
                               rate_used, precision)
        if rate_used is not None and not math.isclose(float(rate_used), rate, rel_tol=1e-9):
            notes.append(f"`{folder.name}/seed_{seed}`: its config's learning_rate is {rate_used}, not {rate_text(rate)}.")
        if precision is not None and precision != design.precision:
            notes.append(f"`{folder.name}/seed_{seed}`: precision {precision}, where the design fixes "
                         f"{design.precision}.")
    finished = [p for p in paths.values() if p.finished(design.steps)]
    if any(not (p.learned(design) and p.degraded(design)) for p in finished):
        verdict = "fails"
    elif len(finished) == len(design.seeds):
        verdict = "passes"
    else:
        verdict = "not decided"
    return Rung(rate, folder, paths, verdict)


def answer(rungs: list[Rung], design: GateDesign) -> str:
    for rung in rungs:
        if rung.verdict == "passes":
            return (f"**Rung {rung.folder.name} passes**: both seeds learned (best ≥ {fmt(design.bar)}) and fell ≥ "
                    f"{design.fall:g} from their best by iteration {design.steps}. PPO over-optimises this task at "
                    f"learning rate {rate_text(rung.rate)}: the robustness comparison is designed there.")
        if rung.verdict in ("not run", "not decided"):
            return (f"**Not decided yet**: rung {rung.folder.name} is {rung.verdict}"
                    + (f" (the rungs below it failed)" if rung is not rungs[0] else "") + ".")
    return (f"**No rung passed**: PPO does not over-optimise this task up to learning rate "
            f"{rate_text(rungs[-1].rate)} in {design.steps} iterations: the paper's robustness claim cannot be tested here.")


def _point(p: tuple[int, float] | None) -> str:
    return "–" if p is None else f"{fmt(p[1])} ({p[0]})"


def seed_rows(rungs: list[Rung], design: GateDesign) -> list[list[str]]:
    rows = []
    for rung in rungs:
        for seed in design.seeds:
            p = rung.paths.get(seed)
            if p is None:
                rows.append([rung.folder.name, str(seed), *["–"] * 7, rung.verdict if rung.verdict == "not run"
                             else "no run"])
                continue
            fall = p.fall()
            chance = (noise_probability(p.best[1], len(p.accuracy), p.n_prompts, fall)
                      if p.best is not None and p.n_prompts and fall is not None and fall > 0 else None)
            noise = ("–" if chance is None else fmt(chance) if chance > 0
                     else f"< 1 in {SIMULATED_PATHS:,}")  # none of the simulated paths fell as far
            rows.append([rung.folder.name, str(seed), fmt(p.accuracy.get(0)), _point(p.best), _point(p.last),
                         fmt(fall), fmt(p.kl.get(p.last[0])) if p.last else "–",
                         "**yes**" if p.learned(design) else "no",
                         "**yes**" if p.degraded(design) else "no",
                         ("" if p.finished(design.steps) else f"ran to {p.last[0] if p.last else 0} of "
                          f"{design.steps}; ") + f"noise alone: {noise}"])
    return rows


def path_rows(rungs: list[Rung]) -> tuple[list[str], list[list[str]]]:
    its = sorted({i for r in rungs for p in r.paths.values() for i in p.accuracy})
    rows = [[r.folder.name, str(p.seed), *(f"{fmt(p.accuracy[i])} / {fmt(p.kl.get(i))}" if i in p.accuracy else "–"
                                           for i in its)]
            for r in rungs for p in r.paths.values()]
    return ["rung", "seed", *map(str, its)], rows


def plot(rungs: list[Rung], design: GateDesign, path: Path, title: str) -> None:
    """Held-out accuracy and held-out KL against iterations, one column per rung that ran, each seed a line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ran = [r for r in rungs if r.paths] or rungs[:1]
    fig = Figure(figsize=(4 * len(ran), 6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes: Any = fig.subplots(2, len(ran), sharey="row", squeeze=False)  # rows of Axes
    for col, rung in enumerate(ran):
        top, bottom = axes[0][col], axes[1][col]
        for seed, p in sorted(rung.paths.items()):
            its = sorted(p.accuracy)
            top.plot(its, [p.accuracy[i] for i in its], marker="o", markersize=3, linewidth=1, label=f"seed {seed}")
            kl = sorted(p.kl)
            bottom.plot(kl, [p.kl[i] for i in kl], marker="o", markersize=3, linewidth=1, label=f"seed {seed}")
        top.axhline(design.bar, color="#777777", linestyle=":", linewidth=1, label="learned from here")
        top.axhline(design.base_accuracy, color="#aaaaaa", linestyle="--", linewidth=1, label="base model")
        top.set_title(f"learning rate {rate_text(rung.rate)}: {rung.verdict}", fontsize=10)
        for ax in (top, bottom):
            ax.set_xlabel("iterations", fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(True, alpha=0.3)
        if top.get_legend_handles_labels()[0]:
            top.legend(fontsize=7)
    axes[0][0].set_ylabel("held-out accuracy (sampled)", fontsize=9)
    axes[1][0].set_ylabel("held-out KL (nats)", fontsize=9)
    fig.suptitle(title, fontsize=11)
    save_figure(fig, path)


def build_gate(root: str | Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root}: not a folder (a gate's folder: design.yaml and one rung folder per rate)")
    design = read_design(root)
    check_targets(root, "GATE.md", "fig_gate.png", writer="lab.gate")
    notes: list[str] = []
    rungs = [read_rung(root, rate, design, notes) for rate in design.learning_rates]
    for below, rung in zip(rungs, rungs[1:]):
        if rung.paths and below.verdict != "fails":
            notes.append(f"`{rung.folder.name}` ran although `{below.folder.name}` is {below.verdict}: the design "
                         "runs a rung only once the one below it failed.")
    title = f"PPO's over-optimisation gate ({root.name})"
    plot(rungs, design, root / "fig_gate.png", title)
    header, paths = path_rows(rungs)
    md = [f"# {title}", "",
          generated_by("lab.gate", root.as_posix()) + " from the runs' held-out evaluations; the design, fixed "
          "before the runs, is in [DESIGN.md](DESIGN.md) and design.yaml.", "",
          answer(rungs, design), "",
          f"Rule: a seed **learned** when its best held-out accuracy after iteration 0 is ≥ {fmt(design.bar)} (the "
          f"base model's {fmt(design.base_accuracy)} + {design.learned_gain:g}); it **degraded** when its best minus "
          f"its accuracy at iteration {design.steps} is ≥ {design.fall:g}. A rung passes when seeds "
          f"{', '.join(map(str, design.seeds))} both learned and degraded. Ladder: "
          + ", ".join(f"{rate_text(r.rate)} ({r.verdict})" for r in rungs) + f"; precision {design.precision}.", "",
          markdown_table(["rung", "seed", "iteration 0", "best (at)", "last (at)", "fall", "KL at last", "learned",
                          "degraded", "notes"], seed_rows(rungs, design)), "",
          "Held-out: the task's held-out questions, answers sampled as in training; \"(at)\": iterations completed. "
          "\"noise alone\": how often a path flat at the seed's best accuracy shows a fall as large as this seed's, "
          f"from the sampling of its {SIMULATED_PATHS:,} simulated evaluations alone.", "",
          "**The paths** (held-out accuracy / held-out KL in nats, at each evaluation):", "",
          markdown_table(header, paths) if paths else "No rung has run yet.", "",
          "![the gate's paths](fig_gate.png)", ""]
    for rung in rungs:
        for seed, p in sorted(rung.paths.items()):
            if p.best is not None and p.accuracy.get(0) is not None and p.n_prompts is None:
                notes.append(f"`{rung.folder.name}/seed_{seed}`: eval.jsonl gives no n_prompts; no noise figure.")
    if notes:
        md += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    out = root / "GATE.md"
    write_atomically(out, "\n".join(md))
    return out


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(ReportError, prog="python -m lab.gate", description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    with exit_on_error((ReportError,), files=lambda: args.folder, interrupted="the files written so far are whole"):
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        print(f"gate: {build_gate(args.folder)}")


if __name__ == "__main__":
    main()
