"""Loading an experiment folder.

An experiment folder, as ``python -m lab.experiments`` writes it, holds
``runs/<method>[_kl<eta>]/seed_<s>/{metrics.jsonl,samples.jsonl,config.yaml}`` and maybe ``runs.json``.
``load_experiment`` reads it into an ``Experiment`` of ``Group``s (one per folder under runs/) of ``SeedRun``s;
their curves and final values are lab.curves'. The method names and the number formats that the report, the
verdict and the figures share are lab.labels', re-exported here: lab.report, lab.verdict and lab.figures import this
module, and it imports none of them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cory.config import INVOCATION_FIELDS, CoryArgs, on_resume_fields
from lab.compute import mixed_precision_notes
from lab.errors import ReportError
from lab.labels import (AGENT_NAMES, LLM1, LLM2, METHOD_NAMES, POLICY, fmt,  # noqa: F401 (re-exported)
                        learner_name)
from lab.runs import record_refusal
from cory.run.final import read_evaluation, stale
from cory.method import CORY, PPO
from cory.run.outputs import MANIFEST, read_jsonl, read_manifest
from cory.run.targets import special_file_refusal

LAST_N = 10
MAIN_METHODS = ("ppo", "cory")
# the differences between the authors' runs and a like-for-like comparison (see lab.experiments)
CONFOUND_METHODS = ("ppo_norm", "cory_norm", "cory_authors")
ABLATION_METHODS = ("cory_no_kt", "cory_no_swap", "ppo_2x")
_LABEL = re.compile(r"^(?P<method>.+?)(?:_kl(?P<kl>[0-9.eE+-]+))?$")


def parse_label(label: str) -> tuple[str, float | None]:
    """``cory_kl0.01`` -> ("cory", 0.01); ``ppo`` -> ("ppo", None)."""
    m = _LABEL.match(label)
    if m and m.group("kl") is not None:
        try:
            return m.group("method"), float(m.group("kl"))
        except ValueError:
            pass
    return label, None


def finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# ----------------------------------------------------------------------------- loading

@dataclass
class SeedRun:
    seed: int
    path: Path
    rows: list[dict]
    config: dict
    heldout: list[dict] = field(default_factory=list)  # eval.jsonl: the run's own held-out evaluations
    evaluations: list[dict] = field(default_factory=list)  # lab.evaluate's eval_*.json beside it, readable
    # and of its current final models (see load_experiment)

    def heldout_series(self, agent: str, metric: str) -> dict[int, float]:
        """completed iterations -> the held-out value of ``agent`` (eval.jsonl; iteration 0 is the base model)."""
        out = {}
        for row in self.heldout:
            it, value = row.get("iterations"), finite(row.get(metric))
            if row.get("agent") == agent and isinstance(it, int) and not isinstance(it, bool) and value is not None:
                out[it] = value
        return out

    def final_evaluation(self, agent: str) -> dict | None:
        """The held-out result of the run's final ``agent`` model: ``lab.evaluate``'s eval_<task>.json
        beside the run (training protocol), else the last row of its own eval.jsonl when that is at its end."""
        for doc in self.evaluations:
            if (doc.get("settings") or {}).get("protocol", "training") != "training":
                continue
            for r in doc.get("results", []):
                if isinstance(r, dict) and str(r.get("name", "")).split("/")[-1] == agent:
                    return r
        rows = [r for r in self.heldout if r.get("agent") == agent and isinstance(r.get("iterations"), int)]
        last = max(rows, key=lambda r: r["iterations"], default=None)
        end = self.last_step
        return last if last is not None and end is not None and last["iterations"] == end + 1 else None

    def series(self, agent: str, metric: str) -> dict[int, float]:
        """step -> finite value; the last row wins when a step appears twice."""
        out = {}
        key = f"{agent}/{metric}"
        for row in self.rows:
            step = row.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                continue
            value = finite(row.get(key))
            if value is None:
                out.pop(step, None)
            else:
                out[step] = value
        return out

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.rows if isinstance(r.get("step"), int)]
        return max(steps) if steps else None


# the range a per-answer task reward cannot leave, by reward name (None: unbounded): figures cut their bands
# there, and the verdict's "similar reward" margin has a floor of a share of its width
REWARD_RANGES = {"vader": (-1.0, 1.0), "vader-scaled": (-3.0, 3.0), "vader-gain": (-2.0, 2.0),
                 "correctness": (0.0, 1.0)}


@dataclass
class Group:
    """All seeds of one method at one KL coefficient (one folder under runs/)."""

    label: str
    method: str
    kl_coef: float | None  # from the folder name (the eta sweep)
    runs: dict[int, SeedRun] = field(default_factory=dict)
    learner_in_name: bool = True  # off where a document names the learner beside each name (lab.learners)

    @property
    def agents(self) -> list[str]:
        keys = {k.split("/", 1)[0] for r in self.runs.values() for row in r.rows for k in row if "/" in k}
        if LLM1 in keys or LLM2 in keys:
            return [a for a in CORY.agents if a in keys]
        return [POLICY] if POLICY in keys else []

    @property
    def config_eta(self) -> float | None:
        """``init_kl_coef`` from the runs' config.yaml, when all of them agree."""
        etas = {finite(r.config.get("init_kl_coef")) for r in self.runs.values()} - {None}
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

    @property
    def learner(self) -> str | None:
        """The runs' learner where it is not GAE with one answer per prompt, "GRPO, K = 4" (``lab.labels``)."""
        return learner_name(self.config_value("advantage_estimator"), self.config_value("num_generations"))

    def name(self, agent: str | None = None, eta: bool = True) -> str:
        """"PPO", "CORY-LLM1", and in brackets the learner where it is not GAE and the sweep's η (``eta``):
        "PPO (GRPO, K = 4)", "CORY-LLM2 (RLOO, K = 4, η=0.01)"; ``agent`` None names the method."""
        base = METHOD_NAMES.get(self.method, self.method)
        base += "" if agent is None else AGENT_NAMES.get(agent, f"-{agent}")
        extra = [t for t in (self.learner if self.learner_in_name else None,
                             f"η={self.kl_coef:g}" if eta and self.kl_coef is not None else None) if t]
        return f"{base} ({', '.join(extra)})" if extra else base

    def without_config(self) -> list[int]:
        """The seeds whose config.yaml is missing or unreadable while others have one: their settings cannot be
        compared with the others'."""
        if not any(r.config for r in self.runs.values()):
            return []
        return [seed for seed, run in sorted(self.runs.items()) if not run.config]

    def differing_settings(self) -> str | None:
        """Where this group's runs were made with different settings (besides their seeds, folders and what a
        resume may change), in words, e.g. "learning_rate 3e-05 (seeds 0, 1), 0.0001 (seed 2)"; else None. Only the
        runs with a config count (see ``without_config``)."""
        ignored = set(on_resume_fields(CoryArgs)) | set(INVOCATION_FIELDS) | {"seed"}
        keys = sorted({k for r in self.runs.values() for k in r.config} - ignored)
        for key in keys:
            by_value: dict[str, list[int]] = {}
            for seed, run in sorted(self.runs.items()):
                if not run.config:
                    continue
                by_value.setdefault(json.dumps(run.config.get(key), sort_keys=True), []).append(seed)
            if len(by_value) > 1:
                return f"{key} " + ", ".join(f"{json.loads(v)} (seed{'s' * (len(ss) > 1)} {', '.join(map(str, ss))})"
                                             for v, ss in by_value.items())
        return None

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
    base_evaluations: list[dict] = field(default_factory=list)  # the readable eval_*.json in the folder itself
    # more sampled draws of the base model's held-out evaluation (base_draws/eval_*.json, other seeds): a design's
    # ``base_draws`` reads the base model's reward as their mean with the runner's (lab.design)
    base_draw_evaluations: list[dict] = field(default_factory=list)

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

    def base_evaluation(self) -> dict | None:
        """The base model's held-out result: the runner's eval_base_<task>.json (training protocol), else the
        iteration-0 row of a run's own eval.jsonl (every run starts from the same base and prompts)."""
        for doc in self.base_evaluations:
            if (doc.get("settings") or {}).get("protocol", "training") != "training":
                continue
            for r in doc.get("results", []):
                if isinstance(r, dict) and r.get("name") == "base":
                    return r
        for g in self.groups.values():
            for run in g.runs.values():
                for row in run.heldout:
                    if row.get("iterations") == 0:
                        return row
        return None

    def base_draws(self) -> list[dict]:
        """The base model's held-out results, one per sampled draw: ``base_evaluation``'s, then base_draws/'s."""
        first = self.base_evaluation()
        more = [r for doc in self.base_draw_evaluations
                if (doc.get("settings") or {}).get("protocol", "training") == "training"
                for r in doc.get("results", []) if isinstance(r, dict) and r.get("name") == "base"]
        return ([first] if first is not None else []) + more

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
        raise ReportError(f"{path}: no runs/ folder; is it an experiment folder written by lab.experiments?")
    if (special := special_file_refusal(root)) is not None:  # before any file is opened: a pipe would hang it
        raise ReportError(special)
    notes, aside = [], []  # aside: (where, run, why) of the runs whose place says otherwise
    groups: dict[str, Group] = {}
    for label_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        method, kl = parse_label(label_dir.name)
        group = Group(label_dir.name, method, kl)
        for seed_dir in sorted(p for p in label_dir.iterdir() if p.is_dir()):
            m = re.fullmatch(r"seed_(\d+)", seed_dir.name)
            if not m:
                notes.append(f"`{label_dir.name}/{seed_dir.name}` ignored: not a seed_<n> folder.")
                continue
            seed = int(m.group(1))
            if seed in group.runs:  # seed_1 and seed_01: which one is the result cannot be told
                raise ReportError(f"{group.runs[seed].path} and {seed_dir} both hold seed {seed}; keep one of them "
                                  f"(move the other out of {runs_root})")
            run = _load_seed(seed, seed_dir, f"{label_dir.name}/{seed_dir.name}", notes)
            misplaced = _misplaced(run, method, seed) if run is not None else None
            if misplaced:
                aside.append((f"{label_dir.name}/{seed_dir.name}", run, misplaced))
            elif run is not None:
                group.runs[seed] = run
        if group.runs:
            groups[label_dir.name] = group
    expected = _other_tasks(root, groups, notes)
    for where, run, misplaced in aside:  # a run of another task is named by its task, the first thing that differs
        task = _task_of(run)
        notes.append(f"`{where}` holds a {task} run, not a {expected} run as this folder's others are; left out: move "
                     "it to an experiment of its task." if expected and task and task != expected else
                     f"`{where}` {misplaced}; left out: move it where it belongs.")
    notes += mixed_precision_notes(root, {label: sorted(g.runs) for label, g in groups.items()})
    runs_json = _runs_json(root, groups, notes)
    draws = _evaluations(root / "base_draws", "base_draws", notes) if (root / "base_draws").is_dir() else []
    return Experiment(root, groups, runs_json, notes, _evaluations(root, "", notes), draws)


