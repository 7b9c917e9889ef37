"""One measurement per performance lever of a PPO/CORY iteration, on the preset's model and real prompts.

    python benchmarks/levers.py --preset cpu --batch_size 16
    python benchmarks/levers.py --preset tiny --batch_size 4          # seconds, a smoke check

Levers (each timed best-of-``--repeats`` in this one process, on the same inputs):
  threads      fp32 matmul peak, a batched generation and a training forward+backward at 1 thread and at
               every core
  generation   one batched call for the whole batch vs trl's default batches of 4; KV cache off;
               torch.no_grad instead of inference_mode
  ppo step     trl's stock PPOTrainer.step, then ours one change at a time (response-window logits, the
               rollout pass reused as epoch 0's training pass, fused Adam, packed passes; ours with the full KL
               forced into the rollout pass, which "auto" does only for large tensors), on the pioneer's and the
               observer's batch, with each one's difference from trl in the statistics and in the weight
               update; ours under bf16 autocast, with its deviation; a profile of trl's step and ours
  adam         torch Adam: default (for-loop on CPU), foreach, fused
  compile      (only with --compile) torch.compile of the language model: compile time and steady state
PPO steps here use --ppo_epochs (default 1) to keep the run short; the iteration benchmark uses the preset's.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from harness import add_json_flags, check_json_flags, run_main, save_json
REPO = Path(__file__).resolve().parent.parent
PROGRAM = "python benchmarks/levers.py"
PRESETS = ("tiny", "cpu")


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def profile_categories(prof) -> dict:
    """Self CPU seconds of a torch.profiler run by kind of operator."""
    cats = {"GEMM": 0.0, "attention": 0.0, "vocab softmax/log-softmax": 0.0, "optimizer": 0.0, "other": 0.0}
    for e in prof.key_averages():
        name, t = e.key, e.self_cpu_time_total / 1e6
        if name.startswith("Optimizer.step"):
            cats["optimizer"] += e.cpu_time_total / 1e6
            cats["other"] -= t + 0.0  # its own self time is in the total just added
        elif name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
            cats["GEMM"] += t
        elif "scaled_dot_product" in name:
            cats["attention"] += t
        elif "softmax" in name:
            cats["vocab softmax/log-softmax"] += t
        else:
            cats["other"] += t
    # the optimizer's kernels (aten::add_, lerp_ ...) were counted under "other": take them out
    cats["other"] -= cats["optimizer"]
    cats["other"] = max(cats["other"], 0.0)
    return cats


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--ppo_epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads outside the thread lever (0 = default)")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile (minutes)")
    p.add_argument("--seed", type=int, default=0)
    add_json_flags(p)
    args = p.parse_args(argv)
    if args.preset not in PRESETS:
        raise ValueError(f"--preset: {args.preset!r} is not one of {', '.join(PRESETS)}")
    for name in ("batch_size", "ppo_epochs", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        raise ValueError(f"--threads: must be >= 0, got {args.threads}")
    check_json_flags(args, PROGRAM)
    return args


@dataclass
class Bench:
    """What every lever is measured on: the IMDB CORY preset's config and model, a pristine policy to copy from,
    the pioneer's and the observer's batch (real prompts, real sampled answers), and the results so far."""
    args: argparse.Namespace
    cfg: Any
    tok: Any
    task: Any
    reference: Any
    pristine: Any  # the policy every lever copies, moved a little away from the reference
    length: int  # the longest responses of the range: the costliest iteration
    gen_kwargs: dict
    threads: int
    default_threads: int
    results: dict
    first: Any = None  # the agent that sampled the batches, reused by the generation levers
    shapes: dict = field(default_factory=dict)  # role -> (queries, responses)
    scores: dict = field(default_factory=dict)  # role -> training scores
    lm_in: Any = None  # the observer batch's prompts and answers, padded, for the training passes

    def agent(self, cls=None):
        from cory.agent import Agent

        return (cls or Agent)("bench", self.cfg, copy.deepcopy(self.pristine), self.reference, self.tok)

    def gen_full(self):
        """One batched generation of the pioneer batch (what runs do)."""
        self.first.generate(self.shapes["pioneer"][0], max_new_tokens=self.length, **self.gen_kwargs)

    def train_pass(self):
        """A forward+backward of the language model on the observer batch's prompts and answers."""
        import torch

        model, lm_in = self.pristine.pretrained_model, self.lm_input()
        out = model(input_ids=lm_in, attention_mask=torch.ones_like(lm_in), use_cache=False)
        out.logits[:, -self.length:].log_softmax(-1).mean().backward()
        model.zero_grad(set_to_none=True)

    def lm_input(self):
        import torch

        if self.lm_in is None:
            queries, responses = self.shapes["observer"]
            self.lm_in = torch.nn.utils.rnn.pad_sequence([torch.cat([q, r]) for q, r in zip(queries, responses)],
                                                         batch_first=True, padding_value=self.tok.pad_token_id)
        return self.lm_in


