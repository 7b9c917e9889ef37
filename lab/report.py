"""Plots and REPORT.md for an experiment folder written by ``python -m lab.experiments``.

    python -m lab.report results/NAME

The folder holds ``runs/<method>[_kl<eta>]/seed_<s>/{metrics.jsonl,samples.jsonl,config.yaml}`` and,
when the runner made it, ``runs.json`` (what was run, by which command, at which commit, how long).
Everything in REPORT.md is computed from those files, so a fresh clone rebuilds the same report.

Conventions, stated again in the report itself:
* curves and final values as ``lab.curves`` states them (aligned by ``step``; std over seeds, ddof=1; a seed's final
  value its mean over the last 10 aligned iterations);
* the verdict (``lab.verdict.VERDICT_RULE``) compares each CORY agent with PPO on the per-seed final values:
  t-tests paired by seed when the runs shared their draws, "similar reward" as a non-inferiority test, the agents'
  claims Holm-corrected together, and the power to show the paper's effect, which turns a weak negative into
  "could not tell" (the secondary reading; ``lab.matched_kl`` reads the claim at matched KL first, and
  ``lab.collapse`` tests the collapse claim). The confounds ``ppo_norm`` and
  ``cory_authors`` get the same test on extra lines and their own figures, the ablations two-sided tests.

This module writes the markdown (final values, samples, provenance) and puts it together in ``build_report``;
the loading is in ``lab.results``, the curves and final values in ``lab.curves``, the test in ``lab.verdict``, the
plots in ``lab.figures`` (none imports this module).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from lab.design import load_design
from lab.figures import (DEGENERATION_METRICS, MAIN_FIGURE_METRICS, METRICS, plot_distinct_2, plot_heldout,
                              plot_metric, plot_reward_vs_kl, plot_sweep, write_atomically, check_targets, generated_by)
from lab.curves import curve, final_value, fmt_final, heldout_value, sweep_points
from lab.results import (ABLATION_METHODS, CONFOUND_METHODS, LAST_N, LLM1, LLM2, MAIN_METHODS, METHOD_NAMES,
                         Experiment, finite, fmt, Group, load_experiment, setting_name)
from lab.learning import LEARNING_RULE
from lab.collapse import RULE as COLLAPSE_RULE, at_matched_kl, collapse_test, threshold
from lab.frontier import RULE as FRONTIER_RULE, frontier
from lab.matched_kl import RULE as MATCHED_KL_RULE, matched_kl, normaliser_alone
from lab.paths import along_paths
from lab.transfer import plot_transfer, transfer_section
from lab.verdict import NOT_LEARNED, VERDICT_RULE, ablation_lines, verdict
from lab.errors import ReportError, exit_on_error
from cory.run.outputs import read_jsonl
from cory.run.targets import stopped_as_interrupt
from cory.tasks import registered


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


FINAL_METRICS = ("task_reward", "kl", "combined_reward", "response_length", "distinct_2", "repeat4_share")


def final_table(exp: Experiment) -> str:
    rows = []
    for g in _ordered_groups(exp):
        for agent in g.agents:
            fins = {m: final_value(g, agent, m) for m in FINAL_METRICS}
            some = next((f for f in fins.values() if f is not None), None)
            window = f"{some.steps[0]}–{some.steps[1]}" if some else "–"
            rows.append([g.name(agent), fmt(g.eta) if g.eta is not None else "?", some.n if some else 0,
                         window] + [fmt_final(f) for f in fins.values()])
    if not rows:
        return "_No metrics yet._"
    return _table(["method / agent", "η (start)", "seeds", "iterations averaged", "task reward", "KL",
                   "r_c", "response length (tokens)", "distinct-2", "repeat-4 share"], rows)


def learner_line(exp: Experiment) -> str | None:
    """What learned, where a run group's learner is not GAE with one answer per prompt (None for a GAE folder):
    every name in the report carries it, and the PPO baseline of a critic-free learner is no PPO with a critic."""
    groups = [g for g in _ordered_groups(exp) if g.runs]
    if all(g.learner is None for g in groups):
        return None
    each = "; ".join(f"{g.name(eta=False) if g.learner else g.name(eta=False) + ' (GAE)'}: `advantage_estimator: "
                     f"{g.config_value('advantage_estimator') or 'gae'}`, `num_generations: "
                     f"{g.config_value('num_generations') or 1}`" for g in groups)
    return ("**Learners** (each run's config.yaml; K: answers per prompt, the group baseline of RLOO and GRPO; the "
            "names below carry the learner where it is not GAE with K = 1): " + each + ". Under RLOO or GRPO, "
            "\"PPO\" is the single-agent baseline trained with that learner and no value head, not PPO with GAE's "
            "critic.")


def _one_line(text) -> str:
    return str(text).replace("```", "'''").replace("\n", " ⏎ ")


def _sample_lines(r: dict) -> list[str]:
    if "response" in r:
        return [f"  [r={_reward(r.get('reward'))}] {_one_line(r.get('query', ''))} ⟶ {_one_line(r['response'])}"]
    pio = r.get("pioneer", "pioneer")
    obs = {LLM1: LLM2, LLM2: LLM1}.get(pio, "observer")
    return [f"  [{pio.upper()} pioneer r={_reward(r.get('pioneer_reward'))}] "
            f"{_one_line(r.get('query', ''))} ⟶ {_one_line(r.get('pioneer_response', ''))}",
            f"  [{obs.upper()} observer r={_reward(r.get('observer_reward'))}] "
            f"{_one_line(r.get('query', ''))} ⟶ {_one_line(r.get('observer_response', ''))}"]


def samples_section(exp: Experiment, per_step: int = 3, per_other_seed: int = 2) -> str:
    """The lowest seed's first and last iteration, then the last iteration of every other seed: one seed's text
    must not stand for its method (seeds differ in how far they drift)."""
    parts = []
    for g in _ordered_groups(exp):
        if g.kl_coef is not None:
            continue  # the sweep would multiply the samples; its numbers are in the table
        blocks, lowest = [], min(g.runs)
        for seed in sorted(g.runs):
            rows = read_jsonl(g.runs[seed].path / "samples.jsonl")
            rows = [r for r in rows if isinstance(r.get("step"), int)]
            if not rows:
                blocks.append(f"seed {seed}: no samples.jsonl")
                continue
            first, last = min(r["step"] for r in rows), max(r["step"] for r in rows)
            steps, k = (sorted({first, last}), per_step) if seed == lowest else ([last], per_other_seed)
            for step in steps:
                blocks.append(f"seed {seed}, iteration {step}:")
                for r in [r for r in rows if r["step"] == step][:k]:
                    blocks += _sample_lines(r)
        parts.append(f"**{g.name()}** (seed {lowest}: first and last iteration; other "
                     "seeds: last iteration):\n\n```text\n" + "\n".join(blocks) + "\n```")
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


def _machine(cpu) -> str:
    """Where an invocation recorded its CPU (since 2026-11-29): the kind its wall times were taken on."""
    if not isinstance(cpu, dict):
        return ""
    flags = " ".join(cpu.get("flags") or []) or "no AVX flags"
    return f"; on {cpu.get('model', '?')}, {cpu.get('cores', '?')} cores ({flags})"


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
                       f"failed {inv.get('failed', '?')}" + _machine(inv.get("cpu")))
        out.append("")
    else:
        out.append("_No runs.json: the commands, commit and wall times are unknown; the settings below come "
                   "from each run's config.yaml._\n")
    if rj.get("preset"):
        out.append(f"Task `{rj.get('task', '?')}`, preset `{rj.get('preset')}` "
                   f"(`configs/{rj.get('task', '<task>')}/<ppo|cory>_{rj.get('preset')}.yaml`).\n")
    elif rj.get("task"):  # a task file's runs: the script's own values, no preset file
        out.append(f"Task `{rj.get('task')}`, no preset (the training script's own values).\n")
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
                     _duration(wall) if wall else "?", _duration(sum(per_it)) if per_it else "?",
                     f"{np.mean(per_it):.1f} s" if per_it else "?"])
    if rows:
        out.append(_table(["run group", "script", "seeds", "wall time (all seeds, runs.json)",
                           "iteration time (all seeds, metrics)", "time per iteration"], rows))
        total = sum(v for g in _ordered_groups(exp) for run in g.runs.values()
                    for v in (finite(r.get("time/iteration_s")) for r in run.rows) if v is not None)
        out.append(f"\nIn all, {_duration(total)} of training iterations by the metrics' `time/iteration_s`. "
                   "runs.json's wall times include loading and saving but not the attempts that were cut off "
                   "(they record no wall time), so the two columns can differ either way.")
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

EVAL_KEYS = ("pass@1", "pass@4", "pass@16", "accuracy", "hit_limit", "task_reward", "kl", "distinct_1", "distinct_2",
             "repeat4_share", "response_length")


def _protocol(doc: dict) -> str:
    # evaluations written before the protocol was recorded sampled and read answers as training does
    return str((doc.get("settings") or {}).get("protocol", "training"))


def evaluation_section(exp: Experiment) -> str | None:
    """Held-out evaluations (``python -m lab.evaluate``) found beside the runs: ``runs/<label>/seed_<s>/eval_*.json``
    per trained model, ``eval_*.json`` in the experiment folder for the base model; mean ± std over seeds. GSM8K
    evaluations made under different protocols (how answers are sampled and read) get one table each, named."""
    spec = registered().get(exp.runs_json.get("task", exp.any_config("task")))
    protocols = spec.evaluation.protocols if spec is not None else {}
    by_protocol = len(protocols) > 1
    tables: dict[str, dict] = {}  # protocol -> {"rows", "settings", "commands"}

    def slot(doc):
        t = tables.setdefault(_protocol(doc) if by_protocol else "", {"rows": [], "settings": None, "commands": []})
        t["settings"] = t["settings"] or doc.get("settings")
        t["commands"].append(doc.get("command"))
        return t

    for doc in exp.base_evaluations:  # what cannot be read, or is stale, is named in the notes (load_experiment)
        t = slot(doc)
        for r in doc.get("results", []):
            t["rows"].append(("base model", {0: r}))
    for g in _ordered_groups(exp):
        per_model: dict[tuple[str, str], dict[int, dict]] = {}
        for seed, run in sorted(g.runs.items()):
            for doc in run.evaluations:
                slot(doc)
                for r in doc.get("results", []):
                    if r.get("name") == "base":
                        continue
                    key = (_protocol(doc) if by_protocol else "", str(r.get("name", "?")).split("/")[-1])
                    per_model.setdefault(key, {})[seed] = r
        for (protocol, agent), by_seed in per_model.items():
            tables[protocol]["rows"].append((g.name(agent), by_seed))
    tables = {k: t for k, t in tables.items() if t["rows"]}
    if not tables:
        return None
    lines = ["Each trained model answers held-out prompts from the query alone; mean ± sample std over seeds "
             "(one evaluation per seed)."]
    commands = []
    for protocol, t in sorted(tables.items(), key=lambda kv: (kv[0] != "training", kv[0])):
        rows = t["rows"]
        keys = [k for k in EVAL_KEYS if any(k in r for _, by_seed in rows for r in by_seed.values())]
        table = []
        for name, by_seed in rows:
            cells = []
            for k in keys:
                values = np.array([float(r[k]) for r in by_seed.values() if isinstance(r.get(k), (int, float))])
                cells.append("–" if not len(values) else fmt(values.mean()) if len(values) < 2
                             else f"{fmt(values.mean())} ± {fmt(values.std(ddof=1))}")
            table.append([name, len(by_seed)] + cells)
        shown = {k: v for k, v in (t["settings"] or {}).items()
                 if k in ("dataset", "limit", "n", "ks", "max_new_tokens", "seed", "n_questions", "n_prompts",
                          "allow_early_eos")}
        if by_protocol:
            shown = {"protocol": protocol, **shown}
        lines += ["", f"Settings: {', '.join(f'{k} {v}' for k, v in shown.items())}." + (
                      f" {protocols[protocol].description}" if by_protocol and protocol in protocols else ""), "",
                  _table(["model", "seeds", *keys], table)]
        commands += t["commands"]
    commands = [c for c in dict.fromkeys(commands) if c]
    if commands:
        lines += ["", "<details><summary>Evaluation commands</summary>\n\n```text\n" + "\n".join(commands)
                  + "\n```\n</details>"]
    return "\n".join(lines)


def draw_figures(exp: Experiment, main: list[tuple[Group, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """Every figure the folder's runs allow, written into it: ([(file name, caption)], notes on alignment)."""
    root = exp.path
    notes: list[str] = []
    figures: list[tuple[str, str]] = []

    if main:
        held = exp.any_config("allow_early_eos") is False
        for metric in MAIN_FIGURE_METRICS:
            name = f"fig_{metric}.png"
            notes += plot_metric(exp, root / name, metric, main)
            caption = f"{METRICS[metric][0]}: PPO vs CORY (paper Fig. 3)"
            if metric == "response_length" and held:
                # answers run to the length drawn for the batch (allow_early_eos false): the curve shows the draws
                caption += ("; answers are held to the length drawn for each batch (allow_early_eos false), so "
                            "this shows the seeds' length draws, not lengths the models learned")
            figures.append((name, caption))
    everyone = [(g, a) for g in _ordered_groups(exp) if g.kl_coef is None or not main for a in g.agents]
    base = exp.base_evaluation()
    if plot_heldout(exp, root / "fig_heldout_reward.png", main or everyone, heldout_value(base)):
        figures.insert(0, ("fig_heldout_reward.png", "held-out task reward of each method's models, answering held-out "
                                                     "prompts from the query alone, with the base model's as a "
                                                     "dotted line: did the methods learn?"))
    if any(curve(g, a, "distinct_2") is not None for g, a in main):
        for metric in DEGENERATION_METRICS:
            name = f"fig_{metric}.png"
            notes += plot_metric(exp, root / name, metric, main)
            figures.append((name, f"{METRICS[metric][0]}, per training batch: a collapsing policy repeats itself"))
    confounds = [(g, a) for m in CONFOUND_METHODS for g in [exp.main_group(m)] if g is not None for a in g.agents]
    present = " and ".join(g.name(eta=False) for m in CONFOUND_METHODS if (g := exp.main_group(m)) is not None)
    ablations = [(g, a) for m in ABLATION_METHODS for g in [exp.groups.get(m)] if g is not None for a in g.agents]
    for prefix, title, pairs, caption in (
            ("confounds", "confounds", confounds, f"confounds ({present}), PPO and CORY as thin reference lines"),
            ("ablation", "ablations", ablations, "ablations (paper Fig. 6)")):
        if not pairs:
            continue
        for metric in ("task_reward", "kl", "combined_reward"):
            name = f"fig_{prefix}_{metric}.png"
            notes += plot_metric(exp, root / name, metric, pairs, refs=main, title=f"{title}, {METRICS[metric][0]}")
            figures.append((name, f"{METRICS[metric][0]}: {caption}"))
    points = sweep_points(exp)
    if points:
        plot_sweep(exp, root / "fig_kl_sweep.png", points)
        figures.append(("fig_kl_sweep.png", "the η sweep: final task reward vs final KL, one small point per seed, "
                                            "a large one per η (mean ± std over seeds) (paper Fig. 2c); tested at matched KL in "
                                            "the section on the η frontier"))

    return figures, notes


