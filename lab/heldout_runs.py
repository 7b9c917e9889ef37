"""The runner's held-out evaluations: every finished run's final model(s), and the base model once per experiment
folder, scored by ``python -m lab.evaluate`` on the task's held-out prompts (issue 25: a comparison reads
"did the methods learn" and "similar reward" from models answering prompts they never trained on).

Each evaluation is a process of its own, like the training runs, with its output in ``OUT/logs/eval/``; a run
keeps its result beside it (``RUN/eval_<task>.json``), the base model's goes to ``OUT/eval_base_<task>.json``. A
result already there is not redone, so rerunning the runner evaluates only what is new. Reward tasks (IMDB) are
evaluated by default (about a minute per model on a CPU); a pass@k task's evaluation samples many long answers per
question, so it runs only when ``--eval_args`` gives it a budget (e.g. ``--limit 200 --n 4``).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from cory.config import load_yaml
from cory.errors import AssetError, ConfigError
from lab.errors import EvalError
from cory.run.final import final_complete, read_evaluation, stale
from cory.tasks import REWARD_METRICS, registered


def _saved(run_dir: Path) -> dict:
    try:
        return load_yaml(run_dir / "config.yaml")
    except ConfigError:
        return {}


def _to_redo(run_dir: Path, result: Path) -> bool:
    """No evaluation of the run's final models is there: none, one that cannot be read (cut short), or one of
    other weights than final/ holds now (a resume replaced them after it was written)."""
    doc = read_evaluation(result) if result.is_file() else None
    return doc is None or stale(run_dir, doc)


def wanted(task: str, eval_args: list[str]) -> str | None:
    """None when the runner evaluates this task, else why not (one line)."""
    spec = registered().get(task)
    if spec is None:
        return f"task {task} is not registered in the runner's process"
    if spec.evaluation.metrics != REWARD_METRICS and not eval_args:
        return (f"{task} is scored by {spec.evaluation.metrics} over many samples per question: pass --eval_args "
                "with a budget (e.g. '--limit 200 --n 4') to evaluate its runs")
    return None


def commands(task: str, runs: list[tuple[str, Path]], out: Path, eval_args: list[str], rel,
             task_file: str | None = None) -> list[tuple[str, list[str], Path]]:
    """(name, command, result file) of each evaluation still to do: ``runs`` are (key, folder) of the runs; those
    with whole final models are evaluated, unless their evaluation is there and still theirs. ``rel(path)`` writes
    a path as the command shows it (from the repository)."""
    evaluate = [sys.executable, "-m", "lab.evaluate", "--task", task]
    if task_file is not None:
        evaluate += ["--task_file", task_file]
    todo = []
    done_runs = [(key, d) for key, d in runs if final_complete(d)]
    for key, run_dir in done_runs:
        result = run_dir / f"eval_{task}.json"
        if _to_redo(run_dir, result):
            todo.append((key, evaluate + ["--model", rel(run_dir), "--no_base", "--json", rel(result), *eval_args],
                         result))
    base_result = out / f"eval_base_{task}.json"
    if done_runs and not base_result.is_file():
        flags = base_flags(task, _saved(done_runs[0][1]))
        todo.append(("base model", evaluate + flags + ["--json", rel(base_result), *eval_args], base_result))
    return todo


def base_flags(task: str, cfg: dict) -> list[str]:
    """lab.evaluate's flags for the base model of runs with config ``cfg``: its model, data and scored reward,
    as the runs read them."""
    spec = registered()[task]
    reward = spec.evaluation.scored_reward(cfg.get("reward_model"))
    flags = ["--model", str(cfg.get("model_name")), "--reference", str(cfg.get("model_name"))]
    for flag, value in (("--dataset", cfg.get("dataset")), ("--dataset_path", cfg.get("dataset_path")),
                        ("--reward", reward)):
        if value is not None:
            flags += [flag, str(value)]
    if spec.evaluation.metrics == REWARD_METRICS:
        flags += ["--allow_early_eos", "true" if cfg.get("allow_early_eos") else "false"]
    return flags


# what the runner sets in each evaluation's command itself
RUNNER_FLAGS = ("--task", "--task_file", "--model", "--no_base", "--json")


def check_eval_args(task: str, cfg: dict, eval_args: list[str]) -> str | None:
    """Why ``python -m lab.evaluate`` would refuse ``eval_args`` (one line), or None: checked before the first
    run, as the base model's evaluation will run them (after training would be hours too late)."""
    own = next((a for a in eval_args if a.split("=")[0] in RUNNER_FLAGS), None)
    if own is not None:
        return f"{own.split('=')[0]} is set by the runner itself"
    from lab.evaluation_plan import plan  # torch: only when there are evaluations to check

    try:  # (a task file's task is not evaluated by the runner: see wanted)
        plan(["--task", task, *base_flags(task, cfg), *eval_args])
    except (EvalError, ConfigError, AssetError) as e:
        return str(e)
    return None


def run_evaluations(todo: list[tuple[str, list[str], Path]], out: Path, env: dict, children, write,
                    cwd: Path) -> list[str]:
    """Run each evaluation in turn (``children``: the runner's ``Children``, which passes a stop signal on;
    ``write`` prints a line); returns the names of those that failed."""
    failed = []
    for name, cmd, result in todo:
        log = out / "logs" / "eval" / (name.replace("/", "_").replace(" ", "_") + ".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        shown = shlex.join(["python", *cmd[1:]])
        write(f"eval   {name}: {shown}")
        t0 = time.perf_counter()
        with open(log, "a") as f:
            f.write(f"\n==== {shown}\n")
            f.flush()
            proc = children.start(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                  stdin=subprocess.DEVNULL)
            if proc is None:  # the runner is stopping
                return failed
            status = children.wait(proc)
        if status != 0 or not result.is_file():
            failed.append(name)
            write(f"FAILED eval {name} (exit {status}); log: {log}")
        else:
            write(f"done   eval {name} in {time.perf_counter() - t0:.0f} s: {result}")
    return failed