def say(*parts):
    print(*parts, flush=True)


def load(args) -> Bench:
    """The preset's config, tokenizer, task, reference and pristine policy."""
    import torch

    from cory import models
    from cory.assets import locate
    from cory.config import build, load_yaml
    from cory.rollout import generation_kwargs
    from cory.tasks import make_task
    from imdb_train.cory import Hyperparameters

    default_threads = torch.get_num_threads()
    threads = args.threads or default_threads
    torch.set_num_threads(threads)
    base = load_yaml(REPO / "configs" / "imdb" / f"cory_{args.preset}.yaml")
    base.update(batch_size=args.batch_size, mini_batch_size=args.batch_size, ppo_epochs=args.ppo_epochs,
                output_dir="/tmp/unused", seed=args.seed)
    cfg = build(Hyperparameters, base)  # the IMDB script's values, then the preset's changes
    spec = locate(cfg.model_name)  # resolved once for the loaders below
    torch.manual_seed(cfg.seed)
    tok = models.load_tokenizer(spec)
    task = make_task(cfg, tok)
    reference = models.load_reference(spec)
    pristine = models.load_policy(spec)
    with torch.no_grad():  # away from the reference, so the KL terms of the step are not all zero
        for w in pristine.pretrained_model.parameters():
            w.add_(0.02 * w.std() * torch.randn_like(w))
    length = cfg.response_length_max  # the longest responses of the range: the costliest iteration
    gen_kwargs = generation_kwargs(cfg, tok, task)
    if not cfg.allow_early_eos:  # as in training: every answer has the drawn length
        gen_kwargs["min_new_tokens"] = length
    results = {"preset": args.preset, "batch_size": args.batch_size, "ppo_epochs": args.ppo_epochs,
               "threads": threads, "load_average": [os.getloadavg()[0]]}
    return Bench(args, cfg, tok, task, reference, pristine, length, gen_kwargs, threads, default_threads, results)


def sample_batches(b: Bench) -> None:
    """The batches both agents see: real prompts, real sampled answers."""
    import numpy as np
    import torch

    from cory.rollout import decode_and_clean, tokenize_prompts

    tok, task, length = b.tok, b.task, b.length
    batch = task.sample(b.cfg.batch_size)
    b.first = b.agent()
    p_queries = tokenize_prompts(tok, batch)
    torch.manual_seed(b.cfg.seed)
    p_texts, p_responses = decode_and_clean(task, tok, b.first.generate(p_queries, max_new_tokens=length,
                                                                        **b.gen_kwargs))
    o_queries = tokenize_prompts(tok, batch, [task.observer_prompt(ex, t) for ex, t in zip(batch, p_texts)])
    o_texts, o_responses = decode_and_clean(task, tok, b.first.generate(o_queries, max_new_tokens=length,
                                                                        **b.gen_kwargs))
    b.scores = {"pioneer": [float(x) for x in np.random.default_rng(0).normal(size=len(batch))]}
    b.scores["observer"] = b.scores["pioneer"][::-1]
    b.shapes = {"pioneer": (p_queries, p_responses), "observer": (o_queries, o_responses)}
    b.results["tokens"] = {role: {"prompt": sum(map(len, q)), "response": sum(map(len, r)),
                                  "padded": len(q) * max(len(x) + len(y) for x, y in zip(q, r))}
                           for role, (q, r) in b.shapes.items()}
    say(f"threads {b.threads} (torch default {b.default_threads}); tokens per batch: {b.results['tokens']}")