def claim_sections(exp, main: list) -> tuple[list[str], list[str]]:
    """The claim at matched KL (with its figure, drawn here) and the collapse test with its descriptive reading at
    matched held-out KL, as REPORT.md lines: the folder's primary endpoint first, the other marked secondary."""
    root = exp.path
    claim, collapse = matched_kl(exp), collapse_test(exp)
    matched = ["## The claim at matched KL", "", MATCHED_KL_RULE, "", claim.text, ""]
    if main and plot_reward_vs_kl(exp, root / "fig_reward_vs_kl.png", main, heldout_value(exp.base_evaluation()),
                                  claim.design.kl_grid):
        matched += ["![held-out reward against held-out KL along training](fig_reward_vs_kl.png)", "",
                    "_fig_reward_vs_kl.png: held-out reward against held-out KL along training, each seed's path "
                    "thin, the mean path per method and agent thick, the base model as a star; dotted lines: the "
                    "design's KL grid._", ""]
    norm = matched_kl(exp, "cory_norm") if exp.main_group("cory_norm") is not None else None
    if norm is not None:  # the authors' normalised CORY: how much of "lower KL" the normaliser alone makes
        matched += ["CORY with score normalisation (`cory_norm`, as the authors run it) against PPO, the same "
                    "reading (not part of the answer above):", "", norm.text, ""]
        alone = normaliser_alone(exp)
        if alone:
            matched += ["The normaliser alone: CORY with score normalisation minus CORY without, paired by seed "
                        "(two-sided paired t-tests, descriptive). At matched iterations it shows how much of \"lower "
                        "KL at lower reward\" the normaliser makes by itself; at matched KL, whether it only moves CORY "
                        "along its own reward-vs-KL path:", "", alone, ""]
    collapsing = ["## The collapse test", "", COLLAPSE_RULE, "", collapse.text, ""]
    if (main and claim.design.endpoint == "collapse"
            and plot_distinct_2(exp, root / "fig_heldout_distinct_2.png", main, *threshold(exp, claim.design))):
        collapsing += ["![held-out distinct-2 along training](fig_heldout_distinct_2.png)", "",
                       "_fig_heldout_distinct_2.png: held-out distinct-2 along training, each seed thin, the mean per "
                       "method and agent thick; dotted: the base model's; dashed: the design's collapse threshold (the "
                       "test reads each final model's held-out evaluation)._", ""]
    descriptive = at_matched_kl(exp)
    if descriptive is not None:  # beside the test, whichever leads: a slower learner looks less collapsed at the end
        collapsing += ["### Collapse at matched held-out KL (descriptive)", "", descriptive.text, ""]
    first, second = (collapsing, matched) if claim.design.endpoint == "collapse" else (matched, collapsing)
    second[0] += " (secondary: not this folder's primary endpoint)"
    return first, second


