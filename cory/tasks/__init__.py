"""Tasks: prompts, the observer's prompt, data, a reward, where answers stop and how held-out examples are
scored, behind one protocol (``cory.tasks.base.Task``) and one registry.

Built in: IMDB (subjective sentiment reward) and GSM8K (objective 0/1 correctness). A new task is one class
and one ``register_task`` call (docs/adding_a_task.md); nothing outside this folder needs to know it by name:
training, the checks before a run, ``cory.lab.evaluate`` and the experiment runner ask the registry.
"""
from __future__ import annotations

import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cory.assets import model_spec
from cory.config import ConfigError
from cory.method import method_of
from cory.tasks.base import (PASS_AT_K, REWARD_METRICS, TRAINING_PROTOCOL, Evaluation, Example, SamplingProtocol, Task,
                             TaskBase)

__all__ = ["Evaluation", "Example", "PASS_AT_K", "REWARD_METRICS", "SamplingProtocol", "TRAINING_PROTOCOL", "Task",
           "TaskBase", "TaskSpec", "check_config", "check_eval_config", "load_task_file", "make_eval_task", "make_task",
           "register_task", "registered", "task_spec"]


@dataclass
class TaskSpec:
    make: Callable  # (cfg, tokenizer, seed) -> Task
    datasets: tuple[str, ...] = ("auto",)  # the values ``dataset`` may take
    rewards: tuple[str, ...] = ()  # the values ``reward_model`` may take; () = any
    check: Callable | None = None  # (cfg) -> None, raising ConfigError: what else to check before loading
    prompt_tokens: int = 64  # room kept for the prompt beside the longest answer (the model's context check)
    evaluation: Evaluation = field(default_factory=Evaluation)


_REGISTRY: dict[str, TaskSpec] = {}


def register_task(name: str, make: Callable, *, datasets=("auto",), rewards=(), check=None, prompt_tokens: int = 64,
                  evaluation: Evaluation | None = None) -> None:
    """Make ``task: name`` mean ``make(cfg, tokenizer, seed)``, a ``Task``; ``datasets`` and ``rewards`` are the
    values the config's ``dataset`` and ``reward_model`` may take (no ``rewards``: any); ``prompt_tokens``: the
    room its prompts need beside an answer; ``evaluation``: how ``cory.lab.evaluate`` scores it (default: mean
    reward, KL and distinct-n of 15-token answers)."""
    _REGISTRY[name] = TaskSpec(make, tuple(datasets), tuple(rewards), check, prompt_tokens,
                               evaluation or Evaluation())


def registered() -> dict[str, TaskSpec]:
    return dict(_REGISTRY)


def task_spec(name: str) -> TaskSpec:
    """The registration of task ``name`` (ConfigError, one line, naming the registered ones)."""
    if name not in _REGISTRY:
        raise ConfigError(f"task: {name!r} is not one of {', '.join(_REGISTRY)} (or a task registered with "
                          "cory.tasks.register_task)")
    return _REGISTRY[name]


def make_task(cfg, tokenizer, rank: int = 0) -> Task:
    """The task a config names; data-parallel ranks draw different batches."""
    return task_spec(cfg.task).make(cfg, tokenizer, cfg.seed + 1000 * rank)


def make_eval_task(cfg, tokenizer) -> Task:
    """The task whose ``eval_examples`` an evaluation scores (``cfg`` names task, dataset, dataset_path and
    reward_model)."""
    spec = task_spec(cfg.task)
    if spec.evaluation.make is not None:
        return spec.evaluation.make(cfg, tokenizer)
    return spec.make(cfg, tokenizer, 0)


def _check_values(cfg, spec: TaskSpec) -> None:
    if cfg.dataset not in spec.datasets:
        raise ConfigError(f"dataset: {cfg.dataset!r} is not one of {', '.join(spec.datasets)}")
    if spec.rewards and cfg.reward_model not in spec.rewards:
        raise ConfigError(f"reward_model: {cfg.reward_model!r} is not allowed for {cfg.task}; allowed: "
                          f"{', '.join(spec.rewards)}")


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
    if not path.is_file():
        raise ConfigError(f"task_file: {path} not found")
    runpy.run_path(str(path), run_name="cory_task_file")


