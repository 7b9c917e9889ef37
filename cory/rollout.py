"""From prompts to scored answers: tokenising prompts, sampling answers of the drawn length, decoding and
cleaning them, and the task reward."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch

from cory.config import PPOArgs
from cory.errors import RunError
from cory.tasks.base import Example, Task, check_examples

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from cory.agent import Agent

Scorer = Callable[[Sequence[Example], list[str]], Sequence[float]]  # a task's score(examples, responses)


@dataclass
class Answers:
    texts: list[str]           # decoded and cleaned: what the reward sees
    ids: list[torch.Tensor]    # the tokens PPO trains on (cut to match the cleaned text)


@lru_cache(maxsize=8)
def stop_at(tokenizer: PreTrainedTokenizerBase, stop: str | None) -> dict:
    """generate()'s arguments that end an answer where ``stop`` appears (none for None), built once per tokenizer:
    ``generate(stop_strings=...)`` builds its criterion anew at every call, about 3 s for a 49k-token vocabulary
    (transformers' cache of it is keyed by the vocabulary in the order ``get_vocab()`` lists it, which changes from
    call to call)."""
    if not stop:
        return {}
    from transformers import StoppingCriteriaList, StopStringCriteria

    return {"stopping_criteria": StoppingCriteriaList([StopStringCriteria(tokenizer, [stop])])}


def generation_kwargs(cfg: PPOArgs, tokenizer: PreTrainedTokenizerBase, task: Task) -> dict:
    """Sampling as configured (the scripts: the paper's top_k 0, top_p 1 and the authors' repetition penalty);
    the task's stop string ends an answer too."""
    kwargs = dict(do_sample=True, top_k=cfg.top_k, top_p=cfg.top_p, temperature=cfg.temperature,
                  repetition_penalty=cfg.repetition_penalty, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    return {**kwargs, **stop_at(tokenizer, task.stop)}


class Rollout:
    """The task, the tokenizer and the sampling settings, with the stream of response lengths."""

    def __init__(self, cfg: PPOArgs, task: Task, tokenizer: PreTrainedTokenizerBase, length_rng: np.random.Generator,
                 context: int | None = None):
        self.cfg, self.task, self.tokenizer, self.length_rng = cfg, task, tokenizer, length_rng
        self.context = context  # the model's positions, when known: a prompt and its answer must fit them
        self.gen_kwargs = generation_kwargs(cfg, tokenizer, task)

    def prompts(self, examples: Sequence[Example], texts: list[str] | None = None) -> list[torch.Tensor]:
        """Prompt tensors of ``texts`` (the observer's prompts), by default the pioneer's prompt of each example;
        a RunError (one line, naming the task) for a prompt that is not a string or would not fit the model."""
        if texts is not None:
            wrong = [t for t in texts if not isinstance(t, str)]
            if len(texts) != len(examples) or wrong:
                got = f"a {type(wrong[0]).__name__} ({str(wrong[0])[:40]!r})" if wrong else f"{len(texts)} prompts"
                raise RunError(f"task {self.cfg.task}: observer_prompt() returned {got}; it must return the "
                               "observer's prompt as a string, one per example")
        else:  # the pioneer's prompts: the task's examples, checked where they enter
            check_examples(examples, task=self.cfg.task, what=f"sample({self.cfg.batch_size})",
                           vocab_size=len(self.tokenizer))
        prompts = tokenize_prompts(self.tokenizer, examples, texts)
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]), default=None)
        if (self.context is not None and longest is not None
                and len(prompts[longest]) + self.cfg.response_length_max > self.context):
            raise RunError(f"task {self.cfg.task}: a prompt of {len(prompts[longest])} tokens "
                           f"({examples[longest].query[:40]!r}...) with answers of up to {self.cfg.response_length_max} "
                           f"tokens does not fit {self.cfg.model_name}'s context of {self.context} tokens; shorten "
                           "the task's prompts or lower response_length_max")
        return prompts

    def response_length(self) -> int:
        return int(self.length_rng.integers(self.cfg.response_length_min, self.cfg.response_length_max + 1))

    def answer(self, agent: Agent, prompts: list[torch.Tensor]) -> Answers:
        """``agent``'s sampled answers, one drawn length for the batch (the paper's LengthSampler); unless
        ``allow_early_eos``, EOS is masked until that length, so every answer has it."""
        length = self.response_length()
        kwargs = dict(self.gen_kwargs, max_new_tokens=length)
        if not self.cfg.allow_early_eos:
            kwargs["min_new_tokens"] = length
        texts, ids = decode_and_clean(self.task, self.tokenizer, agent.generate(prompts, **kwargs))
        return Answers(texts, ids)

    def score(self, examples: Sequence[Example], texts: list[str]) -> list[float]:
        """The task reward of each answer, on the example's query and the answer (never the observer prompt)."""
        return score_batch(self.task, examples, texts, self.cfg.reward_model)


