"""Score trained models on held-out prompts, from the query alone (how either CORY model is used
after training), next to the base model they started from.

    python -m lab.evaluate --task imdb  --model runs/imdb_cory_cpu            # every model in final/
    python -m lab.evaluate --task imdb  --model runs/a/final/llm1 --model runs/b/final/policy
    python -m lab.evaluate --task gsm8k --model runs/gsm8k_cory_cpu --dataset_path ../gsm8k --k 1,4 --n 4
    python -m lab.evaluate --task_file kind_words.py --task kind_words --model runs/kind_cory

What a row holds is the task's choice (``cory.tasks.Evaluation``, given to ``register_task``):
reward tasks (IMDB): mean task reward, KL(pi || pi0) to the reference (full vocabulary, summed over the
response tokens, mean over prompts), distinct-1/2 of the answers and their mean length in tokens;
pass@k tasks (GSM8K): unbiased pass@k from ``n`` samples per test question, mean accuracy, and the share of
answers that ran to the token limit (the paper's sign of collapse).

A user mistake prints one line and exits with status 2 before any model is loaded (the checks:
``lab.evaluation_plan``).
"""
from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from cory.assets import is_valid_model_spec, locate, model_spec
from cory.errors import AssetError, ConfigError, RunError
from cory.run.final import RECORD, final_weights_id
from cory.heldout import evaluate_reward, own_final_settings, sample
from cory.models import load_causal_lm, load_tokenizer
from cory.run.outputs import OWN_FINAL_EVALUATION, in_use, json_safe
from cory.rollout import checked_scores, decode_and_clean, stop_at, tokenize_prompts
from cory.run.targets import write_whole
from cory.tasks import (REWARD_METRICS, TRAINING_PROTOCOL, SamplingProtocol, check_examples, make_eval_task,
                        task_spec)
from lab.errors import EvalError, exit_on_error
from lab.evaluation_plan import ModelEntry, Plan, plan
from lab.passk import mean_pass_at_k


def load_model(spec: str, dtype: str = "float32", flag: str = "--model"):
    """A plain causal LM (no value head) for any model spec, on the GPU when there is one; a problem names ``flag``."""
    model = load_causal_lm(locate(spec), dtype=getattr(torch, dtype), field=flag)
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def _progress(total: int, label: str):
    return tqdm(total=total, desc=label, unit="prompt", dynamic_ncols=True, leave=False, file=sys.stderr)


def _same_vocabulary(tok_a, tok_b) -> bool:
    return len(tok_a) == len(tok_b) and tok_a.get_vocab() == tok_b.get_vocab()