def threads_lever(b: Bench) -> None:
    """fp32 matmul peak, a batched generation and a training forward+backward at 1 thread and at every core."""
    import torch

    from iteration_worker import matmul_peak_gflops

    b.lm_input()  # padded once, outside the timings
    b.results["threads_lever"] = {}
    for n in sorted({1, b.default_threads}):
        torch.set_num_threads(n)
        row = {"matmul_gflops": matmul_peak_gflops(), "generate_s": best_of(b.gen_full, b.args.repeats),
               "train_pass_s": best_of(b.train_pass, b.args.repeats)}
        b.results["threads_lever"][n] = row
        say(f"threads={n}: matmul {row['matmul_gflops']:.1f} GFLOP/s, generate {row['generate_s']:.2f}s, "
            f"forward+backward (observer batch) {row['train_pass_s']:.2f}s")
    torch.set_num_threads(b.threads)


def generation_lever(b: Bench) -> None:
    """One batched call for the whole batch vs trl's default batches of 4; KV cache off; no_grad."""
    import torch

    trainer, queries, length, kwargs = b.first.trainer, b.shapes["pioneer"][0], b.length, b.gen_kwargs

    def gen_trl_default():
        with torch.inference_mode():
            trainer.model.eval()
            trainer.generate(queries, return_prompt=False, max_new_tokens=length, **kwargs)

    def gen_no_cache():
        with torch.inference_mode():
            trainer.model.eval()
            trainer.generate(queries, batch_size=len(queries), return_prompt=False, max_new_tokens=length,
                             use_cache=False, **kwargs)

    def gen_no_grad():
        with torch.no_grad():
            trainer.model.eval()
            trainer.generate(queries, batch_size=len(queries), return_prompt=False, max_new_tokens=length, **kwargs)

    repeats = b.args.repeats
    gen = {"one call (ours)": best_of(b.gen_full, repeats),
           "trl default, batches of 4": best_of(gen_trl_default, repeats),
           "KV cache off": best_of(gen_no_cache, repeats),
           "no_grad instead of inference_mode": best_of(gen_no_grad, repeats)}
    b.results["generation"] = gen
    say("generation (pioneer batch, %d new tokens): " % length + "; ".join(f"{k} {v:.2f}s" for k, v in gen.items()))


def step_variants() -> list[tuple[str, type, bool]]:
    """(label, agent class, bf16 autocast) of the PPO step's variants, trl's stock step first: the others are
    compared with it."""
    from trl import PPOTrainer

    from cory.agent import Agent
    from cory.ppo import AgentTrainer

    class Stock(Agent):
        def trainer_class(self):
            return PPOTrainer, {}

        def make_optimizer(self, policy):
            return None

    def ours_but(reuse=True, pack=True, trl_adam=False, kl_rows=False):
        class Variant(Agent):
            def trainer_class(self):
                from cory import passes
                if kl_rows:  # the full KL a few rows at a time, as for large passes
                    passes.KL_CHUNK_BYTES = 0
                return AgentTrainer, {"max_pass_tokens": self.cfg.max_pass_tokens, "reuse_rollout": reuse,
                                      "pack": pack}

            def make_optimizer(self, policy):
                return None if trl_adam else super().make_optimizer(policy)
        return Variant

    return [("trl stock", Stock, False),
            ("+ response window", ours_but(reuse=False, pack=False, trl_adam=True), False),
            ("+ rollout pass reused", ours_but(pack=False, trl_adam=True), False),
            ("+ fused Adam", ours_but(pack=False), False),
            ("+ packed passes = ours", Agent, False),
            ("ours + bf16 autocast", Agent, True),
            ("ours, KL a few rows at a time (last: it stays set)", ours_but(kl_rows=True), False)]


