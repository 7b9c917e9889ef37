"""Tasks: IMDB (subjective sentiment reward) and GSM8K (objective 0/1 correctness)."""
from __future__ import annotations

from cory.tasks.base import Example, Task

__all__ = ["Example", "Task", "make_task"]


def make_task(cfg, tokenizer, rank: int = 0) -> Task:
    """The task a config names; data-parallel ranks draw different batches."""
    seed = cfg.seed + 1000 * rank
    if cfg.task == "imdb":
        from cory.tasks.imdb import ImdbTask, make_reward

        return ImdbTask(tokenizer, source=cfg.dataset, seed=seed, reward=make_reward(cfg.reward_model))
    if cfg.task == "gsm8k":
        from cory.tasks.gsm8k import Gsm8kTask

        return Gsm8kTask(source=cfg.dataset, dataset_path=cfg.dataset_path, seed=seed)
    raise ValueError(f"task: {cfg.task!r} is not one of imdb, gsm8k")
