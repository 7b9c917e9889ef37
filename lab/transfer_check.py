"""The transfer check: does a base model, as CORY's observer, use the pioneer's answer? No training, minutes on a CPU.

    python -m lab.transfer_check --task arithmetic                       # the embedded SmolLM2, 400 training draws
    python -m lab.transfer_check --task arithmetic --dataset sums_2x1 --n 800 --json results/transfer_check/x.json
    python -m lab.transfer_check --task_file word_count.py --task word_count   # a task in one file, registered there

The paper's mechanism presumes the observer can copy a correct answer (or correct a wrong one); the collective
reward then pays both agents. Here the base model answers ``n`` training questions as the pioneer (sampled as in
training), and then, as the observer, answers each again from the observer's prompt with that answer as its
reference, greedy and sampled. Printed and written: the copy rate P(observer right | pioneer right), the correction
rate P(observer right | pioneer wrong) and the observer's accuracy minus the pioneer's, each with a 95% interval
(Wilson's for the rates, the normal one for the paired difference).

Two controls, the ones conformity studies of multi-agent debate use, read the same way beside it (``controls``):
**no reference**, the same model answering each question alone again (a fresh draw), so that a copy rate is set
against how often the question is answered right anyway; and **an unrelated reference**, the pioneer's answer to
the next question drawn, so that a copy rate is set against writing down whatever it is shown. For the second, the
echo rate too: P(the observer's answer is right for the question the shown answer belongs to | that answer was
right there). The task's reward must be 0/1 (``Task.zero_one_reward``; a score that is neither stops the check in one
line); the answers and the reference are read as the task's reward reads them (``clean_response``). A user mistake
prints one line and exits with status 2 before any model is loaded.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import torch
from tqdm.auto import tqdm

from cory.assets import SMOLLM2_SPEC, locate
from cory.errors import AssetError, ConfigError, RunError
from lab.errors import EvalError, OneLineParser, exit_on_error
from lab.evaluation_plan import FLAG_OF_FIELD as EVALUATE_FLAGS, as_flags
from cory.heldout import BATCH_SIZE, answers_and_rewards, unrelated_control
from lab.figures import write_atomically
from lab.runs import git_state
from cory.metrics import copy_hits, echo_hits
from cory.models import load_causal_lm, load_tokenizer
from cory.run.outputs import json_safe
from cory.run.run_rules import check_output_json
from cory.rollout import stop_at
from cory.tasks import check_config, check_examples, load_task_file, make_task, registered, task_spec
from cory.tasks.base import zero_one_broken, zero_one_reward

PROGRAM = "lab.transfer_check"
# the config fields a task's check names, as this command's flags (it has lab.evaluate's, but no --reward)
FLAG_OF_FIELD = {k: v for k, v in EVALUATE_FLAGS.items() if k != "reward_model"}
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
    """Copy rate, correction rate and the paired accuracy gap of 0/1 rewards, each with its count and 95% interval;
    the copy rate is the held-out evaluation's (``cory.metrics.copy_hits``), None where it writes NaN."""
    right = [(p > 0.5, o > 0.5) for p, o in zip(pioneer, observer)]
    copied = copy_hits(pioneer, observer)
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


def echo(shown_right: Sequence[float], right_for_shown: Sequence[float]) -> dict:
    """How often the observer writes down a right answer it was shown for another question: P(its answer is right
    for that question | the shown answer was right there), with its count and 95% interval: the held-out
    evaluation's ``transfer/echo_rate`` (``cory.metrics.echo_hits``), None where it writes NaN."""
    hits = echo_hits(shown_right, right_for_shown)
    return {"echo_rate": sum(hits) / len(hits) if hits else None, "echo_n": len(hits),
            "echo_ci95": wilson(sum(hits), len(hits))}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(EvalError, prog=f"python -m {PROGRAM}", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="a registered task with a 0/1 reward (arithmetic, gsm8k, or one "
                                                 "that --task_file registers)")
    p.add_argument("--task_file", metavar="FILE", help="a one-file task (docs/adding_a_task.md) to load first, as "
                                                       "lab.evaluate and lab.experiments take it")
    p.add_argument("--dataset", default="auto", help="the task's data setting (default: auto)")
    p.add_argument("--dataset_path", default=None, help="local data folder, for tasks that read one (gsm8k)")
    p.add_argument("--model", default=SMOLLM2_SPEC, help=f"the base model (default: {SMOLLM2_SPEC})")
    p.add_argument("--n", type=int, default=400, help="training questions drawn (default 400, at least 2: the "
                   "unrelated-reference control shows each question another one's answer)")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed: questions and sampling (default 0)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="answer length (default: the task's evaluation)")
    p.add_argument("--batch_size", type=int, default=BATCH_SIZE, help=f"sequences per call (default {BATCH_SIZE})")
    p.add_argument("--json", default=None, help="write the result here (a new file, or one this command wrote)")
    p.add_argument("--force", action="store_true", help="replace a --json file this command did not write")
    return p


