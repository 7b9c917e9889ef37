"""The registry of tasks: ``register_task(name, make, ...)`` makes ``task: name`` mean a ``Task``; training, the
checks before a run, ``lab.evaluate`` and the experiment runner ask it, and know no task by name."""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cory.errors import AssetError, ConfigError, text_refusal
from cory.tasks.base import Evaluation, Task, zero_one_reward


@dataclass
class TaskSpec:
    make: Callable  # (cfg, tokenizer, seed) -> Task
    datasets: tuple[str, ...] = ("auto",)  # the values ``dataset`` may take
    rewards: tuple[str, ...] = ()  # the values ``reward_model`` may take; () = any
    check: Callable | None = None  # (cfg) -> None, raising ConfigError: what else to check before loading
    prompt_tokens: int = 64  # room kept for the prompt beside the longest answer (the model's context check)
    evaluation: Evaluation = field(default_factory=Evaluation)
    where: str = ""  # file:line of the register_task call
    hub_assets: Callable | None = None  # (cfg) -> [cory.assets.HubAsset]: what the task fetches from the hub


_REGISTRY: dict[str, TaskSpec] = {}


def _caller() -> str:
    frame = sys._getframe(2)  # register_task's caller; its file as a real path (a script may name itself relatively)
    return f"{os.path.realpath(frame.f_code.co_filename)}:{frame.f_lineno}"


def register_task(name: str, make: Callable, *, datasets=("auto",), rewards=(), check=None, prompt_tokens: int = 64,
                  evaluation: Evaluation | None = None, hub_assets: Callable | None = None) -> None:
    """Make ``task: name`` mean ``make(cfg, tokenizer, seed)``, a ``Task``; ``datasets`` and ``rewards`` are the
    values the config's ``dataset`` and ``reward_model`` may take (no ``rewards``: any); ``prompt_tokens``: the
    room its prompts need beside an answer; ``evaluation``: how ``lab.evaluate`` scores it (default: mean
    reward, KL and distinct-n of 15-token answers); ``hub_assets(cfg)``: the hub repositories the task fetches for
    ``cfg`` (``cory.assets.HubAsset``s, by its own rules and without asking the hub; the model is not the task's).
    A name is registered once: a second registration from another place (another task file, or one that shadows a
    built-in task) is a ConfigError naming both places; the same call run again (a module imported twice) replaces
    its own."""
    where = _caller()
    if name in _REGISTRY and _REGISTRY[name].where != where:
        message = (f"task {name!r} is registered twice: at {_REGISTRY[name].where} and at {where}; give one of them "
                   "another name")
        if sys._getframe(1).f_globals.get("__name__") == "__main__":
            # a task file run as a script registers before its cli.main() could catch anything: answer as it would
            print(f"error: {message}", file=sys.stderr)
            raise SystemExit(2)
        raise ConfigError(message)
    _REGISTRY[name] = TaskSpec(make, tuple(datasets), tuple(rewards), check, prompt_tokens,
                               evaluation or Evaluation(), where, hub_assets)


def registered() -> dict[str, TaskSpec]:
    return dict(_REGISTRY)


def task_spec(name: str) -> TaskSpec:
    """The registration of task ``name`` (ConfigError, one line, naming the registered ones)."""
    if name not in _REGISTRY:
        raise ConfigError(f"task: {name!r} is not one of {', '.join(sorted(_REGISTRY))} (or a task registered with "
                          "cory.tasks.register_task)")
    return _REGISTRY[name]


def make_task(cfg, tokenizer, rank: int = 0) -> Task:
    """The task a config names; data-parallel ranks draw different batches."""
    spec = task_spec(cfg.task)
    return _made(cfg.task, spec, lambda: spec.make(cfg, tokenizer, cfg.seed + 1000 * rank))


def make_eval_task(cfg, tokenizer) -> Task:
    """The task whose ``eval_examples`` an evaluation scores (``cfg`` names task, dataset, dataset_path and
    reward_model)."""
    spec = task_spec(cfg.task)
    if spec.evaluation.make is not None:
        return _made(cfg.task, spec, lambda: spec.evaluation.make(cfg, tokenizer))
    return _made(cfg.task, spec, lambda: spec.make(cfg, tokenizer, 0))


def _made(name: str, spec: TaskSpec, make: Callable) -> Task:
    """``make()``'s task, checked where it enters: an unexpected exception or something that is not a task is
    a ConfigError, one line naming the task and where it was registered."""
    try:
        task = make()
    except (ConfigError, AssetError):  # the project's own refusals (a missing data file): they say what is wrong
        raise
    except Exception as e:  # noqa: BLE001 - a plug-in's own bug, or its ValueError, named with its place
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"task {name}: make() raised {type(e).__name__}: {first} (registered at {spec.where})") from None
    missing = [m for m in ("sample", "eval_examples", "score", "observer_prompt") if not callable(getattr(task, m, None))]
    if missing:
        raise ConfigError(f"task {name}: make() returned {type(task).__name__}, not a task (no {', '.join(missing)}; "
                          f"registered at {spec.where})")
    try:
        zero_one_reward(task)  # a declaration that is not True or False, refused where the task enters
    except ConfigError as e:
        raise ConfigError(f"{e} (registered at {spec.where})") from None
    return task


def _check_values(cfg, spec: TaskSpec) -> None:
    if cfg.dataset not in spec.datasets:
        raise ConfigError(f"dataset: {cfg.dataset!r} is not one of {', '.join(spec.datasets)}")
    if spec.rewards and cfg.reward_model not in spec.rewards:
        raise ConfigError(f"reward_model: {cfg.reward_model!r} is not allowed for {cfg.task}; allowed: "
                          f"{', '.join(spec.rewards)}")


def check_values(cfg) -> None:
    """The dataset and reward a config names are ones its task takes (ConfigError, one line); reads no data."""
    _check_values(cfg, task_spec(cfg.task))


def check_config(cfg) -> None:
    """The task, reward and data a config names, checked before any model loads (ConfigError, one line)."""
    spec = task_spec(cfg.task)
    _check_values(cfg, spec)
    if spec.check is not None:
        spec.check(cfg)


def check_eval_config(cfg) -> None:
    """``check_config`` for an evaluation, which reads the held-out data alone."""
    spec = task_spec(cfg.task)
    _check_values(cfg, spec)
    check = spec.evaluation.check or spec.check
    if check is not None:
        check(cfg)


def load_task_file(path: str | Path) -> None:
    """Run a user's one-file task (docs/adding_a_task.md) as a module, so that its ``register_task`` calls
    take effect; its ``if __name__ == "__main__"`` part (the training) does not run."""
    path = Path(path).expanduser()
    refusal = text_refusal(path, "task_file")  # its name goes into the run's config.yaml
    if refusal:
        raise ConfigError(refusal)
    if not path.is_file():
        raise ConfigError(f"task_file: {path} not found")
    try:
        runpy.run_path(str(path), run_name="cory_task_file")
    except SyntaxError as e:
        raise ConfigError(f"task_file: {path} line {e.lineno}: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - the file's own error, named with its line in the file
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
        where = f" line {lines[-1]}" if lines else ""
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"task_file: {path}{where}: {type(e).__name__}: {first}") from None
