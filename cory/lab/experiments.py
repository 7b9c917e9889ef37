"""Run the paper's comparisons: every (method, seed[, KL coefficient]) as a training run, then the report.

    python -m cory.lab.experiments --task imdb --preset cpu --methods ppo,cory,cory_no_kt,cory_no_swap \\
        --seeds 0,1,2 --steps 60 --out results/imdb_cpu [--kl_coefs 0.01,0.1,0.3] [--set field=value ...]

Methods: ``ppo`` and ``cory`` (the comparison); the paper's ablations ``cory_no_kt`` (no knowledge transfer),
``cory_no_swap`` (no role exchange) and ``ppo_2x`` (PPO on a model about twice the size); and two confounds,
the ways the authors' runs differ from a like-for-like comparison:

* ``ppo_norm``: PPO with ``--score_norm true``. The authors normalise CORY's scores but not PPO's (so do the
  IMDB CORY presets here), so CORY vs ``ppo_norm`` compares the two with the same score normalisation.
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
status go to ``OUT/runs.json``, its output to ``OUT/logs/``; at the end ``cory.lab.report`` writes the figures
and ``OUT/REPORT.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import yaml

from cory.assets import check_hub_asset
from cory.cli import OneLineParser
from cory.config import CoryArgs, PPOArgs, load_yaml, on_resume_fields
from cory.errors import AssetError, ConfigError, ExperimentError, ReportError
from cory.lab import heldout_runs
from cory.lab.report import build_report
from cory.outputs import LOCK, RunLock, latest_checkpoint, read_jsonl_rows

REPO = Path(__file__).resolve().parents[2]

# method -> (script, flags that make the method); ppo_2x gets its --model_name at plan time
METHODS: dict[str, tuple[str, list[str]]] = {
    "ppo": ("ppo", []),
    "cory": ("cory", []),
    "cory_no_kt": ("cory", ["--knowledge_transfer", "false"]),
    "cory_no_swap": ("cory", ["--swap_period", "0"]),
    "ppo_2x": ("ppo", []),
    # the confounds (see the module docstring)
    "ppo_norm": ("ppo", ["--score_norm", "true"]),
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


@dataclass
class Pair:
    method: str
    seed: int
    kl_coef: float | None
    script: str         # repo-relative (absolute when outside the repository)
    preset: str | None  # repo-relative; None: the script's own values
    flags: list[str]    # --set overrides, eta, then the method's own flags (later flags win)
    run_dir: Path       # absolute
    steps: int
    intended: dict      # field -> value this command asks for (to compare with a run already there)
    script_args: tuple = ()  # a one-file task's method argument: FILE ppo|cory

    @property
    def label(self) -> str:
        return self.method if self.kl_coef is None else f"{self.method}_kl{self.kl_coef:g}"

    @property
    def key(self) -> str:
        return f"{self.label}/seed_{self.seed}"


# ----------------------------------------------------------------------------- arguments

def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(ExperimentError, prog="python -m cory.lab.experiments",
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
                        "scores, not PPO's); cory_authors = CORY with --reset_on_swap true --init_kl_coef 0.4 "
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
    p.add_argument("--no_report", action="store_true", help="do not write the report at the end")
    p.add_argument("--no_eval", action="store_true", help="do not evaluate the finished runs' final models and the "
                   "base model on held-out prompts (python -m cory.lab.evaluate; by default for reward tasks)")
    p.add_argument("--eval_args", default="", metavar="'ARGS'",
                   help="more arguments for python -m cory.lab.evaluate, e.g. '--limit 200 --n 4' (a pass@k task "
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
    commands: dict[str, list[str]]  # "ppo" | "cory" -> the script and its arguments (repo-relative when inside)
    configs: Path | None            # the presets' folder


def task_scripts(args: argparse.Namespace) -> Scripts:
    if args.task_file is not None:
        path = Path(args.task_file).expanduser().resolve()
        if not path.is_file():
            raise ExperimentError(f"--task_file: {args.task_file} not found")
        return Scripts({m: [_rel(path), m] for m in ("ppo", "cory")}, None)
    tasks = sorted(d.name.removesuffix("_train") for d in REPO.glob("*_train") if (d / "ppo.py").is_file())
    if args.task not in tasks:
        raise ExperimentError(f"--task: {args.task!r} is not one of {', '.join(tasks)} (the <task>_train folders "
                              "here); a task in one file runs with --task_file FILE")
    return Scripts({m: [f"{args.task}_train/{m}.py"] for m in ("ppo", "cory")}, REPO / "configs" / args.task)


def script_config(command: list[str], flags: list[str], what: str) -> dict:
    """The config a training script resolves from ``flags``, checked as it checks it before loading a model:
    the runner asks the script itself (``--print_config``) rather than rebuilding its values."""
    p = subprocess.run([sys.executable, *command, *flags, "--print_config"], cwd=REPO, capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise ExperimentError(f"{what}: {last.removeprefix('error: ')}")
    return yaml.safe_load(p.stdout)["config"]


def plan(args: argparse.Namespace) -> tuple[list[Pair], dict]:
    """Every run this command asks for, each validated by its training script; writes nothing."""
    scripts = task_scripts(args)
    preset = args.preset or ("cpu" if scripts.configs is not None else None)
    if preset is not None and scripts.configs is None:
        raise ExperimentError("--preset: a task file's runs take the file's own values (change them with --set)")
    if preset is not None:
        configs = scripts.configs
        presets = sorted(p.stem.split("_", 1)[1] for p in configs.glob("ppo_*.yaml"))
        if preset not in presets:
            raise ExperimentError(f"--preset: {preset!r} is not one of {', '.join(presets) or 'none'} "
                                  f"({_rel(configs)}/ppo_<preset>.yaml)")
    methods = _split(args.methods, "methods")
    for m in methods:
        if m not in METHODS:
            raise ExperimentError(f"--methods: {m!r} is not one of {', '.join(METHODS)}")
    seeds = [_int(s, "seeds", 0) for s in _split(args.seeds, "seeds")]
    steps = None if args.steps is None else _int(args.steps, "steps", 1)
    jobs = _int(args.jobs, "jobs", 1)
    kl_coefs: list[float | None] = [None]
    if args.kl_coefs is not None:
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
    sets = _overrides(args.set)
    if "init_kl_coef" in sets and args.kl_coefs is not None:
        raise ExperimentError("--set init_kl_coef: conflicts with --kl_coefs, which sets it per run")
    if not args.out.strip():  # "" would resolve to the current folder and fill it with the experiment
        raise ExperimentError(f"--out: must name the experiment folder, got {args.out!r}")
    out = Path(args.out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ExperimentError(f"--out: {args.out} exists and is not a folder")

    # each script's own values with the preset: its fields, and the base every run's flags change
    scripts_used = list(dict.fromkeys(METHODS[m][0] for m in methods))
    preset_files = {s: None if preset is None else configs / f"{s}_{preset}.yaml" for s in scripts_used}
    preset_flags = {s: [] if f is None else ["--config", _rel(f)] for s, f in preset_files.items()}
    bases = {s: script_config(scripts.commands[s], preset_flags[s], f"{s} script") for s in scripts_used}
    known = set().union(*bases.values())
    for key in sets:
        if key not in known:
            if key in CoryArgs.__dataclass_fields__:
                raise ExperimentError(f"--set {key}: not a field of any of the methods {', '.join(methods)}")
            raise ExperimentError(f"--set {key}: unknown field; see `python {' '.join(scripts.commands['cory'])} "
                                  "--help`")
    task = next(iter(bases.values()))["task"]

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
                                                       preset_flags[script_name] + extra, method)
            asked = (set(given) | {k[2:] for k in all_flags[::2]}) - set(BOOKKEEPING_FIELDS)
            intended = {k: cfg[k] for k in sorted(asked) if k in cfg}
            command_ = scripts.commands[script_name]
            for seed in seeds:
                label = method if eta is None else f"{method}_kl{eta:g}"
                pairs.append(Pair(method, seed, eta, command_[0],
                                  None if preset_files[script_name] is None else _rel(preset_files[script_name]),
                                  all_flags, out / "runs" / label / f"seed_{seed}", cfg["steps"],
                                  {**intended, "seed": seed}, tuple(command_[1:])))
    spec = {"task": task, "preset": preset, "methods": methods, "seeds": seeds, "steps": steps,
            "kl_coefs": None if args.kl_coefs is None else kl_coefs, "set": sets, "jobs": jobs, "out": out}
    return pairs, spec


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


# ----------------------------------------------------------------------------- what is already there

def _logged_steps(run_dir: Path) -> set[int]:
    rows, _ = read_jsonl_rows(run_dir / "metrics.jsonl")  # a line cut by a kill is skipped
    return {row["step"] for row in rows if isinstance(row.get("step"), int)}


def _saved_config(run_dir: Path) -> dict | None:
    try:
        return load_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else None
    except ConfigError:
        return None


def pair_state(pair: Pair) -> tuple[str, str]:
    """("new" | "finished" | "resume" | "overwrite", why) for a run folder, from what it holds."""
    d = pair.run_dir
    if not d.is_dir() or all(p.name == LOCK for p in d.iterdir()):
        return "new", "not started"
    saved = _saved_config(d)
    logged = _logged_steps(d)
    saved_steps = saved.get("steps") if saved else None
    if saved and saved_steps == pair.steps and (d / "final").is_dir() and pair.steps - 1 in logged:
        return "finished", f"finished ({pair.steps} iterations)"
    ckpt = latest_checkpoint(d)
    if saved and saved_steps == pair.steps and set(range(pair.steps)) <= logged and ckpt is None:
        # every iteration's metrics and no weights at all: a committed results folder (git keeps no weights),
        # whose metrics are the result - rerunning would only overwrite them
        return "finished", f"finished ({pair.steps} iterations; weights not kept)"
    if saved is None or ckpt is None:
        return "overwrite", "cut off before its first checkpoint"
    done = int(ckpt.name.split("_")[-1])
    if done > pair.steps:
        return "overwrite", f"its checkpoint is past --steps {pair.steps}"
    # a resumed run redoes the iterations after the checkpoint; rows missing before it would stay missing
    if done > (max(logged) + 1 if logged else 0):
        return "overwrite", f"metrics.jsonl lacks rows before its checkpoint at {done}"
    return "resume", f"cut off after {len(logged)} logged iterations; resuming from checkpoint {done}"


def _mismatch(pair: Pair) -> str | None:
    """A field where the run already in the folder differs from what this command asks for."""
    saved = _saved_config(pair.run_dir)
    if saved is None:
        return None
    if isinstance(saved.get("steps"), int) and saved["steps"] > pair.steps:
        return f"steps={saved['steps']} (more than --steps {pair.steps})"
    for key, want in pair.intended.items():
        have = saved.get(key)
        same = (have == want or (isinstance(have, (int, float)) and isinstance(want, (int, float))
                                 and not isinstance(have, bool) and math.isclose(have, want, rel_tol=1e-9)))
        if not same:
            return f"{key}={have!r} (this command asks for {want!r})"
    return None


# ----------------------------------------------------------------------------- running

def _display(cmd: list[str]) -> str:
    return shlex.join(["python", *cmd[1:]])


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def command(pair: Pair, mode: str) -> list[str]:
    out = _rel(pair.run_dir)
    preset = [] if pair.preset is None else ["--config", pair.preset]
    cmd = [sys.executable, pair.script, *pair.script_args, *preset, *pair.flags,
           "--seed", str(pair.seed), "--steps", str(pair.steps), "--output_dir", out]
    if mode == "resume":
        cmd += ["--resume", out]
    elif mode == "overwrite":
        cmd += ["--overwrite", "true"]
    return cmd


def _git() -> tuple[str | None, bool | None]:
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return commit, (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


class Record:
    """runs.json, rewritten atomically after every change so a killed runner leaves it consistent."""

    def __init__(self, out: Path, spec: dict):
        self.path = out / "runs.json"
        self.lock = threading.Lock()
        prior = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.data = {**prior, **{k: v for k, v in spec.items() if k not in ("out", "jobs")}}
        # the folder holds every earlier command's runs too: list them all, not only this command's
        for key in ("methods", "seeds", "kl_coefs"):
            before = prior.get(key) or []
            self.data[key] = before + [v for v in spec[key] or [] if v not in before] or spec[key]
        self.data.setdefault("invocations", [])
        self.data.setdefault("runs", {})

    def save(self) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(".runs.json.tmp")
            tmp.write_text(json.dumps(self.data, indent=2) + "\n")
            os.replace(tmp, self.path)

    def run(self, pair: Pair) -> dict:
        with self.lock:
            rec = self.data["runs"].setdefault(pair.key, {"attempts": []})
            rec.update(method=pair.method, seed=pair.seed, kl_coef=pair.kl_coef, script=pair.script,
                       preset=pair.preset, run_dir=_rel(pair.run_dir))
            return rec


class Children:
    """The training processes running now. Each runs in a session of its own, and a stop signal the runner
    gets (Ctrl-C, or SIGTERM from a scheduler or ``kill``) is passed on to each once, from here: it saves a
    checkpoint and stops, and the runner records it. No run is started after the first signal."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopped_by: int | None = None

    def start(self, cmd: list[str], **kwargs) -> subprocess.Popen | None:
        with self.lock:
            if self.stopped_by is not None:
                return None
            proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
            self.running.add(proc)
            return proc

    def wait(self, proc: subprocess.Popen) -> int:
        status = proc.wait()
        with self.lock:
            self.running.discard(proc)
        return status

    def stop(self, signum: int) -> None:
        with self.lock:
            if self.stopped_by is None:
                self.stopped_by = signum
            for proc in self.running:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)


