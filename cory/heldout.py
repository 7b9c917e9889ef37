"""Held-out evaluation of a policy: sample its answers to held-out prompts, score them, and measure how far it has
moved from the base model (full-vocabulary KL) and whether it repeats itself.

Used by ``python -m lab.evaluate`` on saved models and by a training run's own periodic evaluation
(``eval_every``); both answer from the pioneer's prompt alone, sampled as in training by default.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from cory.metrics import degeneration, knowledge_transfer, unrelated_reference
# prompts that begin alike (a one-shot example) read that beginning once per batch
from cory.generation import left_pad as _left_pad
from cory.generation import positions as _positions
from cory.generation import with_shared_prefix as _with_shared_prefix
from cory.rollout import checked_scores, stop_at, tokenize_prompts
from cory.tasks.base import TRAINING_SAMPLING, check_examples, right_or_wrong, zero_one_reward

BATCH_SIZE = 32  # sequences per generate() call, unless told otherwise


def sequence_kl(model, reference, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                pad_id: int) -> list[float]:
    """Per sequence: sum over the response tokens of the full-vocabulary KL(model || reference) of
    the next-token distributions given everything before the token (trl's ``kl_penalty="full"``).

    One plain forward pass of each model on the left-padded prompt + response; prompt and padding
    positions are masked out.
    """
    return sequence_kl_and_base_logprob(model, reference, prompts, responses, pad_id)[0]


def sequence_kl_and_base_logprob(model, reference, prompts: Sequence[Sequence[int]],
                                 responses: Sequence[Sequence[int]], pad_id: int,
                                 policy_logprobs: torch.Tensor | None = None) -> tuple[list[float], list[float]]:
    """``sequence_kl``, and per sequence the reference's mean log-likelihood of the response's own tokens (nats per
    token; None-free: an empty response gives 0). Read with distinct-n: token salad and digit strings are diverse
    but unlikely under the base model, fluent repetition is likely but not diverse. ``policy_logprobs``: ``model``'s
    next-token log-probabilities at the response tokens as its sampling computed them (``sample_with_logprobs``),
    so that ``model`` is not read again."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if not prompts:
        return [], []

    def next_token_logprobs(m):
        # logits at position t predict token t+1; the response sits at the right end of every row, so only the
        # last (longest response + 1) positions reach the vocabulary projection, where the model allows
        ids, mask, positions, cache = _with_shared_prefix(m, prompts, responses, pad_id)
        width = ids.shape[1]
        is_response = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        for i, r in enumerate(responses):
            if len(r):
                is_response[i, width - len(r):] = True
        kept = min(width, max(len(r) for r in responses) + 1)
        window = {"logits_to_keep": kept} if _keeps_logits(m) else {}
        logits = m(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   **window).logits[:, -kept:]
        is_response, ids = is_response[:, width - kept:], ids[:, width - kept:]
        return F.log_softmax(logits[:, :-1][is_response[:, 1:]].float(), dim=-1), ids[:, 1:][is_response[:, 1:]]

    with torch.inference_mode():
        logq, tokens = next_token_logprobs(reference)
        # the reference's own weights (the base model before training) read once: their KL is 0 exactly
        logp = ((logq if model is reference else next_token_logprobs(model)[0]) if policy_logprobs is None
                else policy_logprobs)
        per_token = (logp.exp() * (logp - logq.to(logp.device))).sum(-1).cpu()
        base_logprob = logq.gather(-1, tokens[:, None])[:, 0].cpu()
    kls, logprobs, start = [], [], 0
    for r in responses:
        kls.append(float(per_token[start:start + len(r)].sum()))
        logprobs.append(float(base_logprob[start:start + len(r)].mean()) if len(r) else 0.0)
        start += len(r)
    return kls, logprobs


def _keeps_logits(model) -> bool:
    """Whether ``model``'s forward projects only its last positions onto the vocabulary when asked."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _response_ids(row: list[int], eos_id: int | None, pad_id: int | None) -> list[int]:
    """Generated tokens up to and including the first EOS (what trl keeps), without trailing padding."""
    if eos_id is not None and eos_id in row:
        return row[: row.index(eos_id) + 1]
    if pad_id is not None:
        while row and row[-1] == pad_id:
            row = row[:-1]
    return row


def sample(model, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
           extra: dict | None = None, repeats: int = 1, greedy: bool = False,
           sampling: dict | None = None) -> list[list[int]]:
    """One generate() call for the whole batch (left padding; a prefix all prompts share read once), by default
    sampling like training: top_k 0, top_p 1, temperature 1, no repetition penalty, so the answers are draws from
    the policy itself (``sampling`` replaces those four settings). ``repeats``: that many answers per prompt (a
    prompt's answers next to each other); the prompt is read once and its keys and values shared by its answers,
    since reading the prompt is most of the work when answers are short."""
    return _generate(model, tokenizer, prompts, max_new_tokens, extra, repeats, greedy, sampling)[0]


def sample_with_logprobs(model, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         extra: dict | None = None) -> tuple[list[list[int]], torch.Tensor]:
    """``sample``'s draws (the same ones), and the model's next-token log-probabilities (full vocabulary, float) at
    each answer's tokens, row after row, from the logits the sampling drew them from: what a second forward pass
    over prompt + answer would give, up to float rounding, without that pass."""
    responses, logits = _generate(model, tokenizer, prompts, max_new_tokens, extra, keep_logits=True)
    steps = torch.stack(logits, dim=1)  # (rows, steps, vocabulary)
    lengths = torch.tensor([len(r) for r in responses], device=steps.device)
    kept = torch.arange(steps.shape[1], device=steps.device)[None, :] < lengths[:, None]
    return responses, F.log_softmax(steps[kept].float(), dim=-1)


def _generate(model, tokenizer, prompts, max_new_tokens, extra=None, repeats=1, greedy=False, sampling=None,
              keep_logits=False) -> tuple[list[list[int]], tuple | None]:
    """``sample``, and with ``keep_logits`` generate()'s raw logits of every step (else None)."""
    sampling = dict(sampling or TRAINING_SAMPLING)
    kwargs = dict(do_sample=not greedy, repetition_penalty=sampling.pop("repetition_penalty", 1.0),
                  max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id, **(extra or {}))
    if not greedy:
        kwargs.update(sampling)
    if repeats == 1:
        # the prompts' shared prefix (a one-shot example) read once: most of a short answer's cost otherwise
        ids, mask, _, cache = _with_shared_prefix(model, prompts, [[] for _ in prompts], tokenizer.pad_token_id)
        if cache is not None:
            kwargs["past_key_values"] = cache
            # generate() takes the whole rows and reads on from the cache's length
            prefix = torch.tensor(list(prompts[0][:mask.shape[1] - ids.shape[1]]), dtype=ids.dtype, device=ids.device)
            ids = torch.cat([prefix.expand(len(prompts), -1), ids], dim=1)
    else:
        ids, mask = _left_pad(prompts, tokenizer.pad_token_id)
        device = next(model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
    with torch.inference_mode():
        if repeats > 1 and ids.shape[1] > 1:
            # all but the last prompt token once per prompt; generate() reads the last one and goes on
            head, head_mask = ids[:, :-1], mask[:, :-1]
            cache = model(input_ids=head, attention_mask=head_mask, position_ids=_positions(head_mask),
                          use_cache=True).past_key_values
            cache.batch_repeat_interleave(repeats)
            kwargs["past_key_values"] = cache
        if repeats > 1:
            ids, mask = ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)
        if keep_logits:  # the raw logits, before any sampling setting: the policy's own distribution
            kwargs.update(return_dict_in_generate=True, output_logits=True)
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    rows, logits = (out.sequences, out.logits) if keep_logits else (out, None)
    return [_response_ids(row, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for row in rows[:, ids.shape[1]:].tolist()], logits


def evaluate_reward(model, reference, tokenizer, task, examples, *, max_new_tokens: int, batch_size: int,
                    seed: int, reward_name: str, label: str = "", allow_early_eos: bool = False,
                    progress: bool = True, greedy: bool = False) -> dict:
    """Task reward, KL to ``reference``, the base model's log-likelihood of the answers, distinct-1/2, the share of
    answers repeating a token 4+ times in a row and the length of ``model``'s answers to ``examples``, answered from
    the pioneer's prompt alone. ``greedy``: also the reward of greedy answers (``greedy_reward``); a task with a
    ``parseable(answer)`` test also gets the share of sampled answers it holds for (``parseable_share``)."""
    return evaluate_answers(model, reference, tokenizer, task, examples, max_new_tokens=max_new_tokens,
                            batch_size=batch_size, seed=seed, reward_name=reward_name, label=label,
                            allow_early_eos=allow_early_eos, progress=progress, greedy=greedy)[0]


def evaluate_answers(model, reference, tokenizer, task, examples, *, max_new_tokens: int, batch_size: int,
                     seed: int, reward_name: str, label: str = "", allow_early_eos: bool = False,
                     progress: bool = True, greedy: bool = False) -> tuple[dict, list[str], list[float]]:
    """``evaluate_reward``'s result, and every sampled answer (as the reward read it) with its reward."""
    torch.manual_seed(seed)
    texts, tokens, rewards, kls, logprobs, greedy_rewards, all_prompts = [], [], [], [], [], [], []
    # the base model against itself reads both sides the same way: its KL is 0 exactly, not float noise
    from_sampling = model is not reference and not same_weights(model, reference)
    stop = stop_at(tokenizer, task.stop)
    extra = stop if allow_early_eos else {"min_new_tokens": max_new_tokens}
    # closed on an error too, so that the error's one line is not glued to a progress bar
    with tqdm(total=len(examples), desc=label, unit="prompt", dynamic_ncols=True, leave=False, file=sys.stderr,
              disable=not progress) as bar:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start:start + batch_size]
            # the pioneer's prompt (IMDB: the review opening alone, at the tokens the task drew)
            prompts = [ids.tolist() for ids in tokenize_prompts(tokenizer, chunk)]
            # the sampling's own logits give the policy's side of the KL: the reference alone is read again
            if from_sampling:
                responses, policy_logprobs = sample_with_logprobs(model, tokenizer, prompts, max_new_tokens, extra)
            else:
                responses, policy_logprobs = sample(model, tokenizer, prompts, max_new_tokens, extra), None
            answers = [task.clean_response(tokenizer.decode(r, skip_special_tokens=True)) for r in responses]
            rewards += checked_scores(task, chunk, answers, reward_name)
            # equal weights: the reference's reading serves both sides
            chunk_kls, chunk_logprobs = sequence_kl_and_base_logprob(model if from_sampling else reference,
                                                                     reference, prompts, responses,
                                                                     tokenizer.pad_token_id, policy_logprobs)
            del policy_logprobs
            kls += chunk_kls
            logprobs += chunk_logprobs
            all_prompts += prompts
            texts += answers
            tokens += responses
            bar.update(len(chunk))
    if greedy:  # after the sampled answers, so that they draw what they would without this reading
        greedy_rewards = _greedy_rewards(model, tokenizer, task, examples, all_prompts, max_new_tokens, extra,
                                         batch_size, reward_name)
    return {
        "task_reward": float(sum(rewards) / len(rewards)),
        # the spread of one answer's reward: the mean's sampling error is reward_sd / sqrt(n_prompts)
        "reward_sd": float(torch.tensor(rewards, dtype=torch.float64).std()) if len(rewards) > 1 else 0.0,
        "kl": float(sum(kls) / len(kls)),
        "base_logprob": float(sum(logprobs) / len(logprobs)),
        **({"greedy_reward": float(sum(greedy_rewards) / len(greedy_rewards))} if greedy else {}),
        **({"parseable_share": sum(map(task.parseable, texts)) / len(texts)} if hasattr(task, "parseable") else {}),
        **degeneration(texts, tokens),
        "response_length": float(sum(len(r) for r in tokens) / len(tokens)),
        "n_prompts": len(examples),
        "samples": [{"query": ex.query, "response": t, "reward": r}
                    for ex, t, r in list(zip(examples, texts, rewards))[:5]],
    }, texts, rewards


def answers_and_rewards(model, tokenizer, task, examples, texts: Sequence[str] | None = None, *, max_new_tokens: int,
                        batch_size: int, reward_name: str, extra: dict, greedy: bool = False,
                        on_batch=None) -> tuple[list[str], list[float]]:
    """``model``'s answers to ``examples`` as the reward reads them, and their rewards, ``batch_size`` prompts per
    call: from ``texts`` (the observer's prompts), else each example's own prompt. ``on_batch(n)`` after each call
    (a progress bar)."""
    answers: list[str] = []
    rewards: list[float] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        prompts = [ids.tolist() for ids in tokenize_prompts(
            tokenizer, chunk, None if texts is None else list(texts[start:start + batch_size]))]
        batch = [task.clean_response(tokenizer.decode(r, skip_special_tokens=True))
                 for r in sample(model, tokenizer, prompts, max_new_tokens, extra, greedy=greedy)]
        rewards += checked_scores(task, chunk, batch, reward_name)
        answers += batch
        if on_batch is not None:
            on_batch(len(chunk))
    return answers, rewards


def observer_transfer(model, tokenizer, task, examples, pioneer_answers: Sequence[str],
                      pioneer_rewards: Sequence[float], *, max_new_tokens: int, batch_size: int, seed: int,
                      reward_name: str, allow_early_eos: bool = False) -> dict[str, float]:
    """CORY's knowledge transfer on held-out questions (``cory.metrics.knowledge_transfer``): ``model``, as the observer,
    answers each of ``examples`` from the observer's prompt with ``pioneer_answers[i]`` as its reference, sampled as
    in training; its rewards are read against the pioneer's (``pioneer_rewards``) on the same questions."""
    torch.manual_seed(seed)
    extra = stop_at(tokenizer, task.stop) if allow_early_eos else {"min_new_tokens": max_new_tokens}
    control = zero_one_reward(task) and len(examples) >= 2
    with tqdm(total=len(examples) * (1 + control), desc="held-out transfer", unit="prompt", dynamic_ncols=True,
              leave=False, file=sys.stderr) as bar:
        texts = [task.observer_prompt(ex, answer) for ex, answer in zip(examples, pioneer_answers)]
        _, rewards = answers_and_rewards(model, tokenizer, task, examples, texts, max_new_tokens=max_new_tokens,
                                         batch_size=batch_size, reward_name=reward_name, extra=extra,
                                         on_batch=bar.update)
        zero_one = right_or_wrong(task, pioneer_rewards, rewards)  # the task's word, checked on its rewards
        out = knowledge_transfer(list(pioneer_rewards), rewards, zero_one)
        if control and zero_one:
            answer = functools.partial(answers_and_rewards, model, tokenizer, task, examples,
                                       max_new_tokens=max_new_tokens, batch_size=batch_size, reward_name=reward_name,
                                       extra=extra, on_batch=bar.update)
            c = unrelated_control(task, examples, pioneer_answers, pioneer_rewards, answer, reward_name)
            out.update(unrelated_reference(list(pioneer_rewards), c.own, c.shown_right, c.right_for_shown))
    return out


class UnrelatedControl(NamedTuple):
    """The unrelated-reference control's readings (``unrelated_control``), each in the order of the questions."""
    prompts: list[str]  # question i's observer prompt, holding the pioneer's answer to question i + 1
    own: list[float]  # the observer's rewards on its own questions
    shown_right: list[float]  # the shown answers' rewards on the questions they belong to
    right_for_shown: list[float]  # the observer's answers scored on those questions


def unrelated_control(task, examples, pioneer_answers: Sequence[str], pioneer_rewards: Sequence[float],
                      answer: Callable[[list[str]], tuple[list[str], list[float]]],
                      reward_name: str) -> UnrelatedControl:
    """The control for copying (``cory.metrics.UNRELATED_KEYS``), as the held-out evaluation and lab.transfer_check
    read it: each of ``examples`` shown the pioneer's answer to the next one, answered by ``answer(prompts)`` (the
    answers as the reward reads them, and their rewards: ``answers_and_rewards``) and scored on both questions."""
    # the next question's: the pioneer's draws are independent, so the shown answer belongs to another question
    # whatever the pioneer got right, and every question is shown one
    others = list(examples[1:]) + list(examples[:1])
    shown = list(pioneer_answers[1:]) + list(pioneer_answers[:1])
    shown_right = list(pioneer_rewards[1:]) + list(pioneer_rewards[:1])
    prompts = [task.observer_prompt(ex, a) for ex, a in zip(examples, shown)]
    answers, own = answer(prompts)
    return UnrelatedControl(prompts, list(own), shown_right, checked_scores(task, others, answers, reward_name))


# On a CPU a decoding step's matrix products run at about half speed at 32 rows (the vocabulary projection, the
# largest, at 15-18 GFLOP/s against 27-37 at 200-1000 rows, one AVX2 core): greedy answers, which draw nothing, are
# taken for many prompts at once, up to this many tokens of prompt and answer per call
GREEDY_CPU_TOKENS = 16384


def _greedy_rewards(model, tokenizer, task, examples, prompts, max_new_tokens, extra, batch_size, reward_name):
    """The task reward of ``model``'s greedy answers to ``prompts``: on a CPU in calls of up to
    ``GREEDY_CPU_TOKENS`` tokens, else of ``batch_size`` prompts. Each answer is its row's own argmax path
    whatever the batch (up to float rounding: tests/test_evaluate.py)."""
    rows = batch_size
    if next(model.parameters()).device.type == "cpu":
        rows = max(batch_size, GREEDY_CPU_TOKENS // (max(map(len, prompts)) + max_new_tokens))
    rewards = []
    for start in range(0, len(prompts), rows):
        answers = [task.clean_response(tokenizer.decode(r, skip_special_tokens=True)) for r in
                   sample(model, tokenizer, prompts[start:start + rows], max_new_tokens, extra, greedy=True)]
        rewards += checked_scores(task, examples[start:start + rows], answers, reward_name)
    return rewards


class PeriodicEvaluation:
    """A training run's own held-out evaluation (``eval_every``): each agent answers the task's held-out prompts
    from the pioneer's prompt alone, as ``python -m lab.evaluate`` would score its saved model, so a run shows
    when it learned and when it began to collapse, not just where it ended.

    Scored with the task's evaluation reward (a shaped training reward by the reward it shapes, ``scored_as``),
    at the task's evaluation answer length, with a fixed sampling seed; the sampling runs on a forked random
    state, so a run with evaluations trains exactly as one without."""

    SEED = 0

    def __init__(self, cfg, tokenizer, reference):
        from cory.tasks import make_eval_task, task_spec

        evaluation = task_spec(cfg.task).evaluation
        reward = evaluation.scored_reward(cfg.reward_model)
        self.task = make_eval_task(dataclasses.replace(cfg, reward_model=reward), tokenizer)
        self.reward = reward
        self.examples = check_examples(self.task.eval_examples(evaluation.limit), task=cfg.task,
                                       what=f"eval_examples({evaluation.limit})", vocab_size=len(tokenizer))
        self.tokenizer, self.reference = tokenizer, reference
        self.max_new_tokens = evaluation.answer_tokens
        self.allow_early_eos = cfg.allow_early_eos
        self.greedy = evaluation.greedy
        # CORY's agents are also read as observers of each other's held-out answers (``observer_transfer``)
        self.transfer = getattr(cfg, "knowledge_transfer", False) is True
        self.batch_size = BATCH_SIZE  # the batching changes which draws each answer gets: as the evaluation's
        # what ``python -m lab.evaluate --model RUN`` would read the final models with (all but the dtype)
        self.settings = dict(reference=cfg.model_name, dataset=cfg.dataset, dataset_path=cfg.dataset_path,
                             reward=reward, limit=evaluation.limit, max_new_tokens=self.max_new_tokens,
                             batch_size=self.batch_size, seed=self.SEED, allow_early_eos=self.allow_early_eos,
                             greedy=self.greedy)
        self.last: tuple[int, dict] | None = None  # (iterations, agent -> result with its samples): the latest

    def __call__(self, models: dict, iterations: int) -> list[dict]:
        """One row per agent (``{"iterations", "agent", "task_reward", "kl", ...}``) for ``models`` (name ->
        causal LM), after ``iterations`` completed iterations. CORY's rows also hold the agent's knowledge transfer as
        the observer of its partner's held-out answers (``cory.metrics.TRANSFER_KEYS``; iteration 0: the base
        model's)."""
        read: list = []  # (model, result, answers, rewards) of the agents evaluated so far
        reading = {}  # agent -> its entry of ``read``
        for name, model in models.items():
            # CORY's agents before training are both the base model: one reading, as the seed is fixed
            same = next((r for r in read if same_weights(model, r[0])), None)
            if same is None:
                same = (model, *self._in_eval_mode(model, self._evaluate, model))
                read.append(same)
            reading[name] = same
        results = {name: r[1] for name, r in reading.items()}
        if self.transfer and len(models) == 2:
            done: dict = {}  # (observer's reading, pioneer's reading) -> transfer: the base model's is read once
            first, second = models
            for observer, pioneer in ((first, second), (second, first)):
                key = (id(reading[observer]), id(reading[pioneer]))
                if key not in done:
                    done[key] = self._in_eval_mode(models[observer], self._transfer, models[observer],
                                                   reading[pioneer])
                results[observer] = {**results[observer], **done[key]}  # a copy: two agents may share a result
        self.last = (iterations, results)
        return [{"iterations": iterations, "agent": name,
                 **{k: v for k, v in result.items() if k not in ("samples", "dtype")}}
                for name, result in results.items()]

    @staticmethod
    def _in_eval_mode(model, fn, *args):
        """``fn(*args)`` with ``model`` in eval mode and the random state forked: a run with evaluations trains
        exactly as one without."""
        was_training = model.training
        model.eval()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        try:
            with torch.random.fork_rng(devices=devices):
                return fn(*args)
        finally:
            model.train(was_training)

    def _evaluate(self, model) -> tuple[dict, list[str], list[float]]:
        result, answers, rewards = evaluate_answers(
            model, self.reference, self.tokenizer, self.task, self.examples, max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size, seed=self.SEED, reward_name=self.reward, allow_early_eos=self.allow_early_eos,
            label="held-out evaluation", greedy=self.greedy)  # its bar (prompts, ETA) below the run's
        result["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        return result, answers, rewards

    def _transfer(self, observer, pioneer_reading: tuple) -> dict[str, float]:
        _, _, answers, rewards = pioneer_reading
        return observer_transfer(observer, self.tokenizer, self.task, self.examples, answers, rewards,
                                 max_new_tokens=self.max_new_tokens, batch_size=self.batch_size, seed=self.SEED,
                                 reward_name=self.reward, allow_early_eos=self.allow_early_eos)

    def own_final_evaluation(self, iterations: int, final_weights: str | None) -> dict | None:
        """The document ``lab.evaluate`` reads instead of evaluating the final models again
        (``RUN/final_evaluation.json``): this evaluation's latest results when they are of the final models
        (taken after the last of ``iterations``) and ``final_weights`` names those models (cory.run.final), else None.
        The models evaluated in one dtype each; a mixed run is left to the evaluation."""
        if self.last is None or self.last[0] != iterations or final_weights is None:
            return None
        results = {name: dict(r) for name, r in self.last[1].items()}
        dtypes = {r.pop("dtype") for r in results.values()}
        if len(dtypes) != 1:
            return None
        return {"final_weights": final_weights, "iterations": iterations,
                "settings": own_final_settings(**self.settings, dtype=dtypes.pop()), "results": results}


def own_final_settings(*, reference, dataset, dataset_path, reward, limit, max_new_tokens, batch_size, seed,
                       allow_early_eos, greedy, dtype) -> dict:
    """The settings a run's own final evaluation records and ``lab.evaluate`` compares with its own: one list
    of them for both sides, so that a setting added to one is asked of the other."""
    return dict(reference=reference, dataset=dataset, dataset_path=dataset_path, reward=reward, limit=limit,
                max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, allow_early_eos=allow_early_eos,
                greedy=greedy, dtype=dtype)


def same_weights(a, b) -> bool:
    """Whether two models hold equal weights (the same tensors in the same order), so would answer alike."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(
        (pa[k].shape, pa[k].dtype, pa[k].device) == (pb[k].shape, pb[k].dtype, pb[k].device)
        and torch.equal(pa[k], pb[k]) for k in pa)