def _task_of(run: SeedRun) -> str | None:
    task = (read_manifest(run.path) or {}).get("task") or run.config.get("task")
    return str(task) if task else None


def _misplaced(run: SeedRun, method: str, seed: int) -> str | None:
    """Why ``run``, found at ``runs/<method...>/seed_<seed>``, is not what its place says, from its manifest (the
    method that ran it) and its config (its seed); None when it is, or nothing says otherwise. A PPO run copied under
    runs/cory/ would otherwise be read as CORY's."""
    ran = (read_manifest(run.path) or {}).get("method")
    family = next((m.name for m in (CORY, PPO) if method.startswith(m.name)), None)
    if family is not None and isinstance(ran, str) and ran != family:
        return f"holds a {ran} run ({MANIFEST}), not a {method} run as its folder says"
    if isinstance(run.config.get("seed"), int) and run.config["seed"] != seed:
        return f"holds a run of seed {run.config['seed']} (its config.yaml), not of seed {seed} as its folder says"
    return None


def _other_tasks(root: Path, groups: dict[str, Group], notes: list[str]) -> str | None:
    """Leave out, named with their task, the runs of another task than the folder's (runs.json's where some of its
    runs are of it, else the task most of its runs have): a run copied from another experiment. Returns that task."""
    tasks = {(label, seed): _task_of(r) for label, g in groups.items() for seed, r in g.runs.items()}
    counts: dict[str, int] = {}
    for task in tasks.values():
        if task:
            counts[task] = counts.get(task, 0) + 1
    try:
        recorded = json.loads((root / "runs.json").read_text()).get("task")
    except (OSError, ValueError, AttributeError):
        recorded = None
    # runs.json's task, where some runs are of it; a runs.json of another task than every run is the copied one, named
    # by _runs_json and not used
    expected = (str(recorded) if recorded and str(recorded) in counts
                else max(sorted(counts), key=lambda t: counts[t], default=None))
    for (label, seed), task in tasks.items():
        if expected is not None and task is not None and task != expected:
            del groups[label].runs[seed]
            notes.append(f"`{label}/seed_{seed}` holds a {task} run, not a {expected} run as this folder's others "
                         "are; left out: move it to an experiment of its task.")
    for label in [label for label, g in groups.items() if not g.runs]:
        del groups[label]
    return expected