# a run that saved a checkpoint and stopped on a signal (128 + SIGINT or SIGTERM), or was stopped by one
STOPPED = (130, 143, -signal.SIGINT, -signal.SIGTERM)


def execute(pair: Pair, mode: str, record: Record, out: Path, env: dict, why: str = "",
            children: Children | None = None) -> dict:
    """Run one training process to the end; its output goes to OUT/logs/."""
    from tqdm.auto import tqdm

    cmd = command(pair, mode)
    tqdm.write(f"start  {pair.key} ({why}): {_display(cmd)}")
    log = out / "logs" / pair.label / f"seed_{pair.seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    attempt = {"mode": mode, "command": _display(cmd), "started": _now(), "wall_time_s": None,
               "exit_status": None, "log": _rel(log)}
    rec = record.run(pair)
    with record.lock:
        rec["attempts"].append(attempt)
        rec["status"] = "running"
    record.save()
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"\n==== {attempt['started']} {attempt['command']}\n")
        f.flush()
        children = children or Children()
        proc = children.start(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        if proc is not None:
            with record.lock:
                attempt["pid"] = proc.pid
            record.save()
        status = None if proc is None else children.wait(proc)
    with record.lock:
        attempt["wall_time_s"] = round(time.perf_counter() - t0, 1)
        attempt["exit_status"] = status
        if status not in (0, None):
            attempt["error"] = _last_error(log)
        rec["status"] = ("finished" if status == 0 else
                         "interrupted" if status is None or status in STOPPED else "failed")
    record.save()
    return attempt


def _last_error(log: Path) -> str:
    text = log.read_text(errors="replace")
    text = text[text.rfind("\n==== ") + 1:]  # this attempt's output only (the log is appended to)
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()][1:]
    for ln in reversed(lines):
        if ln.startswith("error:") or "Error" in ln.split(":")[0]:
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    pairs, spec = plan(args)
    out: Path = spec["out"]
    try:  # one runner per experiment folder (its runs.json); each run locks its own folder too
        lock = RunLock(out, "--out", "experiment runner").acquire()
    except ConfigError as e:
        raise ExperimentError(str(e)) from None
    try:
        return _run(args, argv, pairs, spec, out)
    finally:
        lock.release()


