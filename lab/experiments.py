"""Run the paper's comparisons: every (method, seed[, KL coefficient]) as a training run, then the report.

    python -m lab.experiments --task imdb --preset cpu --methods ppo,cory,cory_no_kt,cory_no_swap \\
        --seeds 0,1,2 --steps 60 --out results/imdb_cpu [--kl_coefs 0.01,0.1,0.3] [--set field=value ...]

Methods: ``ppo`` and ``cory`` (the comparison); the paper's ablations ``cory_no_kt`` (no knowledge transfer),
``cory_no_swap`` (no role exchange) and ``ppo_2x`` (PPO on a model about twice the size); and two confounds,
the ways the authors' runs differ from a like-for-like comparison:

* ``ppo_norm``: PPO with ``--score_norm true``. The authors normalise CORY's scores but not PPO's (so do the
  IMDB CORY presets here), so CORY vs ``ppo_norm`` compares the two with the same score normalisation.
* ``cory_norm``: CORY with ``--score_norm true``, as the authors run it. Normalising by the running sd of
  r1 + r2 roughly doubles CORY's KL coefficient relative to its reward, so the cpu presets run both methods
  without it and this variant shows how much of CORY's "lower KL" the normaliser alone makes.
* ``cory_authors``: CORY with ``--reset_on_swap true --init_kl_coef 0.4``, as the authors' released code runs
  it: its role exchange reloads both models into fresh trainers, which resets Adam, the adaptive KL controller
  and the score statistics, and its KL coefficient starts from 0.4 (the paper's Table 1 says 0.3). The method
  sets init_kl_coef itself, so in a ``--kl_coefs`` sweep every one of its folders runs at 0.4 (a method's own
  flags come last and win).

Each run is a fresh process of the real training script (``<task>_train/{ppo,cory}.py``, or for a task in one
file, ``--task_file FILE``: ``FILE ppo|cory`` as docs/adding_a_task.md writes it) with the preset
``configs/<task>/<ppo|cory>_<preset>.yaml`` (a task file: none, its own values) and writes
``OUT/runs/<method>[_kl<eta>]/seed_<s>/``. The runner reads each run's config from the script itself
(``--print_config``: resolved and checked exactly as the run will be), before anything is written. Running
the same command again skips finished runs and resumes cut-off ones, so a long experiment can be stopped
(Ctrl-C lets the current run save a checkpoint) and continued. Each run's command, wall time and exit
status go to ``OUT/runs.json``, its output to ``OUT/logs/``; at the end ``lab.report`` writes the figures
and ``OUT/REPORT.md``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import yaml

from cory.assets import check_hub_asset
from cory.cli import CONFIG_MARKER
from cory.config import SEED_LIMIT, CoryArgs, PPOArgs, load_yaml, on_resume_fields
from cory.errors import AssetError, ConfigError, ExperimentError, OneLineParser, ReportError, file_fault
from lab import heldout_runs
from lab.report import build_report
from lab.runs import (REPO, Children, Pair, Record, cut_off_elsewhere, execute, git_state, lost_by, mismatch, now,
                           pair_state, rel, set_aside)
from cory.outputs import LOCK, MANIFEST, RunLock, in_use
from cory.targets import check_text_path, text_refusal


# method -> (script, flags that make the method); ppo_2x gets its --model_name at plan time
METHODS: dict[str, tuple[str, list[str]]] = {
    "ppo": ("ppo", []),
    "cory": ("cory", []),
    "cory_no_kt": ("cory", ["--knowledge_transfer", "false"]),
    "cory_no_swap": ("cory", ["--swap_period", "0"]),
    "ppo_2x": ("ppo", []),
    # the confounds (see the module docstring)
    "ppo_norm": ("ppo", ["--score_norm", "true"]),
    "cory_norm": ("cory", ["--score_norm", "true"]),
    "cory_authors": ("cory", ["--reset_on_swap", "true", "--init_kl_coef", "0.4"]),
}
# ppo_2x: a model of the same family with about twice the parameters (the paper: GPT2-Large -> GPT2-XL)
LARGER_MODEL = {
    "gpt2-large": "gpt2-xl",                                            # 774M -> 1.56B
    "meta-llama/Llama-2-7b-chat-hf": "meta-llama/Llama-2-13b-chat-hf",  # 6.7B -> 13B
    "embedded:smollm2-135m": "HuggingFaceTB/SmolLM2-360M-Instruct",     # 135M -> 362M, the next size up
}
# run-control fields the runner sets itself; --set may not touch them
RUNNER_FIELDS = ("task", "seed", "steps", "output_dir", "resume", "overwrite")
# fields that do not change what a run learns (those a resume may change): a finished run made with other
# values still counts
BOOKKEEPING_FIELDS = on_resume_fields(PPOArgs)


# ----------------------------------------------------------------------------- arguments

def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(ExperimentError, prog="python -m lab.experiments",
                description="Run every (method, seed[, KL coefficient]) training run, skip finished ones, "
                            "resume cut-off ones, then write the report.")
    task = p.add_mutually_exclusive_group(required=True)
    task.add_argument("--task", help="a task with training scripts <task>_train/{ppo,cory}.py in the repository")
    task.add_argument("--task_file", metavar="FILE", help="a task in one file, run as `python FILE ppo|cory` "
                      "(docs/adding_a_task.md)")
    p.add_argument("--preset", help="configs/<task>/<ppo|cory>_<preset>.yaml, e.g. paper, cpu or tiny (default: cpu "
                                    "for --task; none, the script's own values, for --task_file)")
    p.add_argument("--methods", default="ppo,cory",
                   help=f"comma-separated, from {', '.join(METHODS)} (default ppo,cory). Ablations: cory_no_kt "
                        "(--knowledge_transfer false), cory_no_swap (--swap_period 0), ppo_2x (a model twice the "
                        "size). Confounds: ppo_norm = PPO with --score_norm true (the authors normalise CORY's "
                        "scores, not PPO's); cory_norm = CORY with --score_norm true; cory_authors = CORY with --reset_on_swap true --init_kl_coef 0.4 "
                        "(the authors' code resets Adam, the KL controller and the score statistics at each role "
                        "exchange and starts from eta 0.4; its own --init_kl_coef wins over --kl_coefs and --set, "
                        "so each of its sweep folders runs at 0.4)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--steps", help="iterations per run (default: the preset's)")
    p.add_argument("--out", required=True, help="experiment folder, e.g. results/imdb_cpu")
    p.add_argument("--kl_coefs", help="comma-separated init KL coefficients: an eta sweep, one run folder "
                                      "<method>_kl<eta> per value (the adaptive controller stays as in the preset; "
                                      "cory_authors keeps its own 0.4: later flags win)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an override for every run whose script has FIELD (repeatable); the method's own "
                        "flags win over it (cory_no_swap keeps swap_period 0)")
    p.add_argument("--model_2x", help="the model for ppo_2x (default: the preset model's larger sibling: "
                   + ", ".join(f"{k} -> {v}" for k, v in LARGER_MODEL.items()) + ")")
    p.add_argument("--jobs", default="1", help="runs at a time (default 1; each run already uses every core)")
    p.add_argument("--restart_cut_off", action="store_true",
                   help="start again the runs cut off in another copy of this folder (committed from a lent GPU's "
                        "call: metrics, no checkpoint): their folders move under OUT/cut_off/<n>/, nothing deleted")
    p.add_argument("--no_report", action="store_true", help="do not write the report at the end")
    p.add_argument("--no_eval", action="store_true", help="do not evaluate the finished runs' final models and the "
                   "base model on held-out prompts (python -m lab.evaluate; by default for reward tasks)")
    p.add_argument("--eval_args", default="", metavar="'ARGS'",
                   help="more arguments for python -m lab.evaluate, e.g. '--limit 200 --n 4' (a pass@k task "
                        "such as gsm8k is evaluated only when they are given)")
    return p


def _split(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise ExperimentError(f"--{what}: expected a comma-separated list, got {text!r}")
    return list(dict.fromkeys(items))


def _int(text: str, what: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ExperimentError(f"--{what}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise ExperimentError(f"--{what}: must be >= {minimum}, got {value}")
    return value


def _seed(text: str) -> int:
    """A seed the training scripts take (a run refused for it would only show in the report)."""
    seed = _int(text, "seeds", 0)
    if seed >= SEED_LIMIT:
        raise ExperimentError(f"--seeds: must be below 2**31, got {seed}")
    return seed


def _check_eval_args(args, task: str, cfg: dict) -> None:
    """--eval_args as the held-out evaluations will take them (``cfg``: a run's config), checked before the first
    run: lab.evaluate would refuse them only after the training."""
    try:
        eval_args = shlex.split(args.eval_args)
    except ValueError as e:
        raise ExperimentError(f"--eval_args: {e} in {args.eval_args!r}") from None
    if not eval_args or args.no_eval:  # nothing of the user's to check
        return
    why_not = heldout_runs.wanted(task, eval_args)
    if why_not:  # (a task file's task is registered in its own processes only)
        raise ExperimentError(f"--eval_args {args.eval_args!r}: the runner will not evaluate these runs ({why_not}), "
                              "so nothing would take them; leave --eval_args out and evaluate the finished runs with "
                              "python -m lab.evaluate")
    why = heldout_runs.check_eval_args(task, cfg, eval_args)
    if why:
        raise ExperimentError(f"--eval_args {args.eval_args!r}: {why}")


def _overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not eq or not key:
            raise ExperimentError(f"--set: expected FIELD=VALUE, got {item!r}")
        if key in RUNNER_FIELDS or key == "config":
            raise ExperimentError(f"--set {key}: set by the runner itself; use its own flag "
                                  "(--task, --seeds, --steps, --out) instead")
        out[key] = value
    return out


@dataclass
class Scripts:
    """Where a task's two training scripts and its presets are."""
    commands: dict[str, list[str]]  # "ppo" | "cory" -> the script and its arguments (relative to workdir when inside)
    configs: Path | None            # the presets' folder
    workdir: Path = REPO            # where they run: a task file's in the folder the runner was run in, so that its
                                    # own relative paths are the user's (the repository's scripts: in the repository)


def task_scripts(args: argparse.Namespace) -> Scripts:
    if args.task_file is not None:
        refusal = text_refusal(args.task_file, "--task_file")  # its name goes into runs.json and each run's config
        if refusal:
            raise ExperimentError(refusal)
        path = Path(args.task_file).expanduser().resolve()
        if not path.is_file():
            raise ExperimentError(f"--task_file: {args.task_file} not found")
        try:  # from bytes: a file that is not UTF-8 is a SyntaxError naming its line, as Python would run it
            compile(path.read_bytes(), str(path), "exec")
        except SyntaxError as e:
            raise ExperimentError(f"--task_file: {args.task_file} line {e.lineno}: {e.msg}") from None
        here = Path.cwd().resolve()
        return Scripts({m: [rel(path, here), m] for m in ("ppo", "cory")}, None, here)
    tasks = sorted(d.name.removesuffix("_train") for d in REPO.glob("*_train") if (d / "ppo.py").is_file())
    if args.task not in tasks:
        raise ExperimentError(f"--task: {args.task!r} is not one of {', '.join(tasks)} (the <task>_train folders "
                              "here); a task in one file runs with --task_file FILE")
    return Scripts({m: [f"{args.task}_train/{m}.py"] for m in ("ppo", "cory")}, REPO / "configs" / args.task)


def script_config(script: list[str], flags: list[str], what: str, cwd: Path = REPO) -> dict:
    """The config a training script resolves from ``flags``, checked as it checks it before loading a model:
    the runner asks the script itself (``--print_config``, run in ``cwd``) rather than rebuilding its values."""
    p = subprocess.run([sys.executable, *script, *flags, "--print_config"], cwd=cwd, capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise ExperimentError(f"{what}: {last.removeprefix('error: ')}")
    _, marker, printed = p.stdout.partition(CONFIG_MARKER + "\n")
    try:
        config = yaml.safe_load(printed)["config"] if marker else None
    except (yaml.YAMLError, TypeError, KeyError):
        config = None
    if not isinstance(config, dict):
        raise ExperimentError(f"{what}: `python {' '.join(script)} --print_config` printed no config; a task file "
                              "must end with `if __name__ == \"__main__\": main(...)` (docs/adding_a_task.md)")
    return config


def plan(args: argparse.Namespace) -> tuple[list[Pair], dict]:
    """Every run this command asks for, each validated by its training script; writes nothing."""
    scripts = task_scripts(args)
    preset = _preset(args, scripts)
    methods = _split(args.methods, "methods")
    for m in methods:
        if m not in METHODS:
            raise ExperimentError(f"--methods: {m!r} is not one of {', '.join(METHODS)}")
    seeds = [_seed(s) for s in _split(args.seeds, "seeds")]
    steps = None if args.steps is None else _int(args.steps, "steps", 1)
    jobs = _int(args.jobs, "jobs", 1)
    kl_coefs = _kl_coefs(args)
    sets = _overrides(args.set)
    if "init_kl_coef" in sets and args.kl_coefs is not None:
        raise ExperimentError("--set init_kl_coef: conflicts with --kl_coefs, which sets it per run")
    out = _out(args)

    # each script's own values with the preset: its fields, and the base every run's flags change
    scripts_used = list(dict.fromkeys(METHODS[m][0] for m in methods))
    preset_files = {s: None if preset is None else scripts.configs / f"{s}_{preset}.yaml" for s in scripts_used}
    preset_flags = {s: [] if f is None else ["--config", rel(f)] for s, f in preset_files.items()}
    bases = {s: script_config(scripts.commands[s], preset_flags[s], f"{s} script", scripts.workdir)
             for s in scripts_used}
    known = set().union(*bases.values())
    for key in sets:
        if key not in known:
            if key in CoryArgs.__dataclass_fields__:
                raise ExperimentError(f"--set {key}: not a field of any of the methods {', '.join(methods)}")
            raise ExperimentError(f"--set {key}: unknown field; see `python {' '.join(scripts.commands['cory'])} "
                                  "--help`")
    task = next(iter(bases.values()))["task"]
    _check_eval_args(args, task, next(iter(bases.values())))

    pairs = []
    for method in methods:
        script_name, method_flags = METHODS[method]
        base = bases[script_name]
        try:
            given = load_yaml(preset_files[script_name]) if preset_files[script_name] is not None else {}
        except ConfigError as e:
            raise ExperimentError(str(e)) from None
        mine = {k: v for k, v in sets.items() if k in base}
        flags = [f for k, v in mine.items() for f in (f"--{k}", v)]
        method_flags = list(method_flags)
        if method == "ppo_2x":
            method_flags += ["--model_name", _larger_model(args, mine.get("model_name") or base["model_name"])]
        for eta in kl_coefs:
            eta_flags = [] if eta is None else ["--init_kl_coef", repr(eta)]
            all_flags = flags + eta_flags + method_flags
            extra = all_flags + ([] if steps is None else ["--steps", str(steps)])
            cfg = base if not extra else script_config(scripts.commands[script_name],
                                                       preset_flags[script_name] + extra, method, scripts.workdir)
            asked = (set(given) | {k[2:] for k in all_flags[::2]}) - set(BOOKKEEPING_FIELDS)
            intended = {k: cfg[k] for k in sorted(asked) if k in cfg}
            command_ = scripts.commands[script_name]
            for seed in seeds:
                label = method if eta is None else f"{method}_kl{eta:g}"
                pairs.append(Pair(method, seed, eta, command_[0],
                                  None if preset_files[script_name] is None else rel(preset_files[script_name]),
                                  all_flags, out / "runs" / label / f"seed_{seed}", cfg["steps"],
                                  {**intended, "seed": seed}, tuple(command_[1:]), scripts.workdir))
    spec = {"task": task, "preset": preset, "methods": methods, "seeds": seeds, "steps": steps,
            "kl_coefs": None if args.kl_coefs is None else kl_coefs, "set": sets, "jobs": jobs, "out": out}
    return pairs, spec


def _preset(args, scripts: Scripts) -> str | None:
    preset = args.preset or ("cpu" if scripts.configs is not None else None)
    if preset is not None and scripts.configs is None:
        raise ExperimentError("--preset: a task file's runs take the file's own values (change them with --set)")
    if preset is not None:
        presets = sorted(p.stem.split("_", 1)[1] for p in scripts.configs.glob("ppo_*.yaml"))
        if preset not in presets:
            raise ExperimentError(f"--preset: {preset!r} is not one of {', '.join(presets) or 'none'} "
                                  f"({rel(scripts.configs)}/ppo_<preset>.yaml)")
    return preset


def _kl_coefs(args) -> list[float | None]:
    """The η sweep's values, or [None]: the preset's own η."""
    if args.kl_coefs is None:
        return [None]
    kl_coefs = []
    for t in _split(args.kl_coefs, "kl_coefs"):
        try:
            v = float(t)
        except ValueError:
            raise ExperimentError(f"--kl_coefs: expected numbers, got {t!r}") from None
        if not math.isfinite(v) or v < 0:
            raise ExperimentError(f"--kl_coefs: must be finite and >= 0, got {t}")
        if v not in kl_coefs:
            kl_coefs.append(v)
    return kl_coefs


DESIGN_FILES = {"DESIGN.md", "design.yaml", "base_draws"}  # base_draws: the base model sampled again (design.yaml)


def _out(args) -> Path:
    """The experiment folder: nothing yet, an empty folder, one holding only its design (DESIGN.md, design.yaml)
    or one of the runner's own experiments (it has runs.json), and never inside a training run's folder. A symbolic
    link is judged by the folder it leads to."""
    if not args.out.strip():  # "" would resolve to the current folder and fill it with the experiment
        raise ExperimentError(f"--out: must name the experiment folder, got {args.out!r}")
    try:  # written into runs.json and every run's config: under a C locale it must be ASCII
        check_text_path(args.out, "--out")
    except ConfigError as e:
        raise ExperimentError(str(e)) from None
    out = Path(args.out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ExperimentError(f"--out: {args.out} exists and is not a folder")
    if (out / MANIFEST).is_file():
        raise ExperimentError(f"--out: {args.out} is a training run's folder, not an experiment folder; choose "
                              "another --out")
    run = next((d for d in out.parents if (d / MANIFEST).is_file()), None)
    if run is not None:  # the run's --overwrite would then refuse its folder, and its --resume misread it
        raise ExperimentError(f"--out: {args.out} is inside the training run {run}; choose a folder outside it")
    held = sorted(p.name for p in out.iterdir() if p.name != LOCK) if out.is_dir() else []
    # a design is written (and committed) before its runs, so a folder holding only it is the experiment's own
    if held and not set(held) <= DESIGN_FILES and not (out / "runs.json").is_file():
        raise ExperimentError(f"--out: {args.out} holds files ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}"
                              ") and no runs.json, so it is not an experiment folder; the runner writes only into a "
                              "new or empty folder or one of its own experiments: choose another --out")
    return out


def _larger_model(args, model: str) -> str:
    if args.model_2x:
        return args.model_2x
    bigger = LARGER_MODEL.get(model)
    if bigger is None:
        raise ExperimentError(f"--methods ppo_2x: no model twice the size of {model!r} is known; "
                              "pass --model_2x MODEL or drop ppo_2x")
    try:
        check_hub_asset(bigger, "model", timeout=5.0)
    except AssetError:
        raise ExperimentError(f"--methods ppo_2x: {bigger} (about twice {model}) is not available here "
                              "(not in the Hugging Face cache and the hub is unreachable); "
                              "drop ppo_2x or pass --model_2x with a local model folder") from None
    return bigger


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    pairs, spec = plan(args)
    out: Path = spec["out"]
    # a refusal comes before the lock, so that a refused command leaves nothing behind; _run checks again once
    # no other runner can change the folder
    busy = in_use(out, "--out", "experiment runner") if out.is_dir() else None
    if busy:
        raise ExperimentError(busy)
    _check_experiment_folder(args, spec, out)
    _states(pairs, args.restart_cut_off)
    try:  # one runner per experiment folder (its runs.json); each run locks its own folder too
        lock = RunLock(out, "--out", "experiment runner").acquire()
    except ConfigError as e:
        raise ExperimentError(str(e)) from None
    try:
        return _run(args, argv, pairs, spec, out)
    finally:
        lock.release()


GPU_SHARE_ENV = "CORY_CUDA_SHARE"  # cory.passes.SHARE_ENV, named here so the runner need not import torch


def child_env(environ, jobs: int) -> dict:
    """The runs' environment: parallel runs share the cores (instead of each starting one thread per core) and the
    GPU (each budgets its passes within its share, ``cory.passes.cuda_share``; 0.9 of the card in all, since
    every process's CUDA context and allocator slack lie outside what it budgets). A setting the user made wins. A
    relative CORY_CACHE is made absolute from where the runner was started: the runs start in the repository."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    if env.get("CORY_CACHE"):
        env["CORY_CACHE"] = os.path.abspath(os.path.expanduser(env["CORY_CACHE"]))
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
        env.setdefault(GPU_SHARE_ENV, f"{0.9 / jobs:.4f}")
    return env


def _run(args, argv, pairs: list[Pair], spec: dict, out: Path) -> int:
    """Check every run's folder, record the invocation, train what is not finished, evaluate, report."""
    from tqdm.auto import tqdm

    _check_experiment_folder(args, spec, out)
    states = _states(pairs, args.restart_cut_off)
    again = [pair for pair in pairs if states[pair.key][0] == "again"]
    if again:
        print(f"set aside {len(again)} run(s) cut off elsewhere: {rel(set_aside(again, out))}")
        states = _states(pairs)
    record = Record(out, spec)
    invocation = _record_invocation(record, argv)
    todo = []
    for pair in pairs:
        state, why = states[pair.key]
        if state == "finished":
            invocation["skipped"] += 1
            record.run(pair)["status"] = "finished"
            tqdm.write(f"skip   {pair.key}: {why}")
        else:
            todo.append((pair, state, why))
    record.save()
    env = child_env(os.environ, min(spec["jobs"], max(1, len(todo))))  # the runs at once: jobs, or fewer left to do

    children = Children()
    failed = _train(todo, len(pairs), spec, record, invocation, out, env, children)
    if children.stopped_by is not None:
        print(f"interrupted: rerun the same command to continue (records in {rel(record.path)})", file=sys.stderr)
        return 128 + children.stopped_by
    failed += _evaluate(args, pairs, spec, out, env, children)
    if children.stopped_by is not None:
        print("interrupted: rerun the same command to finish the evaluations", file=sys.stderr)
        return 128 + children.stopped_by
    if not args.no_report:
        try:
            print(f"report: {rel(build_report(out))}")
        except ReportError as e:
            print(f"error: report: {e}", file=sys.stderr)
            return 1
    if failed:
        runs = [k for k in failed if not k.startswith("eval ")]
        what = [f"{len(runs)} of {len(pairs)} run(s) failed"] if runs else []
        what += [f"{len(failed) - len(runs)} evaluation(s) failed"] if len(failed) > len(runs) else []
        print(f"{' and '.join(what)}: {', '.join(failed)} (see {rel(out / 'logs')})", file=sys.stderr)
        return 1
    return 0


def _check_experiment_folder(args, spec: dict, out: Path) -> None:
    """``--out`` holds no other task's or preset's experiment, and no training run of its own."""
    try:
        prior = json.loads((out / "runs.json").read_text(encoding="utf-8")) if (out / "runs.json").is_file() else {}
    except ValueError:  # not JSON, or not UTF-8
        raise ExperimentError(f"--out: {rel(out / 'runs.json')} is not valid UTF-8 JSON; fix or remove it") from None
    if not isinstance(prior, dict):
        raise ExperimentError(f"--out: {rel(out / 'runs.json')} holds a JSON {type(prior).__name__}, not the runner's "
                              "record of its runs; fix or remove it")
    for key in ("task", "preset"):
        if prior.get(key) not in (None, spec[key]):
            raise ExperimentError(f"--out: {args.out} holds the {prior.get('task')}/{prior.get('preset')} "
                                  f"experiment; use another folder for {spec['task']}/{spec['preset']}")


def _states(pairs: list[Pair], restart_cut_off: bool = False) -> dict[str, tuple[str, str]]:
    """Each run's state (``pair_state``); a folder holding a run made otherwise (other settings, or more
    iterations than --steps), or what rerunning or continuing it would delete, is refused before anything is
    written: a runner never replaces or shortens a run, nor deletes a result. With ``restart_cut_off``, a run
    cut off elsewhere (``cut_off_elsewhere``) is "again": to be set aside, then started anew."""
    states = {}
    for pair in pairs:
        state, why = pair_state(pair)
        if state != "new":
            bad = mismatch(pair)
            if bad:
                raise ExperimentError(f"{rel(pair.run_dir)} holds a run with {bad}; use another --out or move that "
                                      "folder away")
        if restart_cut_off and cut_off_elsewhere(pair, state):
            states[pair.key] = ("again", "cut off elsewhere, set aside")
            continue
        refusal = lost_by(pair, state)
        if refusal:
            raise ExperimentError(refusal)
        states[pair.key] = (state, why)
    return states


def _record_invocation(record: Record, argv) -> dict:
    commit, dirty = git_state()
    invocation = {"command": shlex.join(["python", "-m", "lab.experiments",
                                          *(sys.argv[1:] if argv is None else argv)]),
                  "started": now(), "git_commit": commit, "git_dirty": dirty, "python": sys.version.split()[0],
                  "ran": 0, "skipped": 0, "failed": 0}
    record.data["invocations"].append(invocation)
    record.save()
    return invocation


def _train(todo: list, total: int, spec: dict, record: Record, invocation: dict, out: Path, env: dict,
           children: Children) -> list[str]:
    """The training runs still to do, ``jobs`` at a time; a stop signal is passed on to the running ones, which
    save a checkpoint (``children.stopped_by`` says so afterwards). Returns the keys of the runs that failed."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=total - len(todo), desc=f"{spec['task']} {spec['preset'] or ''}", unit="run",
               dynamic_ncols=True)
    failed = []

    def stop(signum, frame):
        children.stop(passed_on(signum))
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    pool = ThreadPoolExecutor(max_workers=spec["jobs"])
    try:
        futures = {pool.submit(execute, pair, state, record, out, env, why, children): pair
                   for pair, state, why in todo}
        for fut in as_completed(futures):
            pair, attempt = futures[fut], fut.result()
            invocation["ran"] += 1
            if attempt["exit_status"] is None:  # never started: the runner was stopping
                continue
            if attempt["exit_status"] == 0:
                tqdm.write(f"done   {pair.key} in {attempt['wall_time_s']:.0f} s")
            else:
                failed.append(pair.key)
                invocation["failed"] += 1
                tqdm.write(f"FAILED {pair.key} (exit {attempt['exit_status']}): {attempt.get('error')}; "
                           f"log: {attempt['log']}", file=sys.stderr)
            bar.update(1)
            record.save()
    except KeyboardInterrupt:
        if children.stopped_by is None:  # (our handler has passed the signal on already)
            children.stop(signal.SIGINT)
        tqdm.write("interrupted: waiting for the current run(s) to save a checkpoint ...")
        while True:  # a second signal is passed on too (the runs stop at once): keep waiting for them
            try:
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:
                pass
    finally:
        pool.shutdown(wait=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
        bar.close()
        invocation["finished"] = now()
        record.save()
    return failed


# a hang-up (the terminal or the ssh session the runner ran in closed) stops the runs as SIGTERM does: each saves a
# checkpoint and stops, and a rerun finds them cut off (a training script that got SIGHUP itself would die unsaved)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def passed_on(signum: int) -> int:
    """The signal a runner's stop signal ``signum`` is passed on to its runs as."""
    return signal.SIGTERM if signum == signal.SIGHUP else signum


def _evaluate(args, pairs: list[Pair], spec: dict, out: Path, env: dict, children: Children) -> list[str]:
    """The held-out evaluations of the finished runs and of the base model (``lab.heldout_runs``); the names
    of those that failed."""
    from tqdm.auto import tqdm

    if args.no_eval:
        return []
    eval_args = shlex.split(args.eval_args)
    why_not = heldout_runs.wanted(spec["task"], eval_args)
    if why_not:
        tqdm.write(f"no held-out evaluation: {why_not}")
        return []
    todo = heldout_runs.commands(spec["task"], [(p.key, p.run_dir) for p in pairs], out, eval_args, rel,
                                 args.task_file)
    previous = {s: signal.signal(s, lambda signum, frame: children.stop(passed_on(signum))) for s in STOP_SIGNALS}
    try:
        return [f"eval {name}" for name in heldout_runs.run_evaluations(todo, out, env, children, tqdm.write, REPO)]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _out_given(argv: list[str]) -> str:
    """The --out of a command line, as typed, to name where a file-system fault happened."""
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--out="):
            return arg.split("=", 1)[1]
    return "--out"


def main(argv: list[str] | None = None) -> None:
    try:
        status = run(argv)
    except ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except OSError as e:  # a full or read-only disk under --out (runs.json is rewritten whole or not at all)
        print(f"error: {file_fault(e, _out_given(sys.argv[1:] if argv is None else argv))}", file=sys.stderr)
        raise SystemExit(1)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
