"""Tasks: prompts, the observer's prompt, data and a reward, behind one protocol (``cory.tasks.base.Task``).

Built in: IMDB (subjective sentiment reward) and GSM8K (objective 0/1 correctness). A new task is one class
and one ``register_task`` call (docs/adding_a_task.md); the trainer never needs to know it by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cory.config import ConfigError
from cory.tasks.base import Example, Task

__all__ = ["Example", "Task", "TaskSpec", "check_config", "make_task", "register_task", "registered"]


@dataclass
class TaskSpec:
    make: Callable  # (cfg, tokenizer, seed) -> Task
    datasets: tuple[str, ...] = ("auto",)  # the values ``dataset`` may take
    rewards: tuple[str, ...] = ()  # the values ``reward_model`` may take; () = any
    check: Callable | None = None  # (cfg) -> None, raising ConfigError: what else to check before loading


_REGISTRY: dict[str, TaskSpec] = {}


def register_task(name: str, make: Callable, *, datasets=("auto",), rewards=(), check=None) -> None:
    """Make ``task: name`` mean ``make(cfg, tokenizer, seed)``, a ``Task``; ``datasets`` and ``rewards`` are the
    values the config's ``dataset`` and ``reward_model`` may take (no ``rewards``: any)."""
    _REGISTRY[name] = TaskSpec(make, tuple(datasets), tuple(rewards), check)


def registered() -> dict[str, TaskSpec]:
    return dict(_REGISTRY)


def make_task(cfg, tokenizer, rank: int = 0) -> Task:
    """The task a config names; data-parallel ranks draw different batches."""
    return _spec(cfg.task).make(cfg, tokenizer, cfg.seed + 1000 * rank)


def _spec(name: str) -> TaskSpec:
    if name not in _REGISTRY:
        raise ConfigError(f"task: {name!r} is not one of {', '.join(_REGISTRY)} (or a task registered with "
                          "cory.tasks.register_task)")
    return _REGISTRY[name]


def check_config(cfg) -> None:
    """The task, reward and data a config names, checked before any model loads (ConfigError, one line)."""
    spec = _spec(cfg.task)
    if cfg.dataset not in spec.datasets:
        raise ConfigError(f"dataset: {cfg.dataset!r} is not one of {', '.join(spec.datasets)}")
    if spec.rewards and cfg.reward_model not in spec.rewards:
        raise ConfigError(f"reward_model: {cfg.reward_model!r} is not allowed for {cfg.task}; allowed: "
                          f"{', '.join(spec.rewards)}")
    if spec.check is not None:
        spec.check(cfg)


# ----------------------------------------------------------------------------- the built-in tasks

def _make_imdb(cfg, tokenizer, seed):
    from cory.tasks.imdb import ImdbTask, make_reward

    return ImdbTask(tokenizer, source=cfg.dataset, seed=seed, reward=make_reward(cfg.reward_model))


def _check_imdb(cfg) -> None:
    from cory.tasks.imdb import check_reward_model

    check_reward_model(cfg.reward_model)
    if cfg.dataset_path is not None:
        raise ConfigError("dataset_path: imdb reads no data files (its prompts come from the hub or the built-in "
                          "openings); drop --dataset_path")


def _make_gsm8k(cfg, tokenizer, seed):
    from cory.assets import context_length
    from cory.tasks.gsm8k import Gsm8kTask

    task = Gsm8kTask(source=cfg.dataset, dataset_path=cfg.dataset_path, seed=seed)
    context = context_length(cfg.model_name)
    if context is not None:  # before the models load: a question too long for them fails only when drawn
        observer = hasattr(cfg, "swap_period") and cfg.knowledge_transfer  # it reads the pioneer's answer too
        task.check_fits(tokenizer, context, cfg.response_length_max * (2 if observer else 1), model=cfg.model_name,
                        prompt=(lambda ex: task.observer_prompt(ex, "")) if observer else None)
    return task


def _check_gsm8k(cfg) -> None:
    from cory.tasks.gsm8k import check_local_files

    if cfg.dataset_path is not None:
        if cfg.dataset not in ("local", "auto"):
            raise ConfigError(f"dataset_path: dataset {cfg.dataset} does not read it; use --dataset local "
                              "(or auto) to train on the files in it")
        check_local_files(cfg.dataset_path, ("train", "test"))


register_task("imdb", _make_imdb, datasets=("auto", "hub", "builtin"), check=_check_imdb)
register_task("gsm8k", _make_gsm8k, datasets=("auto", "hub", "local", "generated"), rewards=("correctness",),
              check=_check_gsm8k)