def comparison_sections(exp: Experiment, main: list) -> list[str]:
    """The comparison's REPORT.md lines: the claim at matched KL and the collapse test (the design's primary
    endpoint first), the verdict at matched iterations, the ablations and the η frontier."""
    v = verdict(exp)
    first, second = claim_sections(exp, main)
    md = [*first, *second]
    paths = along_paths(exp)
    if paths is not None:  # the objective task's design names these secondary readings
        md += ["## Along the held-out paths (secondary, descriptive)", "", paths, ""]
    transfer = transfer_section(exp)
    if transfer is not None:  # runs that recorded it: does the observer use the pioneer's answer at all?
        md += ["## Knowledge transfer (descriptive)", "", transfer, ""]
        if plot_transfer(exp, exp.path / "fig_transfer.png"):
            md += ["![knowledge transfer along training](fig_transfer.png)", "",
                   "_fig_transfer.png: the observer's reward minus the pioneer's, the copy rate and the correction "
                   "rate along training: the training batch's observer (thin grey, mean over seeds) and each agent "
                   "as the observer of the other's held-out answers (mean ± SE over seeds)._", ""]
    md += ["## Verdict", "",
           "The reading at matched iterations (secondary: a method that learns slower shows lower KL at lower "
           "reward here whatever its trade-off).", "",
           LEARNING_RULE, "",
           VERDICT_RULE, "",
           v.text, ""]
    tested = v.answer != NOT_LEARNED
    ablations_text = ablation_lines(exp)
    if ablations_text:
        md += [ablations_text if tested else "The ablations' tests are not shown: the baseline did not learn.", ""]
    front = frontier(exp)
    if front is not None:
        md += ["## The η frontier at matched KL", "", FRONTIER_RULE, "",
               front.text if tested else "Not tested: the baseline did not learn (see the verdict).", ""]
    return md


