"""Problems a run trained on against problems it never saw, by stratum (DESIGN.md, "Stage 3: seen and unseen
problems"). Descriptive.

    python -m lab.pilot.seen base --json results/arithmetic_cpu_pilot/seen_base.json
    python -m lab.pilot.seen RUN/final/policy --json results/arithmetic_cpu_pilot/seen_X.json

Seen: the training draws of a seed-0 run's iterations 20-29 (draws 640-959 of the seed-0 stream, 32 per iteration,
repeats kept), which it answered and was updated on. Unseen: the task's 200 held-out problems (never drawn in
training). Each stratum (one-digit sums, two-digit sums) of each set is scored as a run's held-out evaluation scores
it (``cory.heldout.evaluate_reward``: sampled at T = 1 as in training, and greedy; 20-token answers; seed 0).
"""
import argparse
import collections
import json
import math
from pathlib import Path


from cory import models
from cory.assets import locate, model_spec
from cory.tasks.arithmetic import ArithmeticTask
from lab.pilot.strata import score_stratum

BATCH, FIRST, LAST = 32, 20, 29  # the iterations whose draws are "seen"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="'base', or a model folder (a run's final/policy)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    spec = locate("embedded:smollm2-135m")
    tokenizer = models.load_tokenizer(spec)
    reference = models.load_causal_lm(spec).eval()
    model = reference if args.model == "base" else models.load_causal_lm(locate(model_spec(args.model))).eval()
    task = ArithmeticTask("sums_2x12", seed=0)
    draws = task.sample(BATCH * (LAST + 1))
    seen = draws[BATCH * FIRST:]
    times = collections.Counter(ex.query for ex in draws)  # how often each seen problem was drawn in iterations 0-29
    sets = {"seen": seen, "unseen": task.eval_examples()}
    out = {"command": f"python -m lab.pilot.seen {args.model} --json {args.json}",
           "model": args.model, "seen": f"seed-0 training draws of iterations {FIRST}-{LAST}", "sets": {}}
    for name, examples in sets.items():
        out["sets"][name] = {}
        for part in ("one_digit", "two_digit"):
            subset, res = score_stratum(model, reference, tokenizer, task, examples, part, label=f"{name} {part}")
            samples = res.pop("samples")
            row = {"n": len(subset), "distinct_problems": len({ex.query for ex in subset}),
                   **{k: res[k] for k in ("task_reward", "greedy_reward", "kl", "parseable_share", "response_length")}}
            for key in ("task_reward", "greedy_reward"):
                row[f"{key}_se"] = math.sqrt(row[key] * (1 - row[key]) / len(subset))
            if name == "seen":
                row["mean_draws_in_iterations_0_29"] = sum(times[ex.query] for ex in subset) / len(subset)
            row["samples"] = samples[:6]
            out["sets"][name][part] = row
            print(f"{args.model} {name} {part}: n {len(subset)} ({row['distinct_problems']} distinct), sampled "
                  f"{row['task_reward']:.3f} ± {row['task_reward_se']:.3f}, greedy {row['greedy_reward']:.3f} ± "
                  f"{row['greedy_reward_se']:.3f}", flush=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