def plan(argv: Sequence[str]) -> SimpleNamespace:
    """The checked arguments, before any model is loaded; EvalError or ConfigError (one line) otherwise."""
    args = build_parser().parse_args(list(argv))
    if args.task_file is not None:
        load_task_file(args.task_file)  # the plug-in protocol of lab.evaluate: its register_task calls take effect
    if args.task not in registered():
        raise EvalError(f"--task {args.task}: not a registered task; choose one of {', '.join(registered())}")
    spec = task_spec(args.task)
    for name, minimum in (("n", 2), ("batch_size", 1), ("max_new_tokens", 1), ("seed", 0)):
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise EvalError(f"--{name} {value}: must be an integer of at least {minimum}")
    args.max_new_tokens = args.max_new_tokens or spec.evaluation.answer_tokens
    args.reward = spec.evaluation.reward or (spec.rewards[0] if len(spec.rewards) == 1 else None)
    if args.reward is None:
        raise EvalError(f"--task {args.task}: declares no single reward to score with ({', '.join(spec.rewards)})")
    if args.json:
        check_output_json(args.json, "--json", f"python -m {PROGRAM}", args.force)  # its "command" field
    args.config = SimpleNamespace(task=args.task, dataset=args.dataset, dataset_path=args.dataset_path,
                                  reward_model=args.reward, seed=args.seed)
    try:  # the task's settings (its data, its own check), before the task or any model is built
        check_config(args.config)
    except ConfigError as e:
        raise as_flags(e, FLAG_OF_FIELD) from None
    return args


def check_context(task, tokenizer, examples, context: int | None, args) -> None:
    """Every question with its answer fits the model's context, checked before the model loads (as lab.evaluate and
    training check it: ``Task.check_fits``); the observer's prompt holds the pioneer's answer too."""
    if context is None or not hasattr(task, "check_fits"):
        return
    task.check_fits(tokenizer, context, args.max_new_tokens, examples=examples, model=args.model,
                    limit="--max_new_tokens")
    task.check_fits(tokenizer, context, 2 * args.max_new_tokens, examples=examples, model=args.model,
                    limit="--max_new_tokens (the observer's prompt holds the pioneer's answer too: twice its tokens)",
                    prompt=lambda ex: task.observer_prompt(ex, ""))


def _answers(model, tokenizer, task, examples, texts, args, greedy: bool, label: str,
             draw: int = 0) -> tuple[list[str], list[float]]:
    """``model``'s answers to ``examples`` from ``texts`` (None: the pioneer's prompts) and their task rewards;
    ``draw``: another seed's sampling (a second answer alone is a fresh draw, not the pioneer's answer again)."""
    torch.manual_seed(args.seed + draw)
    with tqdm(total=len(examples), desc=label, unit="prompt", leave=False, file=sys.stderr) as bar:
        answers, rewards = answers_and_rewards(model, tokenizer, task, examples, texts,
                                               max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                               reward_name=args.reward, extra=stop_at(tokenizer, task.stop),
                                               greedy=greedy, on_batch=bar.update)
    return answers, zero_one(task, rewards)