def evaluate_pass_at_k(model, tokenizer, task, examples, *, n: int, ks: Sequence[int], max_new_tokens: int,
                       batch_size: int, seed: int, reward_name: str, label: str = "",
                       protocol: SamplingProtocol = TRAINING_PROTOCOL) -> dict:
    """pass@k (unbiased, from ``n`` samples per question, of a 0/1 reward), accuracy, and the share of answers
    cut by the token limit, for ``model`` answering ``examples`` from the pioneer's prompt alone, sampled and read
    by ``protocol``."""
    torch.manual_seed(seed)
    if protocol.stop_early:
        stop = stop_at(tokenizer, task.stop)
    else:
        stop = {"min_new_tokens": max_new_tokens}  # every answer runs to the limit
    per_call = max(1, batch_size // n)  # whole questions per step; a question's n samples stay together
    correct, lengths, at_limit, samples = [], [], 0, []
    with _progress(len(examples), label) as bar:  # closed on an error too (its one line stays clean)
        for start in range(0, len(examples), per_call):
            chunk = examples[start:start + per_call]
            texts = None if protocol.prompt is None else [protocol.prompt(ex) for ex in chunk]
            prompts = [ids.tolist() for ids in tokenize_prompts(tokenizer, chunk, texts)]
            if n <= batch_size:  # each prompt read once, its n answers sampled from the shared prompt cache
                raw = sample(model, tokenizer, prompts, max_new_tokens, stop, repeats=n, sampling=protocol.sampling)
            else:
                flat = [p for p in prompts for _ in range(n)]
                raw = []
                for i in range(0, len(flat), batch_size):
                    raw += sample(model, tokenizer, flat[i:i + batch_size], max_new_tokens, stop,
                                  sampling=protocol.sampling)
            repeated = [ex for ex in chunk for _ in range(n)]
            if protocol.score is not None:  # the protocol reads the whole answer, uncut
                answers, kept = [tokenizer.decode(r, skip_special_tokens=True) for r in raw], raw
                scores = checked_scores(task, repeated, answers, reward_name, protocol.score)
            else:
                # the trainer's own cleaning (GSM8K: cut at a model-started "Question:"), keeping the matching tokens
                answers, kept = decode_and_clean(task, tokenizer, [torch.tensor(r, dtype=torch.long) for r in raw])
                scores = checked_scores(task, repeated, answers, reward_name)
            for j, ex in enumerate(chunk):
                correct.append(int(sum(scores[j * n:(j + 1) * n])))
                if len(samples) < 3:
                    samples.append({"question": ex.query, "reference": ex.reference, "response": answers[j * n],
                                    "correct": scores[j * n]})
            for r, ids in zip(raw, kept):
                lengths.append(len(ids))
                ran_out = len(r) >= max_new_tokens and tokenizer.eos_token_id not in r
                at_limit += int(ran_out and len(ids) == len(r))  # ended neither by EOS nor by a new "Question:"
            bar.update(len(chunk))
    result = {f"pass@{k}": v for k, v in mean_pass_at_k(correct, n, ks).items()}
    total = len(examples) * n
    result.update(accuracy=sum(correct) / total, hit_limit=at_limit / total,
                  response_length=float(sum(lengths) / len(lengths)), n_questions=len(examples), n_samples=n,
                  samples=samples)
    return result


def _table(columns: list[tuple[str, str, str]], rows: list[tuple[str, dict]]) -> str:
    """columns: (header, key, format)."""
    width = max([len("model")] + [len(label) for label, _ in rows])
    head = f"{'model':<{width}}  " + "  ".join(f"{h:>10}" for h, _, _ in columns)
    lines = [head, "-" * len(head)]
    for label, res in rows:
        cells = []
        for _, key, fmt in columns:
            v = res.get(key)
            cells.append(f"{format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else 'n/a':>10}")
        lines.append(f"{label:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def protocol_line(name: str, protocol: SamplingProtocol, max_new_tokens: int) -> str:
    """The sampling and reading of an evaluation, in words, for the printed table."""
    s = protocol.sampling
    return (f"{name} (top_k {s['top_k']}, top_p {s['top_p']}, temperature {s['temperature']}, repetition penalty "
            f"{s['repetition_penalty']}, {max_new_tokens} new tokens, {protocol.reading})")


def _task(make):
    try:
        return make()
    except (FileNotFoundError, ValueError) as e:  # a data file that is not GSM8K, a bad reward folder
        text = str(e).strip()
        raise EvalError(text.splitlines()[0] if text else type(e).__name__) from None


def own_final_evaluation(p: Plan, entry: ModelEntry) -> dict | None:
    """The result the run itself took of this final model after its last iteration (``RUN/final_evaluation.json``,
    written by training), when it scored these very weights (cory.run.final's id) with the settings this evaluation
    has: the numbers and samples a second reading would give, read instead of sampled again. Else None."""
    if entry.run_dir is None or p.protocol != "training":
        return None
    try:
        doc = json.loads((entry.run_dir / OWN_FINAL_EVALUATION).read_text())
    except (OSError, ValueError):
        return None
    settings = own_final_settings(reference=p.reference, dataset=p.dataset, dataset_path=p.dataset_path,
                                  reward=p.reward, limit=p.limit, max_new_tokens=p.max_new_tokens,
                                  batch_size=p.batch_size, seed=p.seed, allow_early_eos=p.allow_early_eos,
                                  greedy=task_spec(p.task).evaluation.greedy, dtype=p.dtype)
    if (not isinstance(doc, dict) or doc.get("settings") != settings or doc.get(RECORD) is None
            or doc.get(RECORD) != final_weights_id(entry.run_dir) or Path(entry.spec).parent.name != "final"):
        return None
    result = (doc.get("results") or {}).get(Path(entry.spec).name)
    if not isinstance(result, dict):
        return None
    return {**result, "read_from": f"{OWN_FINAL_EVALUATION}: the run's own evaluation after its iteration "
                                   f"{doc.get('iterations')}, with these settings and weights"}


def run(p: Plan) -> dict:
    """Evaluate every row of the plan; returns the JSON document (also written to ``p.json_path``)."""
    tokenizer = (load_tokenizer(locate(p.reference), "--reference") if p.reference is not None
                 else load_tokenizer(locate(p.rows[0].spec), "--model"))
    # the reward and the prompts first: a missing reward model fails before any LM is loaded
    task = _task(lambda: make_eval_task(p.task_config(), tokenizer))
    examples = check_examples(task.eval_examples(p.limit), task=p.task, what=f"eval_examples({p.limit})",
                              vocab_size=len(tokenizer))
    settings = _settings(p, task.source, len(examples))
    if p.metrics == REWARD_METRICS:
        results, columns = _reward_rows(p, task, tokenizer, examples)
    else:
        protocol = task_spec(p.task).evaluation.protocols[p.protocol]
        settings["sampling"] = dict(protocol.sampling, stop_early=protocol.stop_early)
        results, columns = _pass_at_k_rows(p, task, examples, protocol)
        print(f"protocol: {protocol_line(p.protocol, protocol, p.max_new_tokens)}")
    doc = {"task": p.task, "command": p.command, "settings": settings, "results": results}
    if p.final_weights is not None:
        doc[RECORD] = p.final_weights
    print(_table(columns, [(r["name"], r) for r in results]))
    for e in p.rows:
        if e.repeat > 1:  # the same model given twice: its rows are told apart by #n
            print(f"note: {e.label} is {e.label.rsplit('#', 1)[0]} given again (the same model, {e.spec}; "
                  f"row {e.repeat} of it)")
    note = task_spec(p.task).evaluation.note
    if note is not None and note(task):
        print(f"note: {note(task)}")
    if p.json_path is not None:
        _check_unchanged(p)
        p.json_path.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all: a full disk leaves the file before, not a cut one; strict JSON: no NaN
        write_whole(p.json_path, json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n", "--json")
        print(f"results: {p.json_path}")
    return doc


def _settings(p: Plan, source: str, n_examples: int) -> dict:
    """What the JSON records of the plan: its settings for this kind of task, with where the examples came from
    and how many there are."""
    reward_metrics = p.metrics == REWARD_METRICS
    other_kind = ("n", "ks", "protocol") if reward_metrics else ("allow_early_eos",)
    settings = {k: v for k, v in vars(p).items()
                if k not in ("rows", "json_path", "command", "metrics", "scored_run", "final_weights", *other_kind)}
    if reward_metrics and p.dataset_path is None:
        settings.pop("dataset_path")
    settings.update(dataset=source, **({"n_prompts": n_examples} if reward_metrics else {"n_questions": n_examples}))
    return settings


def _check_reward_rows(p: Plan, task, tokenizer, examples) -> None:
    """Before any model loads: every model shares the reference's tokenizer (KL is read token by token), and no
    prompt is too long for a model (the error names the prompt)."""
    for entry in (e for e in p.rows if e.spec != p.reference):
        if not _same_vocabulary(load_tokenizer(locate(entry.spec), "--model"), tokenizer):
            raise EvalError(f"--model {entry.spec}: its tokenizer differs from the reference "
                            f"{p.reference}'s, so KL cannot be computed token by token")
    for entry in p.rows:
        context = model_spec(entry.spec).context if is_valid_model_spec(entry.spec) else None
        if context is not None and hasattr(task, "check_fits"):
            task.check_fits(tokenizer, context, p.max_new_tokens, examples=examples, model=entry.spec,
                            limit="--max_new_tokens")


REWARD_COLUMNS = [("reward", "task_reward", ".4f"), ("greedy", "greedy_reward", ".4f"),
                  ("parseable", "parseable_share", ".3f"), ("KL", "kl", ".4f"),
                  ("base log-lik", "base_logprob", ".3f"), ("distinct-1", "distinct_1", ".3f"),
                  ("distinct-2", "distinct_2", ".3f"), ("repeat-4", "repeat4_share", ".3f"),
                  ("length", "response_length", ".2f")]


def _reward_rows(p: Plan, task, tokenizer, examples) -> tuple[list[dict], list[tuple]]:
    """A reward task's rows (reward, KL to the reference, diversity) and the table's columns that they fill."""
    _check_reward_rows(p, task, tokenizer, examples)
    owns = [own_final_evaluation(p, entry) for entry in p.rows]
    # the reference loads only for a row sampled here (it scores the KL, or is the row)
    reference = load_model(p.reference, p.dtype, "--reference") if None in owns else None
    results = []
    for entry, own in zip(p.rows, owns):
        if own is not None:  # the run's evaluation after its last iteration: these weights, these settings
            results.append({"name": entry.label, "model": entry.spec, **own})
            continue
        model = reference if entry.spec == p.reference else load_model(entry.spec, p.dtype, "--model")
        res = evaluate_reward(model, reference, tokenizer, task, examples, max_new_tokens=p.max_new_tokens,
                              batch_size=p.batch_size, seed=p.seed, reward_name=p.reward, label=entry.label,
                              allow_early_eos=p.allow_early_eos, greedy=task_spec(p.task).evaluation.greedy)
        results.append({"name": entry.label, "model": entry.spec, **res})
        del model
    return results, [c for c in REWARD_COLUMNS if c[1] in results[0]]


def _pass_at_k_rows(p: Plan, task, examples, protocol: SamplingProtocol) -> tuple[list[dict], list[tuple]]:
    """A pass@k task's rows, each model sampled and read by ``protocol`` with its own tokenizer, and the columns."""
    results = []
    for entry in p.rows:
        flag = "--reference" if entry.spec == p.reference else "--model"
        tokenizer = load_tokenizer(locate(entry.spec), flag)
        context = model_spec(entry.spec).context if is_valid_model_spec(entry.spec) else None
        if context is not None:  # a question too long for the model fails before it loads, naming the question
            task.check_fits(tokenizer, context, p.max_new_tokens, examples=examples, model=entry.spec,
                            limit="--max_new_tokens", prompt=protocol.prompt)
        model = load_model(entry.spec, p.dtype, flag)
        res = evaluate_pass_at_k(model, tokenizer, task, examples, n=p.n, ks=p.ks, max_new_tokens=p.max_new_tokens,
                                 batch_size=p.batch_size, seed=p.seed, reward_name=p.reward, label=entry.label,
                                 protocol=protocol)
        results.append({"name": entry.label, "model": entry.spec, **res})
        del model
    columns = [(f"pass@{k}", f"pass@{k}", ".4f") for k in p.ks]
    columns += [("accuracy", "accuracy", ".4f"), ("hit limit", "hit_limit", ".3f"),
                ("length", "response_length", ".1f")]
    return results, columns


def _check_unchanged(p: Plan) -> None:
    """The run's final models are still those the evaluation loaded: a run resumed meanwhile has replaced them,
    and its results must not be written as theirs; one resumed meanwhile and still training will replace them."""
    if p.scored_run is not None and final_weights_id(p.scored_run) != p.final_weights:
        raise RunError(f"{p.scored_run / 'final'} was replaced while it was evaluated (a run resumed there?); "
                       f"nothing written: rerun the evaluation once that run has finished")
    if p.scored_run is not None and in_use(p.scored_run, "--model", "run"):
        raise RunError(f"{p.scored_run} was resumed while it was evaluated and is training: its final models will "
                       "be replaced; nothing written: rerun the evaluation once that run has finished")


def main(argv: Sequence[str] | None = None) -> dict | None:
    args = list(sys.argv[1:] if argv is None else argv)
    p = None
    # RunError: a reward that fails on the answers, or returns a wrong count or a non-finite score; the results
    # are written whole or not at all
    with exit_on_error((EvalError, ConfigError, AssetError), failures=(RunError,),
                       files=lambda: p.json_path if p is not None and p.json_path else ".",
                       interrupted="nothing written"):
        p = plan(args)
        p.command = shlex.join(["python", "-m", "lab.evaluate", *args])
        return run(p)


if __name__ == "__main__":
    main()
