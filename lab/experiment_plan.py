"""What ``python -m lab.experiments`` is asked, checked before anything is written: its flags, the task's two
training scripts and presets, the methods (each a script and the flags that make it), the seeds and the η sweep,
the experiment folder, and every run as a ``lab.runs.Pair`` whose config its training script resolved itself
(``--print_config``). A mistake raises a one-line ExperimentError naming the flag.
"""
from __future__ import annotations

import argparse
import math
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from cory.assets import check_hub_asset
from cory.cli import CONFIG_MARKER
from cory.config import RENAMED, SEED_LIMIT, CoryArgs, PPOArgs, load_yaml, on_resume_fields
from cory.errors import AssetError, ConfigError, text_refusal
from cory.run.outputs import LOCK, MANIFEST
from cory.run.targets import check_text_path
from lab import heldout_runs
from lab.errors import ExperimentError, OneLineParser
from lab.runs import REPO, Pair, rel


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

def build_parser() -> argparse.ArgumentParser:
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
        key = RENAMED.get(key, key)  # a field's old name (keep_checkpoints) still works
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
