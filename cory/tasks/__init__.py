"""Tasks: prompts, the observer's prompt, data, a reward, where answers stop and how held-out examples are
scored, behind one protocol (``cory.tasks.base.Task``) and one registry (``cory.tasks.registry``).

Built in: every module of this package registers its own task when imported (``imdb``: the subjective sentiment
reward; ``gsm8k``: objective 0/1 correctness; ``arithmetic``: small sums in GSM8K's prompt form, 0/1), and importing the package imports them all. A new task is one
class and one ``register_task`` call (docs/adding_a_task.md); nothing outside its module needs to know it by name.
"""
from __future__ import annotations

import importlib
import pkgutil

from cory.tasks.base import (PASS_AT_K, REWARD_METRICS, TRAINING_PROTOCOL, Evaluation, Example, SamplingProtocol, Task,
                             TaskBase, check_examples)
from cory.tasks.registry import (TaskSpec, check_config, check_eval_config, load_task_file, make_eval_task, make_task,
                                 register_task, registered, task_spec)

__all__ = ["Evaluation", "Example", "PASS_AT_K", "REWARD_METRICS", "SamplingProtocol", "TRAINING_PROTOCOL", "Task",
           "TaskBase", "TaskSpec", "check_config", "check_examples", "check_eval_config", "load_task_file", "make_eval_task", "make_task",
           "register_task", "registered", "task_spec"]

_NOT_TASKS = {"base", "registry", "gsm8k_answers"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _NOT_TASKS:
        importlib.import_module(f"{__name__}.{_module.name}")
