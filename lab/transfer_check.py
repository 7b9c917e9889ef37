"""The transfer check: does a base model, as CORY's observer, use the pioneer's answer? No training, minutes on a CPU.

    python -m lab.transfer_check --task arithmetic                       # the embedded SmolLM2, 400 training draws
    python -m lab.transfer_check --task arithmetic --dataset sums_2x1 --n 800 --json results/transfer/x.json

The paper's mechanism presumes the observer can copy a correct answer (or correct a wrong one); the collective
reward then pays both agents. Here the base model answers ``n`` training questions as the pioneer (sampled as in
training), and then, as the observer, answers each again from the observer's prompt with that answer as its
reference, greedy and sampled. Printed and written: the copy rate P(observer right | pioneer right), the correction
rate P(observer right | pioneer wrong) and the observer's accuracy minus the pioneer's, each with a 95% interval
(Wilson's for the rates, the normal one for the paired difference). The task's reward must be 0/1
(``Task.zero_one_reward``); the answers and the reference are read as the task's reward reads them
(``clean_response``). A user mistake prints one line and exits with status 2 before any model is loaded.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import torch
from tqdm.auto import tqdm

from cory.assets import SMOLLM2_SPEC, locate
from cory.errors import AssetError, ConfigError, RunError
from lab.errors import EvalError, OneLineParser, exit_on_error
from cory.heldout import BATCH_SIZE, answers_and_rewards
from lab.figures import write_atomically
from lab.runs import git_state
from cory.models import load_causal_lm, load_tokenizer
from cory.outputs import json_safe
from cory.run_rules import check_output_json
from cory.rollout import stop_at
from cory.tasks import check_examples, make_task, registered, task_spec
from cory.tasks.base import zero_one_reward

PROGRAM = "lab.transfer_check"
Z95 = 1.959963984540054


def wilson(hits: int, n: int) -> tuple[float, float] | None:
    """Wilson's 95% interval of a rate of ``hits`` in ``n`` (None for n = 0): sound near 0 and 1, where the normal
    interval is not."""
    if n == 0:
        return None
    p, z2 = hits / n, Z95 ** 2
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rates(pioneer: Sequence[float], observer: Sequence[float]) -> dict:
    """Copy rate, correction rate and the paired accuracy gap of 0/1 rewards, each with its count and 95% interval."""
    right = [(p > 0.5, o > 0.5) for p, o in zip(pioneer, observer)]
    copied = [o for p, o in right if p]
    corrected = [o for p, o in right if not p]
    gaps = [float(o) - float(p) for p, o in right]
    n = len(gaps)
    mean = sum(gaps) / n
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (n - 1)) if n > 1 else 0.0
    return {
        "copy_rate": sum(copied) / len(copied) if copied else None, "copy_n": len(copied),
        "copy_ci95": wilson(sum(copied), len(copied)),
        "correction_rate": sum(corrected) / len(corrected) if corrected else None, "correction_n": len(corrected),
        "correction_ci95": wilson(sum(corrected), len(corrected)),
        "observer_accuracy": sum(o for _, o in right) / n,
        "observer_minus_pioneer": mean,
        "observer_minus_pioneer_ci95": (mean - Z95 * sd / math.sqrt(n), mean + Z95 * sd / math.sqrt(n)),
    }


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(EvalError, prog=f"python -m {PROGRAM}", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="a registered task with a 0/1 reward (arithmetic, gsm8k)")
    p.add_argument("--dataset", default="auto", help="the task's data setting (default: auto)")
    p.add_argument("--dataset_path", default=None, help="local data folder, for tasks that read one (gsm8k)")
    p.add_argument("--model", default=SMOLLM2_SPEC, help=f"the base model (default: {SMOLLM2_SPEC})")
    p.add_argument("--n", type=int, default=400, help="training questions drawn (default 400, at least 1)")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed: questions and sampling (default 0)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="answer length (default: the task's evaluation)")
    p.add_argument("--batch_size", type=int, default=BATCH_SIZE, help=f"sequences per call (default {BATCH_SIZE})")
    p.add_argument("--json", default=None, help="write the result here (a new file, or one this command wrote)")
    p.add_argument("--force", action="store_true", help="replace a --json file this command did not write")
    return p


def plan(argv: Sequence[str]) -> SimpleNamespace:
    """The checked arguments, before any model is loaded; EvalError or ConfigError (one line) otherwise."""
    args = build_parser().parse_args(list(argv))
    if args.task not in registered():
        raise EvalError(f"--task {args.task}: not a registered task; choose one of {', '.join(registered())}")
    spec = task_spec(args.task)
    for name, minimum in (("n", 1), ("batch_size", 1), ("max_new_tokens", 1), ("seed", 0)):
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise EvalError(f"--{name} {value}: must be an integer of at least {minimum}")
    args.max_new_tokens = args.max_new_tokens or spec.evaluation.answer_tokens
    args.reward = spec.evaluation.reward or (spec.rewards[0] if len(spec.rewards) == 1 else None)
    if args.reward is None:
        raise EvalError(f"--task {args.task}: declares no single reward to score with ({', '.join(spec.rewards)})")
    if args.json:
        check_output_json(args.json, "--json", PROGRAM, args.force)
    args.config = SimpleNamespace(task=args.task, dataset=args.dataset, dataset_path=args.dataset_path,
                                  reward_model=args.reward, seed=args.seed)
    return args


def _answers(model, tokenizer, task, examples, texts, args, greedy: bool, label: str) -> tuple[list[str], list[float]]:
    """``model``'s answers to ``examples`` from ``texts`` (None: the pioneer's prompts) and their task rewards."""
    torch.manual_seed(args.seed)
    with tqdm(total=len(examples), desc=label, unit="prompt", leave=False, file=sys.stderr) as bar:
        return answers_and_rewards(model, tokenizer, task, examples, texts, max_new_tokens=args.max_new_tokens,
                                   batch_size=args.batch_size, reward_name=args.reward,
                                   extra=stop_at(tokenizer, task.stop), greedy=greedy, on_batch=bar.update)


def run(args) -> dict:
    spec = locate(args.model)
    tokenizer = load_tokenizer(spec, field="--model")
    task = make_task(args.config, tokenizer)
    if not zero_one_reward(task):
        raise EvalError(f"--task {args.task}: its reward is not 0/1 (Task.zero_one_reward), so there is no copy or "
                        "correction rate to read; a subjective task's transfer is the observer's reward minus the "
                        "pioneer's in a CORY run's metrics")
    examples = check_examples(task.sample(args.n), task=args.task, what=f"sample({args.n})",
                              vocab_size=len(tokenizer))
    model = load_causal_lm(spec, dtype=torch.float32, field="--model").eval()
    pioneer_answers, pioneer = _answers(model, tokenizer, task, examples, None, args, greedy=False,
                                        label="pioneer (sampled)")
    observer_prompts = [task.observer_prompt(ex, a) for ex, a in zip(examples, pioneer_answers)]
    readings = {mode: rates(pioneer, _answers(model, tokenizer, task, examples, observer_prompts, args,
                                              greedy=mode == "greedy", label=f"observer ({mode})")[1])
                for mode in ("greedy", "sampled")}
    multi_line = sum("\n" in a.strip() for a in pioneer_answers) / len(examples)
    return {"command": args.command, "commit": args.commit, "uncommitted_changes": args.dirty,
            "threads": torch.get_num_threads(),
            "task": args.task, "dataset": args.dataset, "model": args.model,
            "n": len(examples), "seed": args.seed, "max_new_tokens": args.max_new_tokens, "reward": args.reward,
            "pioneer_accuracy": sum(p > 0.5 for p in pioneer) / len(pioneer),
            "pioneer_sampling": "as in training (top_k 0, top_p 1, temperature 1)",
            "references_over_one_line": multi_line,
            "observer": readings,
            "example_observer_prompt": observer_prompts[0]}


def _cell(rate, n, ci) -> str:
    return "–" if rate is None else f"{rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] (n {n})"


def table(doc: dict) -> str:
    lines = [f"{doc['task']} ({doc['dataset']}), {doc['model']}: {doc['n']} training questions, seed {doc['seed']}; "
             f"pioneer sampled as in training, accuracy {doc['pioneer_accuracy']:.3f}",
             "observer   copy rate P(right | pioneer right)   correction rate P(right | pioneer wrong)   "
             "observer − pioneer"]
    for mode, r in doc["observer"].items():
        lo, hi = r["observer_minus_pioneer_ci95"]
        lines.append(f"{mode:<10} {_cell(r['copy_rate'], r['copy_n'], r['copy_ci95']):<37} "
                     f"{_cell(r['correction_rate'], r['correction_n'], r['correction_ci95']):<42} "
                     f"{r['observer_minus_pioneer']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    with exit_on_error((EvalError, ConfigError, AssetError), failures=(RunError,),
                       files=lambda: args.json if args is not None and args.json else ".",
                       interrupted="nothing written"):
        args = plan(argv)
        args.command = shlex.join(["python", "-m", PROGRAM, *argv])
        args.commit, args.dirty = git_state()  # the code that runs: read before the minutes it takes
        doc = run(args)
        print(table(doc))
        if args.json:
            write_atomically(Path(args.json), _dumps(doc))
            print(f"written: {args.json}")
        return doc


def _dumps(doc: dict) -> str:
    import json

    return json.dumps(json_safe(doc), indent=1) + "\n"


if __name__ == "__main__":
    main()