def _load_seed(seed: int, seed_dir: Path, where: str, notes: list[str]) -> SeedRun | None:
    """One seed's run (None, with a note, when it has no metrics yet); what cannot be read is named in ``notes``."""
    rows = read_jsonl(seed_dir / "metrics.jsonl")
    if rows.unreadable:
        notes.append(f"`{where}`: {rows.unreadable} unreadable line(s) in metrics.jsonl skipped.")
    if not rows:
        notes.append(f"`{where}`: no metrics yet; left out.")
        return None
    config = {}
    if (seed_dir / "config.yaml").is_file():
        try:
            config = yaml.safe_load((seed_dir / "config.yaml").read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, ValueError):  # ValueError: not UTF-8
            notes.append(f"`{where}`: config.yaml unreadable (not UTF-8 YAML); its settings are left out.")
            config = {}
        if not isinstance(config, dict):
            notes.append(f"`{where}`: config.yaml holds a {type(config).__name__}, not a config; its settings are "
                         "left out.")
            config = {}
    heldout = read_jsonl(seed_dir / "eval.jsonl")
    if heldout.unreadable:
        notes.append(f"`{where}`: {heldout.unreadable} unreadable line(s) in eval.jsonl skipped.")
    return SeedRun(seed, seed_dir, rows, config, heldout, _evaluations(seed_dir, where, notes, run=True))


