"""Did CORY's observer use the pioneer's answer? The knowledge transfer a CORY run records (``cory.metrics
.knowledge_transfer``), read along training for a report: per training batch (``metrics.jsonl``, the observer of that
iteration) and at each held-out evaluation (``eval.jsonl``, each agent as the observer of the other's held-out
answers; iteration 0 is the base model). Descriptive: the paper's mechanism presumes the observer copies a correct
answer or corrects a wrong one, and a comparison of CORY with PPO reads differently where it does not.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from lab.collapse import markdown_table
from lab.results import Experiment, Group, finite, fmt
from cory.metrics import TRANSFER_KEYS, UNRELATED_KEYS

NAMES = {"transfer/observer_minus_pioneer": "observer − pioneer", "transfer/copy_rate": "copy rate",
         "transfer/correction_rate": "correction rate",
         "transfer/unrelated_copy_rate": "copy rate, unrelated ref.", "transfer/echo_rate": "echo, unrelated ref."}
Y_LABELS = {"transfer/observer_minus_pioneer": "observer's task reward − pioneer's",
            "transfer/copy_rate": "P(observer right | pioneer right)",
            "transfer/correction_rate": "P(observer right | pioneer wrong)"}

RULE = (
    "_Descriptive._ **observer − pioneer**: the observer's mean task reward minus the pioneer's on the same "
    "questions; **copy rate**: P(observer right | pioneer right); **correction rate**: P(observer right | pioneer "
    "wrong) (the rates for a 0/1 reward only). In training, the batch's observer answered with the pioneer's answer "
    "of that iteration as its reference; at a held-out evaluation, each agent answered every held-out question as "
    "the observer, with the other agent's held-out answer (sampled as in training) as its reference (iteration 0: "
    "the base model reading its own answers). Mean ± SE over seeds; \"–\" where no seed's value is defined (no "
    "pioneer answer right, or wrong). Above 0 and a copy rate near 1: the observer uses the reference. **observer − "
    "itself alone** (held-out; a control): the observer's accuracy with the reference minus its own accuracy "
    "answering the same questions alone; near 0, the reference changed nothing it would not have got right anyway.")
CONTROL_RULE = (
    "**copy rate, unrelated ref.** and **echo, unrelated ref.** (held-out, where recorded; a control): each question "
    "shown the other agent's answer to the next question instead; P(observer right | the other agent's answer to "
    "this question was right, unseen), and P(the observer's answer is right for the shown answer's question | that "
    "answer was right): a copy rate with the reference no higher than this one is easy questions, not the reference; "
    "a high echo is an observer writing down what it is shown.")


def _cell(values: list[float], of: int) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "–"
    mean = float(np.mean(values))
    se = float(np.std(values, ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    out = fmt(mean) + (f" ± {fmt(se if se > 1e-12 else 0.0)}" if len(values) > 1 else "")  # equal seeds: no spread
    return out + ("" if len(values) == of else f" ({len(values)})")


def _swap_period(group: Group) -> int:
    period = group.config_value("swap_period")
    return period if isinstance(period, int) and not isinstance(period, bool) and period > 0 else 0


def training_windows(group: Group) -> list[list[str]]:
    """One row per stint of roles (``swap_period`` iterations; the whole run without exchanges) and measure: the
    observer's transfer in training, each seed's mean over the stint, then mean ± SE over seeds."""
    period = _swap_period(group)
    per_seed: dict[int, dict[int, dict[str, list[float]]]] = {}  # seed -> stint -> key -> values
    observer_of: dict[int, str] = {}
    for seed, run in group.runs.items():
        for row in run.rows:
            step = row.get("step")
            if not isinstance(step, int) or isinstance(step, bool) or TRANSFER_KEYS[0] not in row:
                continue
            stint = step // period if period else 0
            pioneer = row.get("pioneer")
            observer_of.setdefault(stint, next((a for a in group.agents if a != pioneer), "?"))
            for key in TRANSFER_KEYS:
                value = finite(row.get(key))
                if value is not None:
                    per_seed.setdefault(seed, {}).setdefault(stint, {}).setdefault(key, []).append(value)
    rows = []
    for stint in sorted({s for stints in per_seed.values() for s in stints}):
        first = stint * period
        span = f"{first}-{first + period - 1}" if period else "all"
        cells = [_cell([float(np.mean(v[stint][key])) for v in per_seed.values()
                        if stint in v and key in v[stint]], len(per_seed)) for key in TRANSFER_KEYS]
        rows.append([span, group.name(observer_of.get(stint, "?")), *cells])
    return rows


ALONE = "observer − itself alone"  # the no-reference control: with the reference against its own answers alone


def _with_minus_alone(group: Group, agent: str) -> dict[int, dict[int, float]]:
    """seed -> iterations -> ``agent``'s held-out accuracy as the observer minus its own accuracy answering alone on
    the same questions: (observer − pioneer) + the other agent's accuracy alone − its own (all three recorded)."""
    other = next((a for a in group.agents if a != agent), None)
    out = {}
    for seed, run in group.runs.items():
        gap, mine = run.heldout_series(agent, TRANSFER_KEYS[0]), run.heldout_series(agent, "task_reward")
        theirs = run.heldout_series(other, "task_reward") if other else {}
        out[seed] = {i: gap[i] + theirs[i] - mine[i] for i in gap if i in mine and i in theirs}
    return out