def tokenize_prompts(tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example],
                     texts: list[str] | None = None) -> list[torch.Tensor]:
    """Prompt tensors; an example's own ``prompt_ids`` win when the pioneer reads ``example.prompt``."""
    out = []
    for i, ex in enumerate(examples):
        if texts is None and ex.prompt_ids is not None:
            out.append(torch.tensor(ex.prompt_ids, dtype=torch.long))
        else:
            text = ex.prompt if texts is None else texts[i]
            out.append(torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"] or
                                    [tokenizer.eos_token_id], dtype=torch.long))
    return out


def trim_to_text(ids: torch.Tensor, tokenizer: PreTrainedTokenizerBase, kept: str) -> torch.Tensor:
    """The longest prefix of ``ids`` whose text the task keeps (at least one token for trl)."""
    kept = kept.rstrip()
    n = len(ids)
    while n > 1 and not kept.startswith(tokenizer.decode(ids[:n], skip_special_tokens=True).rstrip()):
        n -= 1
    return ids[:n]


def decode_and_clean(task: Task, tokenizer: PreTrainedTokenizerBase,
                     responses: list[torch.Tensor]) -> tuple[list[str], list[torch.Tensor]]:
    """(texts the reward sees, tokens PPO trains on): the task may cut a response (GSM8K: at a new
    "Question:"), and the tokens are cut to match."""
    texts, kept_ids = [], []
    for ids in responses:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        clean = task.clean_response(text)
        if clean != text:
            ids = trim_to_text(ids, tokenizer, clean)
        texts.append(clean)
        kept_ids.append(ids)
    return texts, kept_ids


def checked_scores(task: Task, examples: Sequence[Example], responses: list[str], reward_name: str,
                   score: Scorer | None = None) -> list[float]:
    """``score_batch``, and every score finite (for an evaluation: there is no batch to skip), else a RunError
    naming the reward and the text."""
    scores = score_batch(task, examples, responses, reward_name, score)
    bad = [i for i, x in enumerate(scores) if not math.isfinite(x)]
    if bad:
        raise RunError(f"reward {reward_name} returned a non-finite score ({scores[bad[0]]}) on text {bad[0]} "
                       f"({responses[bad[0]][:60]!r}); it must return a finite number for every answer")
    return scores


def score_batch(task: Task, examples: Sequence[Example], responses: list[str], reward_name: str,
                score: Scorer | None = None) -> list[float]:
    """The task's scores (or ``score(examples, responses)``'s), or a RunError naming the reward (the config's
    ``reward_model``) and the text it failed on, or the count it got wrong."""
    name = reward_name
    score = score or task.score
    try:
        returned = score(examples, responses)
        # a dict's keys, a string's characters would pass for scores
        wrong = isinstance(returned, (dict, str, bytes, set, frozenset)) or not hasattr(returned, "__iter__")
        scores = [] if wrong else [float(x) for x in returned]
    except Exception as e:  # a reward model's failure must say what it was scoring
        index = getattr(e, "index", None)
        if index is None:
            index = _first_failing_text(score, examples, responses)
        where = f" on text {index} ({responses[index][:60]!r})" if index is not None else ""
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunError(f"reward {name} failed{where}: {type(e).__name__}: {first_line}") from e
    if wrong:
        code = getattr(getattr(score, "__func__", score), "__code__", None)
        at = f" (its score() at {code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        raise RunError(f"reward {name} returned a {type(returned).__name__}, not a list of numbers, one per "
                       f"text{at}")
    if len(scores) != len(responses):
        raise RunError(f"reward {name} returned {len(scores)} scores for {len(responses)} texts")
    return scores


def _first_failing_text(score: Scorer, examples: Sequence[Example], responses: list[str]) -> int | None:
    """The index of the first text the reward fails on alone: the batch failed, so find which text did."""
    for i, (example, response) in enumerate(zip(examples, responses)):
        try:
            [float(x) for x in score([example], [response])]
        except Exception:
            return i
    return None