def _evaluations(folder: Path, where: str, notes: list[str], run: bool = False) -> list[dict]:
    """lab.evaluate's results in ``folder`` (``eval_*.json``, in name order): a file that cannot be read, or
    (``run``: beside a run) one that scored other final weights than the run's final/ holds now, is named in
    ``notes`` and left out."""
    docs = []
    for path in sorted(folder.glob("eval_*.json")):
        name = f"`{where}/{path.name}`" if where else f"`{path.name}`"
        doc = read_evaluation(path)
        if doc is None:
            notes.append(f"{name} cannot be read (cut short or damaged); left out: rerun its evaluation.")
        elif run and stale(folder, doc):
            notes.append(f"{name} scored other weights than `{where}/final/` holds now (the run was continued "
                         "after it); left out as stale: rerun its evaluation.")
        else:
            docs.append(doc)
    return docs


def _runs_json(root: Path, groups: dict[str, Group], notes: list[str]) -> dict:
    """runs.json, when it is this folder's: one that cannot be read, or that describes another task's runs (copied
    from another experiment), is named in ``notes`` and not used (its commands and wall times are missing)."""
    path = root / "runs.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        notes.append("runs.json is not valid JSON; the commands and wall times are missing.")
        return {}
    if (wrong := record_refusal(data)) is not None:  # a list, a run that is a number, ...: read as none at all
        notes.append(f"{wrong}; the commands and wall times are missing.")
        return {}
    tasks = {str(r.config["task"]) for g in groups.values() for r in g.runs.values() if r.config.get("task")}
    if data.get("task") is not None and tasks and str(data["task"]) not in tasks:
        notes.append(f"runs.json describes a {data['task']} experiment, but the runs here are "
                     f"{', '.join(sorted(tasks))} runs; it is not used (the commands and wall times are missing).")
        return {}
    return data


def setting_name(exp: Experiment) -> str:
    """The task and preset, as the report's and the figures' titles name them: "IMDB, tiny preset"."""
    task = exp.runs_json.get("task") or exp.any_config("task") or "?"
    preset = exp.runs_json.get("preset")
    return f"{str(task).upper()}" + (f", {preset} preset" if preset else "")