def heldout_rows(group: Group) -> tuple[list[int], list[list[str]]]:
    """(evaluated iterations, one row per agent as the observer and measure, mean ± SE over seeds): the three
    transfer measures, and the observer with the reference against itself answering alone (a control: a copy rate
    of 0.9 means little where the observer is right alone as often)."""
    # the unrelated-reference control where the runs recorded it (runs before it have no such rows)
    controls = [k for k in UNRELATED_KEYS if any(r.heldout_series(a, k) for r in group.runs.values()
                                                 for a in group.agents)]
    series = {(a, k): {s: r.heldout_series(a, k) for s, r in group.runs.items()}
              for a in group.agents for k in (*TRANSFER_KEYS, *controls)}
    for a in group.agents:
        series[a, ALONE] = _with_minus_alone(group, a)
    iterations = sorted({i for by_seed in series.values() for d in by_seed.values() for i in d})
    rows = [[group.name(a), NAMES.get(k, k), *(_cell([d[i] for d in series[a, k].values() if i in d],
                                                     len(group.runs)) for i in iterations)]
            for a in group.agents for k in (*TRANSFER_KEYS, ALONE, *controls)]
    return iterations, rows


def stints(group: Group) -> list[tuple[str, int, str, dict[int, float]]]:
    """The role-phase sawtooth: per agent and stint of roles (``swap_period`` iterations), the change of its held-out
    accuracy answering alone from the evaluation at the stint's start to the one at its end, per seed, with the role
    it had in that stint (from the training rows' ``pioneer``). (agent, first iteration, role, seed -> change); a
    stint counts only where both its ends were evaluated."""
    period = _swap_period(group)
    if not period:
        return []
    out = []
    roles: dict[int, dict[int, str]] = {}  # seed -> stint -> its pioneer
    for seed, run in group.runs.items():
        for row in run.rows:
            step = row.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and isinstance(row.get("pioneer"), str):
                roles.setdefault(seed, {}).setdefault(step // period, row["pioneer"])
    last = max((i for r in group.runs.values() for a in group.agents for i in r.heldout_series(a, "task_reward")),
               default=0)
    for agent in group.agents:
        for k in range(last // period):
            start, end = k * period, (k + 1) * period
            by_role: dict[str, dict[int, float]] = {}
            for seed, run in group.runs.items():
                accuracy, pioneer = run.heldout_series(agent, "task_reward"), roles.get(seed, {}).get(k)
                if start in accuracy and end in accuracy and pioneer is not None:
                    role = "pioneer" if pioneer == agent else "observer"
                    by_role.setdefault(role, {})[seed] = accuracy[end] - accuracy[start]
            out += [(agent, start, role, changes) for role, changes in sorted(by_role.items())]
    return out


def sawtooth_lines(group: Group) -> list[str]:
    """The per-stint table and, per agent and role, the mean change per stint and how many stint-seeds fell; none
    where no stint had both ends evaluated."""
    found = stints(group)
    if not found:
        return []
    rows = [[group.name(agent), f"{start}-{start + _swap_period(group)}", role, _cell(list(changes.values()),
                                                                                  len(group.runs)),
             f"{sum(c < 0 for c in changes.values())} of {len(changes)}"]
            for agent, start, role, changes in found]
    summary = []
    for agent in group.agents:
        for role in ("pioneer", "observer"):
            changes = [c for a, _, r, ch in found if a == agent and r == role for c in ch.values()]
            if changes:
                mean = float(np.mean(changes))
                se = float(np.std(changes, ddof=1)) / math.sqrt(len(changes)) if len(changes) > 1 else 0.0
                summary.append(f"- {group.name(agent)} as the {role}: {fmt(mean)} ± {fmt(se if se > 1e-12 else 0.0)} "
                               f"per stint (SE over "
                               f"{len(changes)} stint-seeds, not independent within a seed); fell in "
                               f"{sum(c < 0 for c in changes)} of {len(changes)}")
    return ["**Per stint of roles** (the role-phase sawtooth): each agent's held-out accuracy answering alone, its "
            "change from the evaluation at a stint's start to the one at its end, by the role it had in that stint "
            "(mean ± SE over seeds; \"fell\": seeds whose accuracy went down):", "",
            markdown_table(["agent", "iterations", "role", "change", "fell"], rows), "", *summary]


def heldout_lines(group: Group) -> list[str]:
    """The held-out table with its heading, as lab.report and lab.learners show it; none where no evaluation
    recorded the transfer."""
    iterations, rows = heldout_rows(group)
    if not iterations or all(cell == "–" for row in rows for cell in row[2:]):
        return []
    controls = [NAMES[k] for k in UNRELATED_KEYS if any(row[1] == NAMES[k] for row in rows)]
    return ["**On the held-out questions**, each agent as the observer of the other's answers, by iterations "
            "completed:", "", markdown_table(["observer", "measure", *map(str, iterations)], rows),
            *(["", CONTROL_RULE] if controls else [])]


def recorded(group: Group | None) -> bool:
    return group is not None and any(TRANSFER_KEYS[0] in row for r in group.runs.values() for row in r.rows)


def transfer_section(exp: Experiment) -> str | None:
    """The report's section on the knowledge transfer of the folder's CORY runs, or None where none recorded it."""
    group = exp.main_group("cory")
    if not recorded(group):
        return None
    assert group is not None
    lines = [RULE, "", "**In training** (each seed's mean over a stint of roles, then over seeds):", "",
             markdown_table(["iterations", "observer", *(NAMES[k] for k in TRANSFER_KEYS)],
                            training_windows(group))]
    held_out = heldout_lines(group)
    if held_out:
        lines += ["", *held_out]
    sawtooth = sawtooth_lines(group)
    if sawtooth:
        lines += ["", *sawtooth]
    return "\n".join(lines)


def plot_transfer(exp: Experiment, path: Path) -> bool:
    """The three transfer measures against iterations: the training batch's observer (thin, mean over seeds) and
    each agent as the held-out observer (thick, mean ± SE over seeds). False (nothing drawn) where none was
    recorded."""
    group = exp.main_group("cory")
    if not recorded(group):
        return False
    assert group is not None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lab.figures import LINESTYLES, colour, integer_iterations, save_figure

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key in zip(axes, TRANSFER_KEYS):
        by_step: dict[int, list[float]] = {}
        for run in group.runs.values():
            for step, value in run.series("transfer", key.split("/", 1)[1]).items():
                by_step.setdefault(step, []).append(value)
        if by_step:
            steps = sorted(by_step)
            ax.plot(steps, [np.mean(by_step[s]) for s in steps], color="#999999", linewidth=0.9,
                    label="training batch's observer")
        for agent in group.agents:
            per_seed = [r.heldout_series(agent, key) for r in group.runs.values()]
            its = sorted({i for d in per_seed for i in d})
            vals = [[d[i] for d in per_seed if i in d] for i in its]
            if not its:
                continue
            mean = np.array([np.mean(v) for v in vals])
            se = np.array([np.std(v, ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for v in vals])
            ax.errorbar(its, mean, yerr=se, marker="o", markersize=3, capsize=2, linewidth=1.8,
                        color=colour("cory"), linestyle=LINESTYLES.get(agent, "-"),
                        label=f"{group.name(agent)} observing, held-out")
        if key == TRANSFER_KEYS[0]:
            ax.axhline(0, color="#555555", linestyle=":", linewidth=1)
        ax.set_title(NAMES[key], fontsize=10)
        ax.set_xlabel("iterations")
        ax.set_ylabel(Y_LABELS[key])
        integer_iterations(ax)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"knowledge transfer: {len(group.runs)} CORY seed(s), mean (± SE held-out)", fontsize=10)
    save_figure(fig, path)
    return True
