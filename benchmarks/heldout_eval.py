"""The held-out evaluation's cost (``cory.heldout``: what a run's ``eval_every`` and ``python -m lab.evaluate``
pay per batch of held-out prompts), two ways, on the same prompts and draws:

    left_padded      every prompt read whole, left-padded (before e3b26ee)
    shared_prefix    the prompts' shared prefix (the one-shot example) read once per batch, at batch 1 (e3b26ee on)
    sampling_logits  shared_prefix, and the KL's policy side from the logits the answers were sampled from, so only
                     the reference reads prompt + answer again

    python benchmarks/heldout_eval.py --model embedded:smollm2-135m --threads 1 \\
        --json benchmarks/data/heldout_eval_cpu.json
    python benchmarks/heldout_eval.py --model tiny --batches 1 --rounds 1          # smoke check

The policy is the model with 2% noise on its weight matrices (a fixed seed), the reference the model itself. One
batch is what the evaluation does with 32 prompts: sample the answers (seed fixed), greedy answers, then the
full-vocabulary KL to the base model and its log-likelihood of the answers. The variants take turns within each
round (the machine is noisy: compare ratios from one run). Reported: the median seconds per batch and per phase,
each variant's ratio to left_padded, whether its sampled and greedy answers equal left_padded's (they must), and the
largest KL difference (float noise only), beside the CPU's flags and the thread count.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from harness import add_json_flags, check_json_flags, git_commit, run_main, save_json
from learned import cpu_flags

PROGRAM = "python benchmarks/heldout_eval.py"
VARIANTS = ("left_padded", "shared_prefix", "sampling_logits")


def parse(argv):
    """The arguments, or ValueError with the one line naming the bad flag (before any model loads)."""
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model", default="embedded:smollm2-135m")
    p.add_argument("--batch_size", default="32")
    p.add_argument("--batches", default="2", help="held-out batches per round")
    p.add_argument("--rounds", default="2")
    p.add_argument("--answer_tokens", default="20")
    p.add_argument("--threads", default="1")
    add_json_flags(p)
    args = p.parse_args(argv)
    for name in ("batch_size", "batches", "rounds", "answer_tokens", "threads"):
        value = getattr(args, name)
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"--{name}: must be a whole number >= 1, got {value!r}")
        setattr(args, name, int(value))
    check_json_flags(args, PROGRAM)
    return args


def main(argv=None) -> int:
    return run_main(parse, measure, argv)


def measure(args, argv) -> int:
    import torch

    from cory.generation import shared_prefix_length

    torch.set_num_threads(args.threads)
    bench = load(args)
    times, answers = take_turns(bench, args.rounds)
    summary = compare(times, answers)
    doc = {"command": " ".join([PROGRAM, *argv]), "commit": git_commit(), "cpu_flags": cpu_flags(),
           "threads": args.threads, "model": args.model, "task": "arithmetic", "batch_size": args.batch_size,
           "batches": len(bench.batches), "rounds": args.rounds, "answer_tokens": args.answer_tokens,
           "prompt_tokens": [min(map(len, bench.batches[0])), max(map(len, bench.batches[0]))],
           "shared_prefix_tokens": shared_prefix_length(bench.batches[0]), "summary": summary}
    print_report(doc)
    if args.json:
        if save_json(args.json, doc):
            return 1
        print(f"written: {args.json}")
    return 0


@dataclass
class Bench:
    """What every variant is timed on: the tokenizer, a policy some way from the base model, the base model as the
    reference, the held-out prompts in batches (token ids), the tokens that end an answer and the answer length;
    and ``cory.generation``'s own shortest shared prefix, which the left_padded variant raises out of reach."""
    tok: Any
    policy: Any
    reference: Any
    batches: list[list[list[int]]]
    extra: Any
    answer_tokens: int
    min_shared_prefix: int


def load(args) -> Bench:
    """The model twice (policy and reference), the policy moved by 2% noise on its weight matrices, and the
    arithmetic task's held-out prompts (its default setting's, as the comparison's runs evaluate them)."""
    import torch

    from cory import generation, models
    from cory.assets import locate, model_spec
    from cory.rollout import stop_at, tokenize_prompts
    from cory.tasks.arithmetic import ArithmeticTask

    spec = locate(model_spec(args.model))
    tok = models.load_tokenizer(spec)
    policy, reference = models.load_causal_lm(spec), models.load_causal_lm(spec)
    # a policy some way from the base model, as a trained one is, so that the KL compared is not zero
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in policy.parameters():
            if w.dim() > 1:
                w.add_(0.02 * w.std() * torch.randn(w.shape, generator=noise))
    task = ArithmeticTask()
    examples = task.eval_examples(args.batch_size * args.batches)
    batches = [[ids.tolist() for ids in tokenize_prompts(tok, examples[i:i + args.batch_size])]
               for i in range(0, len(examples), args.batch_size)]
    return Bench(tok, policy, reference, batches, stop_at(tok, task.stop), args.answer_tokens,
                 generation.MIN_SHARED_PREFIX)


