"""The pilot's held-out accuracy by stratum (DESIGN.md, amendment of 08:28 UTC): sums of two one-digit numbers and of
two-digit numbers in the task's held-out set as the checkout builds it (27 and 173 problems before stage 3 rebuilt the
set, 84 and 116 since), for the base model and for a run's checkpoint, and both weighted to the training mix (51%
one-digit). Descriptive.

    python -m lab.pilot.strata base --json results/arithmetic_cpu_pilot/strata_base.json
    python -m lab.pilot.strata RUN_DIR/checkpoint-N --json results/arithmetic_cpu_pilot/strata_X.json

Each stratum is scored as a run's held-out evaluation scores it (``cory.heldout.evaluate_reward``: sampled at T = 1
as in training, and greedy; 20-token answers; seed 0), on the stratum's problems alone.
"""
import argparse
import json
import re
from pathlib import Path

import torch


from cory import models
from cory.assets import locate
from cory.heldout import evaluate_reward
from cory.run.outputs import load_checkpoint_file
from cory.tasks.arithmetic import ArithmeticTask

TRAINING_ONE_DIGIT_SHARE = 0.51  # measured: 2,000 training draws of sums_2x12 (DESIGN.md)


def stratum(query: str) -> str:
    return "one_digit" if all(len(n) == 1 for n in re.findall(r"\d+", query)) else "two_digit"


def score_stratum(model, reference, tokenizer, task, examples, name: str, label: str):
    """(the stratum's problems, ``evaluate_reward``'s result on them): sampled and greedy, 20-token answers, seed 0,
    as a run's held-out evaluation scores (paths.py and seen.py score their strata through this too)."""
    subset = [ex for ex in examples if stratum(ex.query) == name]
    res = evaluate_reward(model, reference, tokenizer, task, subset, max_new_tokens=20, batch_size=32, seed=0,
                          reward_name="correctness", allow_early_eos=True, greedy=True, label=label)
    return subset, res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="'base', or a checkpoint folder (its policy.pt)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    spec = locate("embedded:smollm2-135m")
    tokenizer = models.load_tokenizer(spec)
    # the plain causal LMs inside the value-head models, as a run's own evaluation reads them
    reference = models.load_reference(spec).pretrained_model
    model = reference
    if args.model != "base":
        policy = models.load_reference(spec)  # a second copy, given the checkpoint's weights
        params = load_checkpoint_file(Path(args.model) / "policy.pt")["params"]
        own = dict(policy.named_parameters())
        assert set(params) <= set(own), sorted(set(params) - set(own))[:3]
        with torch.no_grad():
            for name, value in params.items():
                own[name].copy_(value)
        model = policy.pretrained_model
    task = ArithmeticTask("sums_2x12", seed=0)
    examples = task.eval_examples()
    out = {"model": args.model, "strata": {}}
    for name in ("one_digit", "two_digit"):
        subset, res = score_stratum(model, reference, tokenizer, task, examples, name, label=name)
        res.pop("samples")
        out["strata"][name] = {"n": len(subset), **res}
        print(f"{args.model} {name}: n {len(subset)}, sampled {res['task_reward']:.3f}, greedy "
              f"{res['greedy_reward']:.3f}, KL {res['kl']:.2f}", flush=True)
    w = TRAINING_ONE_DIGIT_SHARE
    s = out["strata"]
    for key in ("task_reward", "greedy_reward"):
        out[f"{key}_at_training_mix"] = w * s["one_digit"][key] + (1 - w) * s["two_digit"][key]
    print(f"at the training mix: sampled {out['task_reward_at_training_mix']:.3f}, greedy "
          f"{out['greedy_reward_at_training_mix']:.3f}")
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