def _run(args, argv, pairs: list[Pair], spec: dict, out: Path) -> int:
    from tqdm.auto import tqdm

    try:
        prior = json.loads((out / "runs.json").read_text()) if (out / "runs.json").is_file() else {}
    except json.JSONDecodeError:
        raise ExperimentError(f"--out: {_rel(out / 'runs.json')} is not valid JSON; fix or remove it") from None
    for key in ("task", "preset"):
        if prior.get(key) not in (None, spec[key]):
            raise ExperimentError(f"--out: {args.out} holds the {prior.get('task')}/{prior.get('preset')} "
                                  f"experiment; use another folder for {spec['task']}/{spec['preset']}")
    states = {}
    for pair in pairs:
        state, why = pair_state(pair)
        if state in ("finished", "resume"):
            bad = _mismatch(pair)
            if bad:
                raise ExperimentError(f"{_rel(pair.run_dir)} holds a run with {bad}; use another --out "
                                      "or delete that folder")
        states[pair.key] = (state, why)
    record = Record(out, spec)

    commit, dirty = _git()
    invocation = {"command": shlex.join(["python", "-m", "cory.lab.experiments",
                                          *(sys.argv[1:] if argv is None else argv)]),
                  "started": _now(), "git_commit": commit, "git_dirty": dirty, "python": sys.version.split()[0],
                  "ran": 0, "skipped": 0, "failed": 0}
    record.data["invocations"].append(invocation)
    record.save()

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if spec["jobs"] > 1 and "OMP_NUM_THREADS" not in env:
        # parallel runs share the cores instead of each starting one thread per core
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // spec["jobs"]))
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

    bar = tqdm(total=len(pairs), initial=len(pairs) - len(todo), desc=f"{spec['task']} {spec['preset'] or ''}", unit="run",
               dynamic_ncols=True)
    failed = []
    interrupted = False
    children = Children()

    def stop(signum, frame):
        children.stop(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    pool = ThreadPoolExecutor(max_workers=spec["jobs"])
    try:
        futures = {}
        for pair, state, why in todo:
            futures[pool.submit(execute, pair, state, record, out, env, why, children)] = pair
        for fut in as_completed(futures):
            pair = futures[fut]
            attempt = fut.result()
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
        interrupted = True
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
        invocation["finished"] = _now()
        record.save()
    if interrupted:
        print(f"interrupted: rerun the same command to continue (records in {_rel(record.path)})", file=sys.stderr)
        return 128 + (children.stopped_by or signal.SIGINT)
    failed += _evaluate(args, pairs, spec, out, env, children)
    if children.stopped_by is not None:
        print("interrupted: rerun the same command to finish the evaluations", file=sys.stderr)
        return 128 + children.stopped_by
    if not args.no_report:
        try:
            print(f"report: {_rel(build_report(out))}")
        except ReportError as e:
            print(f"error: report: {e}", file=sys.stderr)
            return 1
    if failed:
        runs = [k for k in failed if not k.startswith("eval ")]
        what = [f"{len(runs)} of {len(pairs)} run(s) failed"] if runs else []
        what += [f"{len(failed) - len(runs)} evaluation(s) failed"] if len(failed) > len(runs) else []
        print(f"{' and '.join(what)}: {', '.join(failed)} (see {_rel(out / 'logs')})", file=sys.stderr)
        return 1
    return 0


def _evaluate(args, pairs: list[Pair], spec: dict, out: Path, env: dict, children: Children) -> list[str]:
    """The held-out evaluations of the finished runs and of the base model (``cory.lab.heldout_runs``); the names
    of those that failed."""
    from tqdm.auto import tqdm

    if args.no_eval:
        return []
    eval_args = shlex.split(args.eval_args)
    why_not = heldout_runs.wanted(spec["task"], eval_args)
    if why_not:
        tqdm.write(f"no held-out evaluation: {why_not}")
        return []
    todo = heldout_runs.commands(spec["task"], [(p.key, p.run_dir) for p in pairs], out, eval_args, _rel,
                                 args.task_file)
    previous = {s: signal.signal(s, lambda signum, frame: children.stop(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return [f"eval {name}" for name in heldout_runs.run_evaluations(todo, out, env, children, tqdm.write, REPO)]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> None:
    try:
        status = run(argv)
    except ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