def one_batch(bench: Bench, variant: str, prompts: list[list[int]]):
    """One held-out batch the ``variant``'s way: seconds per phase (sample, greedy, kl), the sampled answers, the
    greedy answers and the KLs. It sets ``generation.MIN_SHARED_PREFIX``; ``take_turns`` restores it."""
    import torch

    from cory import generation, heldout

    generation.MIN_SHARED_PREFIX = 10 ** 9 if variant == "left_padded" else bench.min_shared_prefix
    torch.manual_seed(0)
    t0 = time.perf_counter()
    if variant == "sampling_logits":
        sampled, logprobs = heldout.sample_with_logprobs(bench.policy, bench.tok, prompts, bench.answer_tokens,
                                                         bench.extra)
    else:
        sampled, logprobs = heldout.sample(bench.policy, bench.tok, prompts, bench.answer_tokens, bench.extra), None
    t1 = time.perf_counter()
    greedy = heldout.sample(bench.policy, bench.tok, prompts, bench.answer_tokens, bench.extra, greedy=True)
    t2 = time.perf_counter()
    kls, _ = heldout.sequence_kl_and_base_logprob(bench.policy, bench.reference, prompts, sampled,
                                                  bench.tok.pad_token_id, logprobs)
    t3 = time.perf_counter()
    return {"sample": t1 - t0, "greedy": t2 - t1, "kl": t3 - t2}, sampled, greedy, kls


def take_turns(bench: Bench, rounds: int) -> tuple[dict, dict]:
    """Every batch of every round, the variants taking turns: each variant's seconds per phase for each batch, and
    its answers and KLs of the first round (per batch: sampled, greedy, KLs)."""
    from cory import generation

    times: dict[str, list] = {v: [] for v in VARIANTS}
    answers: dict[str, list] = {v: [] for v in VARIANTS}
    try:
        for r in range(rounds):
            for b, prompts in enumerate(bench.batches):
                for v in VARIANTS:
                    phase, sampled, greedy, kls = one_batch(bench, v, prompts)
                    times[v].append(phase)
                    if r == 0:
                        answers[v].append((sampled, greedy, kls))
                    print(f"round {r} batch {b} {v:13s} " + " ".join(f"{k} {s:.2f}s" for k, s in phase.items()),
                          file=sys.stderr, flush=True)
    finally:
        generation.MIN_SHARED_PREFIX = bench.min_shared_prefix
    return times, answers


def compare(times: dict, answers: dict) -> dict:
    """Per variant: the median seconds per batch and per phase, its speed-up over left_padded, the share of its
    sampled and greedy answers equal to left_padded's, and the largest KL difference to left_padded's."""
    def flat(v, i):
        return [x for batch in answers[v] for x in batch[i]]

    summary = {}
    for v in VARIANTS:
        per_batch = statistics.median(sum(p.values()) for p in times[v])
        summary[v] = {
            "seconds_per_batch": per_batch,
            "phases_s": {k: statistics.median(p[k] for p in times[v]) for k in ("sample", "greedy", "kl")},
            "speedup_vs_left_padded": None,
            "sampled_equal": sum(a == b for a, b in zip(flat(v, 0), flat("left_padded", 0))) / len(flat(v, 0)),
            "greedy_equal": sum(a == b for a, b in zip(flat(v, 1), flat("left_padded", 1))) / len(flat(v, 1)),
            "kl_max_abs_diff": max(abs(a - b) for a, b in zip(flat(v, 2), flat("left_padded", 2))),
        }
    for v in VARIANTS:
        summary[v]["speedup_vs_left_padded"] = summary["left_padded"]["seconds_per_batch"] / summary[v][
            "seconds_per_batch"]
    return summary


def print_report(doc: dict) -> None:
    print(f"{doc['model']}, arithmetic held-out, batch {doc['batch_size']}, {doc['threads']} thread(s), CPU flags "
          f"{','.join(doc['cpu_flags']) or 'none of ' + '/'.join(('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'))}; "
          f"prompts {doc['prompt_tokens'][0]}-{doc['prompt_tokens'][1]} tokens, {doc['shared_prefix_tokens']} shared")
    print(f"{'variant':14s} {'s/batch':>8s} {'sample':>7s} {'greedy':>7s} {'kl':>7s} {'speedup':>8s} "
          f"{'same draws':>10s} {'KL diff':>8s}")
    for v, s in doc["summary"].items():
        ph = s["phases_s"]
        print(f"{v:14s} {s['seconds_per_batch']:8.2f} {ph['sample']:7.2f} {ph['greedy']:7.2f} {ph['kl']:7.2f} "
              f"{s['speedup_vs_left_padded']:7.2f}x {min(s['sampled_equal'], s['greedy_equal']):10.0%} "
              f"{s['kl_max_abs_diff']:8.1e}")


if __name__ == "__main__":
    sys.exit(main())