def run_step(b: Bench, cls, role: str, autocast=False, profiled=False):
    """One PPO step of a fresh agent of ``cls`` on ``role``'s batch: (seconds, statistics, weights after), or with
    ``profiled`` the self CPU seconds by kind of operator."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    ag = b.agent(cls)
    queries, responses = b.shapes[role]
    torch.manual_seed(1)
    np.random.seed(1)
    t0 = time.perf_counter()
    with (profile(activities=[ProfilerActivity.CPU]) if profiled else nullcontext()) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            stats = ag.step(queries, responses, b.scores[role])
    elapsed = time.perf_counter() - t0
    if profiled:
        return profile_categories(prof)
    params = torch.cat([p.detach().flatten() for p in ag.policy.parameters()])
    return elapsed, stats, params


STEP_STATS = ("kl", "sequence_entropy", "total_loss", "policy_loss", "value_loss", "approx_kl", "mean_value",
              "mean_return")  # cory.ppo.StepStats fields (trl's step read into the same record)


def ppo_step_lever(b: Bench) -> None:
    """trl's stock step, then ours one change at a time, on each role's batch: seconds, and each variant's
    difference from trl in the statistics and in the weight update; a profile of trl's step and ours."""
    import torch

    before = torch.cat([p.detach().flatten() for p in b.pristine.parameters()])
    b.results["ppo_step"] = {}
    for role in ("pioneer", "observer"):
        rows = {}
        ref_stats = ref_params = None
        for label, cls, autocast in step_variants():
            elapsed, stats, params = min((run_step(b, cls, role, autocast) for _ in range(b.args.repeats)),
                                         key=lambda x: x[0])
            row = {"s": elapsed, "step_timing": dict(stats.seconds),
                   "stats": {k: getattr(stats, k) for k in STEP_STATS}}
            if ref_stats is None:
                ref_stats, ref_params = stats, params
            else:
                row["rel_stat_diff"] = {k: abs(getattr(stats, k) - getattr(ref_stats, k))
                                        / max(abs(getattr(ref_stats, k)), 1e-3) for k in STEP_STATS}
                row["max_rel_stat_diff"] = max(row["rel_stat_diff"].values())
                # how far the weight update moved from trl's, relative to the update itself (L2)
                row["update_rel_diff"] = ((params - ref_params).norm() / (ref_params - before).norm()).item()
            if label in ("trl stock", "+ packed passes = ours"):
                cats = run_step(b, cls, role, autocast, profiled=True)
                row["profile_self_cpu_s"] = cats
                say(f"  profile ({label}): " + ", ".join(f"{k} {v:.1f}s" for k, v in cats.items()))
            rows[label] = row
            extra = "" if "max_rel_stat_diff" not in row else (
                f"  stats rel diff <= {row['max_rel_stat_diff']:.1e}, update rel diff {row['update_rel_diff']:.1e}")
            say(f"{role} step, {label}: {row['s']:.2f}s  " +
                " ".join(f"{k.split('/')[-1]}={v:.2f}" for k, v in row["step_timing"].items()) + extra)
        b.results["ppo_step"][role] = rows


def adam_lever(b: Bench) -> None:
    """torch Adam: default (for-loop on CPU), foreach, fused."""
    import torch

    params = [p for p in copy.deepcopy(b.pristine).parameters() if p.requires_grad]
    adam = {}
    for label, kw in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.Adam(params, lr=1e-5, **kw)

        def one():
            for p in params:
                p.grad = torch.full_like(p, 1e-3)
            opt.step()
            opt.zero_grad(set_to_none=True)
        one()
        adam[label] = best_of(one, b.args.repeats)
    b.results["adam_step_s"] = adam
    say("Adam step over %d weights: " % sum(p.numel() for p in params) + "; ".join(f"{k} {v:.2f}s" for k, v in adam.items()))


def compile_lever(b: Bench) -> None:
    """torch.compile of the language model: compile time and steady state, against eager."""
    import torch

    model = copy.deepcopy(b.pristine.pretrained_model)
    compiled = torch.compile(model, dynamic=True)
    lm_in = b.lm_input()

    def compiled_pass():
        out = compiled(input_ids=lm_in, attention_mask=torch.ones_like(lm_in), use_cache=False)
        out.logits[:, -b.length:].log_softmax(-1).mean().backward()
        model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    compiled_pass()
    b.results["compile"] = {"first_call_s": time.perf_counter() - t0,
                            "steady_s": best_of(compiled_pass, b.args.repeats),
                            "eager_s": best_of(b.train_pass, b.args.repeats)}
    say("torch.compile: first call {first_call_s:.1f}s, steady {steady_s:.2f}s vs eager {eager_s:.2f}s".format(
        **b.results["compile"]))


def main(argv=None) -> int:
    return run_main(parse, measure, argv)


def measure(args, argv: list[str]) -> int:
    for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)  # before transformers is imported
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(REPO))  # the training scripts' folders import by name (imdb_train.cory)

    from cory.errors import AssetError, ConfigError

    try:
        b = load(args)
    except (ConfigError, AssetError) as e:  # the preset's model or task cannot be had here: one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    b.results = {"command": " ".join([PROGRAM, *argv]), **b.results}
    sample_batches(b)
    threads_lever(b)
    generation_lever(b)
    ppo_step_lever(b)
    adam_lever(b)
    if args.compile:
        compile_lever(b)
    b.results["load_average"].append(os.getloadavg()[0])
    print(json.dumps(b.results, indent=1))
    return save_json(args.json, b.results) if args.json else 0


if __name__ == "__main__":
    raise SystemExit(main())