# ----------------------------------------------------------------------------- the built-in tasks
# (their modules load when a run or an evaluation first asks for them: the checks before a model loads stay
# cheap, and importing cory.tasks does not load datasets or reward libraries)

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
    from cory.tasks.gsm8k import Gsm8kTask

    task = Gsm8kTask(source=cfg.dataset, dataset_path=cfg.dataset_path, seed=seed)
    context = model_spec(cfg.model_name).context  # from the disk alone, as the checks before a run read it
    if context is not None:  # before the models load: a question too long for them fails only when drawn
        observer = method_of(cfg).observer_reads_pioneer(cfg)  # the observer reads the pioneer's answer too
        task.check_fits(tokenizer, context, cfg.response_length_max * (2 if observer else 1), model=cfg.model_name,
                        prompt=(lambda ex: task.observer_prompt(ex, "")) if observer else None)
    return task


def _check_gsm8k(cfg, splits=("train", "test")) -> None:
    from cory.tasks.gsm8k import check_local_files

    if cfg.dataset_path is not None:
        if cfg.dataset not in ("local", "auto"):
            raise ConfigError(f"dataset_path: dataset {cfg.dataset} does not read it; use --dataset local "
                              "(or auto) to read the files in it")
        if splits == ("test",) and not (Path(cfg.dataset_path) / "test.jsonl").is_file():
            raise ConfigError(f"dataset_path: {cfg.dataset_path}: no test.jsonl there (expected GSM8K's release "
                              "files)")
        check_local_files(cfg.dataset_path, splits)


def _make_gsm8k_eval(cfg, tokenizer):
    from cory.tasks.gsm8k import Gsm8kTask

    return Gsm8kTask(source=cfg.dataset, dataset_path=cfg.dataset_path, with_train=False)


def _gsm8k_note(task) -> str | None:
    if task.source == "generated":
        return "generated GSM8K-style stand-in problems, NOT GSM8K (pass --dataset_path for the real test set)"
    return None


def _authors_prompt(example) -> str:
    from cory.tasks.gsm8k import build_authors_prompt

    return build_authors_prompt(example.query)


def _authors_score(examples, answers) -> list[float]:
    from cory.tasks.gsm8k import authors_correct

    return [authors_correct(a, ex.meta["solution"]) for a, ex in zip(answers, examples)]


# GSM8K's two ways to evaluate: as training samples and reads answers, or as the authors' GSM8K evaluation behind
# the paper's pass@1 of 18% (arXiv 2410.06101; their team's gsm8k_utils/gsm8k_eval.py): top_k 10, top_p 0.7,
# temperature 1, repetition penalty 1.1, never stopping early (they pass eos_token_id=-1; masking EOS until the
# limit is the nearest transformers setting), their prompt variant and their answer extraction
GSM8K_PROTOCOLS = {
    "training": SamplingProtocol(TRAINING_PROTOCOL.sampling, reading="ending at EOS or a new 'Question:'; '####', "
                                 "else 'answer is', else the last number",
                                 description="Protocol _training_: answers sampled as in training (top_k 0, top_p 1, "
                                             "no repetition penalty), ended at EOS or a new \"Question:\", read by "
                                             "the training reward's extraction."),
    "authors": SamplingProtocol({"top_k": 10, "top_p": 0.7, "temperature": 1.0, "repetition_penalty": 1.1},
                                stop_early=False, prompt=_authors_prompt, score=_authors_score,
                                reading="never stopping early; the authors' prompt; 'the answer is' else the last "
                                        "number, as strings",
                                description="Protocol _authors_: the authors' GSM8K evaluation (top_k 10, top_p 0.7, "
                                            "repetition penalty 1.1, no early stop, their prompt, \"the answer is\" "
                                            "else the last number, compared as strings), the one behind the paper's "
                                            "pass@1 of 18%."),
}


# IMDB: reward, KL and diversity of 15-token answers to the paper's batch of 256 held-out openings (the built-in
# eval openings are fewer, 110); GSM8K: pass@k of 256-token answers to all 1,319 test questions, whose
# one-shot prompt needs the longer budget
register_task("imdb", _make_imdb, datasets=("auto", "hub", "builtin"), check=_check_imdb, prompt_tokens=64,
              evaluation=Evaluation(REWARD_METRICS, answer_tokens=15, limit=256, reward="vader",
                                    scored_as={"vader-scaled": "vader", "vader-gain": "vader"}))
register_task("gsm8k", _make_gsm8k, datasets=("auto", "hub", "local", "generated"), rewards=("correctness",),
              check=_check_gsm8k, prompt_tokens=384,
              evaluation=Evaluation(PASS_AT_K, answer_tokens=256, make=_make_gsm8k_eval,
                                    check=lambda cfg: _check_gsm8k(cfg, ("test",)), note=_gsm8k_note,
                                    protocols=GSM8K_PROTOCOLS))