def zero_one(task, rewards: list[float]) -> list[float]:
    """``rewards``, each 0 or 1 as the task declares (``Task.zero_one_reward``); else a ConfigError of one line
    naming the first that is not: the rates read right and wrong, and a 0.3 would be read as wrong without a word."""
    broken = zero_one_broken(task, rewards)
    if broken is not None:
        raise ConfigError(broken)
    return rewards


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
    check_context(task, tokenizer, examples, spec.context, args)
    model = load_causal_lm(spec, dtype=torch.float32, field="--model").eval()
    pioneer_answers, pioneer = _answers(model, tokenizer, task, examples, None, args, greedy=False,
                                        label="pioneer (sampled)")
    observer_prompts = [task.observer_prompt(ex, a) for ex, a in zip(examples, pioneer_answers)]
    modes = ("greedy", "sampled")
    readings = {mode: rates(pioneer, _answers(model, tokenizer, task, examples, observer_prompts, args,
                                              greedy=mode == "greedy", label=f"observer ({mode})")[1])
                for mode in modes}
    alone = {mode: rates(pioneer, _answers(model, tokenizer, task, examples, None, args, greedy=mode == "greedy",
                                           label=f"alone ({mode})", draw=1)[1])
             for mode in modes}
    unrelated = {}
    for mode in modes:
        answer = partial(_answers, model, tokenizer, task, examples, args=args, greedy=mode == "greedy",
                         label=f"unrelated reference ({mode})")
        control = unrelated_control(task, examples, pioneer_answers, pioneer, answer, args.reward)
        unrelated[mode] = {**rates(pioneer, control.own),
                           **echo(control.shown_right, zero_one(task, control.right_for_shown))}
    multi_line = sum("\n" in a.strip() for a in pioneer_answers) / len(examples)
    return {"command": args.command, "commit": args.commit, "uncommitted_changes": args.dirty,
            "threads": torch.get_num_threads(),
            "task": args.task, "dataset": args.dataset, "model": args.model,
            "n": len(examples), "seed": args.seed, "max_new_tokens": args.max_new_tokens, "reward": args.reward,
            "pioneer_accuracy": sum(p > 0.5 for p in pioneer) / len(pioneer),
            "pioneer_sampling": "as in training (top_k 0, top_p 1, temperature 1)",
            "references_over_one_line": multi_line,
            "observer": readings,
            "controls": {"no_reference": alone, "unrelated_reference": unrelated},
            "controls_read": "rates conditioned on the pioneer's answer to the same question, as the observer's; "
                             "echo_rate: P(right for the shown answer's question | the shown answer was right)",
            "example_observer_prompt": observer_prompts[0],
            "example_unrelated_prompt": control.prompts[0]}


def _cell(rate, n, ci) -> str:
    return "–" if rate is None else f"{rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] (n {n})"


def table(doc: dict) -> str:
    lines = [f"{doc['task']} ({doc['dataset']}), {doc['model']}: {doc['n']} training questions, seed {doc['seed']}; "
             f"pioneer sampled as in training, accuracy {doc['pioneer_accuracy']:.3f}",
             "observer         copy rate P(right | pioneer right)   correction rate P(right | pioneer wrong)   "
             "observer − pioneer"]
    controls = doc.get("controls", {})
    for mode, r in doc["observer"].items():
        for label, reading in (("", r), ("no reference", controls.get("no_reference", {}).get(mode)),
                               ("unrelated ref.", controls.get("unrelated_reference", {}).get(mode))):
            if reading is None:
                continue
            lo, hi = reading["observer_minus_pioneer_ci95"]
            name = mode if not label else f"  {label}"
            echoed = ("" if "echo_rate" not in reading else
                      f"   echo {_cell(reading['echo_rate'], reading['echo_n'], reading['echo_ci95'])}")
            lines.append(f"{name:<16} {_cell(reading['copy_rate'], reading['copy_n'], reading['copy_ci95']):<37} "
                         f"{_cell(reading['correction_rate'], reading['correction_n'], reading['correction_ci95']):<42} "
                         f"{reading['observer_minus_pioneer']:+.3f} [{lo:+.3f}, {hi:+.3f}]{echoed}")
    if controls:
        lines.append("controls (each observer mode): no reference = the same model alone, a fresh draw; unrelated "
                     "ref. = shown the pioneer's answer to another question; their rates are conditioned on the "
                     "pioneer's answer to the same question; echo = P(right for the shown answer's question | it "
                     "was right there)")
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