def build_report(path: str | Path) -> Path:
    """Write the figures and REPORT.md into ``path``; returns REPORT.md's path."""
    # the files it writes first (only regular ones are opened): a pipe among them is named as a target, which
    # load_experiment, refusing any pipe in the folder before opening a file, would name as a file to read
    check_targets(Path(path), "REPORT.md", writer="lab.report")
    exp = load_experiment(path)
    root = exp.path
    load_design(root)  # a damaged design.yaml is refused before any figure is written
    notes = list(exp.notes)
    main = [(exp.main_group(m), a) for m in MAIN_METHODS if exp.main_group(m) is not None
            for a in exp.main_group(m).agents]
    if exp.main_eta is not None:
        notes.append(f"No runs at the preset's KL coefficient: the main figures use η={exp.main_eta:g}, the largest "
                     "coefficient of the sweep that PPO and CORY share.")
    figures, drawn_notes = draw_figures(exp, main)
    notes += drawn_notes
    for g in _ordered_groups(exp):
        if g.eta_mismatch:
            notes.append(f"`{g.label}`: its runs started from init_kl_coef {fmt(g.config_eta)}, not the folder's "
                         f"η={fmt(g.kl_coef)} (the method sets it itself); it is left out of the η sweep.")
    failed = [k for k, r in (exp.runs_json.get("runs") or {}).items() if r.get("status") == "failed"]
    if failed:
        notes.append(f"Failed runs (their partial metrics, if any, are included): {', '.join(sorted(failed))}.")

    generated = (generated_by("lab.report", _rel(root)) + " from the metrics in this folder; "
                 "rerun it to rebuild this file and the figures.")
    learners = learner_line(exp)
    generated += f"\n\n{learners}" if learners else ""
    missing = [m for m in MAIN_METHODS if exp.main_group(m) is None]
    if missing:  # one side only (a baseline folder, or a comparison whose other side has not run yet)
        held = ", ".join(g.name(eta=False) if g.method in METHOD_NAMES else g.label
                         for g in _ordered_groups(exp) if g.runs) or "no"
        lacking = " or ".join(METHOD_NAMES[m] for m in missing)
        md = [f"# {held} runs: {setting_name(exp)}", "", generated, "", "## No comparison", "",
              f"This folder holds {held} runs with metrics and no {lacking} runs, so there is nothing to compare: "
              "no claim, collapse test or verdict. The sections below describe the runs it holds.", ""]
    else:
        shared = {g.learner for g, _ in main}
        learner = f" ({shared.pop()})" if len(shared) == 1 and None not in shared else ""
        md = [f"# CORY vs PPO{learner}: {setting_name(exp)}", "", generated, "", *comparison_sections(exp, main)]
    md += ["## Figures", ""]
    md += [f"![{cap}]({name})\n\n_{name}: {cap}._\n" for name, cap in figures] or ["_No figures: no metrics yet._\n"]
    md += ["## Final values", "",
           f"Each seed's mean over its last {LAST_N} aligned iterations (all of them if fewer), then mean ± "
           "sample std (ddof=1) over seeds. KL is the full-vocabulary KL(π‖π₀) summed over response tokens "
           "(nats); r_c = task reward − η·KL with the η in force at that iteration.", "",
           final_table(exp), ""]
    evaluation = evaluation_section(exp)
    if evaluation:
        md += ["## Held-out evaluation", "", evaluation, ""]
    md += ["## Samples", "",
           "A few queries and answers from the first and the last iteration of the lowest seed, then from the last "
           "iteration of every other seed; a collapsed policy shows here as repeated or degenerate text. r is the "
           "task reward of that answer.", "",
           samples_section(exp), "",
           "## What was run", "", provenance_section(exp), "",
           "## Notes", "",
           "- Curves are aligned by iteration; the mean, the band and the final values of a method use only the "
           "iterations that every one of its seeds logged with a finite value.",
           "- Shaded bands are ± one sample std over seeds (none with a single seed), cut at the bounds a metric "
           "cannot cross (KL and length ≥ 0, a reward within its range). CORY's LLM2 is drawn dashed, in its "
           "method's colour.",
           "- CORY's agents exchange roles every `swap_period` iterations (LLM1 starts as the pioneer), so "
           "\"LLM1\" and \"LLM2\" name models, not roles: which one was the pioneer in the window of the final "
           "values follows from the period."]
    md += [f"- {n}" for n in notes]
    report = root / "REPORT.md"
    write_atomically(report, "\n".join(md).rstrip() + "\n")
    return report


def _rel(path: Path) -> str:
    """The folder as seen from the repository root (stable, unlike the caller's working directory)."""
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv) or len(argv) != 1:
        usage = "usage: python -m lab.report RESULTS_DIR   (writes REPORT.md and fig_*.png into RESULTS_DIR)"
        if any(a in ("-h", "--help") for a in argv):
            print(usage)
            raise SystemExit(0)
        print(f"error: expected one results folder, got {len(argv)} arguments; {usage}", file=sys.stderr)
        raise SystemExit(2)
    # every file is written whole or not at all (save_figure, write_atomically): a full or read-only disk or a stop
    # leaves those already there whole; a SIGTERM too leaves no temporary file
    with exit_on_error((ReportError,), files=lambda: argv[0],
                       interrupted="the files written so far are whole; rerun to rebuild the rest"):
        with stopped_as_interrupt():
            report = build_report(argv[0])
    print(f"report: {report}")


if __name__ == "__main__":
    main()
