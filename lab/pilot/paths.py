"""The base model's accuracy on training draws through the training path and through the evaluation path (DESIGN.md,
"Stage 3, first: the path check"). Descriptive.

    python -m lab.pilot.paths --json results/arithmetic_cpu_pilot/paths.json

The first ``--n`` training problems of seed 0 (what a seed-0 run draws at its first iterations), answered by the
embedded SmolLM2-135M before any update:
- training path: ``cory.rollout.Rollout`` with the stage-2 config's sampling (``agent.generate``, trl's batched
  generate, a batch of 32 per call, 20-token answers, EOS or "Question:" ends an answer), scored as training scores;
- evaluation path: ``cory.heldout.evaluate_reward`` on the same problems (sampled at T = 1, and greedy; seed 0).
Each by stratum (one-digit sums, two-digit sums). The held-out set's strata through the evaluation path are
``strata_base.json`` (strata.py: the same call, seed and model).
"""
import argparse
import json
import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch


from arithmetic_train.ppo import Hyperparameters
from cory import models
from cory.agent import make_agents
from cory.assets import locate
from cory.config import build
from cory.rollout import Rollout
from cory.tasks import make_task
from lab.pilot.strata import score_stratum, stratum


def by_stratum(examples, rewards) -> dict:
    out = {}
    for name in ("one_digit", "two_digit", "all"):
        xs = [r for ex, r in zip(examples, rewards) if name == "all" or stratum(ex.query) == name]
        mean = sum(xs) / len(xs) if xs else float("nan")
        out[name] = {"n": len(xs), "accuracy": mean,
                     "se": math.sqrt(mean * (1 - mean) / len(xs)) if xs else float("nan")}
    return out


def show(key: str, row: dict) -> None:
    print(f"{key:26s} " + "  ".join(f"{s} {row[s]['accuracy']:.3f} ± {row[s]['se']:.3f} (n {row[s]['n']})"
                                    for s in ("one_digit", "two_digit", "all")), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=320, help="training problems (a multiple of 32)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    cfg = build(Hyperparameters, {
        "seed": 0, "batch_size": 32, "mini_batch_size": 8, "gradient_accumulation_steps": 1, "ppo_epochs": 2, "learning_rate": 1e-5,
        "output_dir": "/tmp/unused", "precision": "fp32"})
    spec = locate(cfg.model_name)
    tokenizer = models.load_tokenizer(spec)
    task = make_task(cfg, tokenizer)
    examples = task.sample(args.n)
    agents, reference = make_agents(cfg, spec, ["policy"], tokenizer, precision="fp32")
    agent = agents["policy"]
    rollout = Rollout(cfg, task, tokenizer, np.random.default_rng(cfg.seed), spec.context)
    torch.manual_seed(cfg.seed)
    train_rewards, train_texts = [], []
    for start in range(0, len(examples), cfg.batch_size):
        batch = examples[start:start + cfg.batch_size]
        answers = rollout.answer(agent, rollout.prompts(batch))
        train_rewards += rollout.score(batch, answers.texts)
        train_texts += answers.texts
        print(f"training path: {len(train_rewards)} answered, accuracy {sum(train_rewards) / len(train_rewards):.3f}",
              flush=True)
    model = agent.policy.pretrained_model

    def evaluation_path(subset, label):
        """(sampled, greedy) accuracy by stratum: ``evaluate_reward`` on each stratum's problems, as strata.py."""
        sampled, greedy = {}, {}
        for name in ("one_digit", "two_digit"):
            part, res = score_stratum(model, cast(Any, reference).pretrained_model, tokenizer, task, subset, name,
                                      label=f"{label} {name}")
            for row, key in ((sampled, "task_reward"), (greedy, "greedy_reward")):
                row[name] = {"n": len(part), "accuracy": res[key],
                             "se": math.sqrt(res[key] * (1 - res[key]) / len(part))}
        for row in (sampled, greedy):
            n = sum(row[s]["n"] for s in ("one_digit", "two_digit"))
            acc = sum(row[s]["n"] * row[s]["accuracy"] for s in ("one_digit", "two_digit")) / n
            row["all"] = {"n": n, "accuracy": acc, "se": math.sqrt(acc * (1 - acc) / n)}
        return sampled, greedy

    training_path = by_stratum(examples, train_rewards)
    show("training_path", training_path)
    ev_sampled, ev_greedy = evaluation_path(examples, "training draws")
    out = {
        "command": "python -m lab.pilot.paths --n %d --json %s" % (args.n, args.json),
        "model": cfg.model_name, "training_draws": f"seed 0, the first {args.n}",
        "one_digit_share_of_training_draws": sum(stratum(ex.query) == "one_digit" for ex in examples) / len(examples),
        "training_path": training_path,
        "evaluation_path_sampled": ev_sampled,
        "evaluation_path_greedy": ev_greedy,
        "training_path_samples": [{"query": ex.query, "response": t, "reward": r}
                                  for ex, t, r in list(zip(examples, train_texts, train_rewards))[:12]],
    }
    for key in ("training_path", "evaluation_path_sampled", "evaluation_path_greedy"):
        show(key, out[key])
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
