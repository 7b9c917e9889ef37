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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.preset not in PRESETS:
        raise ValueError(f"--preset: {args.preset!r} is not one of {', '.join(PRESETS)}")
    for name in ("batch_size", "ppo_epochs", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        raise ValueError(f"--threads: must be >= 0, got {args.threads}")
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        raise ValueError(f"--json: folder {Path(args.json).parent} does not exist")
    return args


def main(argv=None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    warnings.simplefilter("ignore")
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(REPO))  # the training scripts' folders import by name (imdb_train.cory)
    from iteration import matmul_peak_gflops

    from cory import models

    from cory.assets import locate
    from cory.agent import Agent
    from cory.config import build, load_yaml
    from imdb_train.cory import Hyperparameters
    from cory.rollout import decode_and_clean, generation_kwargs, tokenize_prompts
    from cory.ppo import AgentTrainer
    from cory.tasks import make_task
    from trl import PPOTrainer

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

    def agent(cls=Agent):
        return cls("bench", cfg, copy.deepcopy(pristine), reference, tok)

    def say(*parts):
        print(*parts, flush=True)

    # -- the batches both agents see: real prompts, real sampled answers ---------------------------------
    batch = task.sample(cfg.batch_size)
    a = agent()
    p_queries = tokenize_prompts(tok, batch)
    torch.manual_seed(cfg.seed)
    p_texts, p_responses = decode_and_clean(task, tok, a.generate(p_queries, max_new_tokens=length, **gen_kwargs))
    o_queries = tokenize_prompts(tok, batch, [task.observer_prompt(ex, t) for ex, t in zip(batch, p_texts)])
    o_texts, o_responses = decode_and_clean(task, tok, a.generate(o_queries, max_new_tokens=length, **gen_kwargs))
    scores = {"pioneer": [float(x) for x in np.random.default_rng(0).normal(size=len(batch))]}
    scores["observer"] = scores["pioneer"][::-1]
    shapes = {"pioneer": (p_queries, p_responses), "observer": (o_queries, o_responses)}
    results["tokens"] = {role: {"prompt": sum(map(len, q)), "response": sum(map(len, r)),
                                "padded": len(q) * max(len(x) + len(y) for x, y in zip(q, r))}
                         for role, (q, r) in shapes.items()}
    say(f"threads {threads} (torch default {default_threads}); tokens per batch: {results['tokens']}")

    # -- threads -------------------------------------------------------------------------------------------
    lm_in = torch.nn.utils.rnn.pad_sequence([torch.cat([q, r]) for q, r in zip(o_queries, o_responses)],
                                            batch_first=True, padding_value=tok.pad_token_id)

    def train_pass():
        model = pristine.pretrained_model
        out = model(input_ids=lm_in, attention_mask=torch.ones_like(lm_in), use_cache=False)
        out.logits[:, -length:].log_softmax(-1).mean().backward()
        model.zero_grad(set_to_none=True)

    def gen_full(ag=a, queries=p_queries):
        ag.generate(queries, max_new_tokens=length, **gen_kwargs)

    results["threads_lever"] = {}
    for n in sorted({1, default_threads}):
        torch.set_num_threads(n)
        row = {"matmul_gflops": matmul_peak_gflops(), "generate_s": best_of(gen_full, args.repeats),
               "train_pass_s": best_of(train_pass, args.repeats)}
        results["threads_lever"][n] = row
        say(f"threads={n}: matmul {row['matmul_gflops']:.1f} GFLOP/s, generate {row['generate_s']:.2f}s, "
            f"forward+backward (observer batch) {row['train_pass_s']:.2f}s")
    torch.set_num_threads(threads)

    # -- generation ----------------------------------------------------------------------------------------
    def gen_trl_default():
        with torch.inference_mode():
            a.trainer.model.eval()
            a.trainer.generate(p_queries, return_prompt=False, max_new_tokens=length, **gen_kwargs)

    def gen_no_cache():
        with torch.inference_mode():
            a.trainer.model.eval()
            a.trainer.generate(p_queries, batch_size=len(p_queries), return_prompt=False, max_new_tokens=length,
                               use_cache=False, **gen_kwargs)

    def gen_no_grad():
        with torch.no_grad():
            a.trainer.model.eval()
            a.trainer.generate(p_queries, batch_size=len(p_queries), return_prompt=False, max_new_tokens=length,
                               **gen_kwargs)

    gen = {"one call (ours)": best_of(gen_full, args.repeats),
           "trl default, batches of 4": best_of(gen_trl_default, args.repeats),
           "KV cache off": best_of(gen_no_cache, args.repeats),
           "no_grad instead of inference_mode": best_of(gen_no_grad, args.repeats)}
    results["generation"] = gen
    say("generation (pioneer batch, %d new tokens): " % length + "; ".join(f"{k} {v:.2f}s" for k, v in gen.items()))

    # -- the PPO step ----------------------------------------------------------------------------------------
    class Stock(Agent):
        def trainer_class(self):
            return PPOTrainer, {}

        def make_optimizer(self, policy):
            return None

    def ours_but(reuse=True, pack=True, trl_adam=False, kl_rows=False):
        class Variant(Agent):
            def trainer_class(self):
                from cory.speedups import passes
                if kl_rows:  # the full KL a few rows at a time, as for large passes
                    passes.KL_CHUNK_BYTES = 0
                return AgentTrainer, {"max_pass_tokens": self.cfg.max_pass_tokens, "reuse_rollout": reuse,
                                      "pack": pack}

            def make_optimizer(self, policy):
                return None if trl_adam else super().make_optimizer(policy)
        return Variant

    WindowOnly = ours_but(reuse=False, pack=False, trl_adam=True)
    WindowReuse = ours_but(pack=False, trl_adam=True)
    WindowReuseFused = ours_but(pack=False)
    KLInRows = ours_but(kl_rows=True)

    def run_step(cls, role, autocast=False, profiled=False):
        from contextlib import nullcontext

        from torch.profiler import ProfilerActivity, profile

        ag = agent(cls)
        queries, responses = shapes[role]
        torch.manual_seed(1)
        np.random.seed(1)
        t0 = time.perf_counter()
        with (profile(activities=[ProfilerActivity.CPU]) if profiled else nullcontext()) as prof:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                stats = ag.step(queries, responses, scores[role])
        elapsed = time.perf_counter() - t0
        if profiled:
            return profile_categories(prof)
        params = torch.cat([p.detach().flatten() for p in ag.policy.parameters()])
        return elapsed, stats, params

    before = torch.cat([p.detach().flatten() for p in pristine.parameters()])
    keys = ("objective/kl", "objective/entropy", "ppo/loss/total", "ppo/loss/policy", "ppo/loss/value",
            "ppo/policy/approxkl", "ppo/val/vpred", "ppo/returns/mean")
    results["ppo_step"] = {}
    for role in ("pioneer", "observer"):
        rows = {}
        ref_stats = ref_params = None
        for label, cls, autocast in (("trl stock", Stock, False), ("+ response window", WindowOnly, False),
                                     ("+ rollout pass reused", WindowReuse, False), ("+ fused Adam", WindowReuseFused, False),
                                     ("+ packed passes = ours", Agent, False),
                                     ("ours + bf16 autocast", Agent, True),
                                     ("ours, KL a few rows at a time (last: it stays set)", KLInRows, False)):
            elapsed, stats, params = min((run_step(cls, role, autocast) for _ in range(args.repeats)),
                                         key=lambda x: x[0])
            row = {"s": elapsed, "trl_timing": {k: float(v) for k, v in stats.items() if k.startswith("time/ppo")},
                   "stats": {k: float(stats[k]) for k in keys}}
            if ref_stats is None:
                ref_stats, ref_params = stats, params
            else:
                row["rel_stat_diff"] = {k: abs(float(stats[k]) - float(ref_stats[k])) / max(abs(float(ref_stats[k])), 1e-3)
                                        for k in keys}
                row["max_rel_stat_diff"] = max(row["rel_stat_diff"].values())
                # how far the weight update moved from trl's, relative to the update itself (L2)
                row["update_rel_diff"] = ((params - ref_params).norm() / (ref_params - before).norm()).item()
            if label in ("trl stock", "+ packed passes = ours"):
                cats = run_step(cls, role, autocast, profiled=True)
                row["profile_self_cpu_s"] = cats
                say(f"  profile ({label}): " + ", ".join(f"{k} {v:.1f}s" for k, v in cats.items()))
            rows[label] = row
            extra = "" if "max_rel_stat_diff" not in row else (
                f"  stats rel diff <= {row['max_rel_stat_diff']:.1e}, update rel diff {row['update_rel_diff']:.1e}")
            say(f"{role} step, {label}: {row['s']:.2f}s  " +
                " ".join(f"{k.split('/')[-1]}={v:.2f}" for k, v in row["trl_timing"].items()) + extra)
        results["ppo_step"][role] = rows

    # -- Adam ----------------------------------------------------------------------------------------------
    params = [p for p in copy.deepcopy(pristine).parameters() if p.requires_grad]
    adam = {}
    for label, kw in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.Adam(params, lr=1e-5, **kw)

        def one():
            for p in params:
                p.grad = torch.full_like(p, 1e-3)
            opt.step()
            opt.zero_grad(set_to_none=True)
        one()
        adam[label] = best_of(one, args.repeats)
    results["adam_step_s"] = adam
    say("Adam step over %d weights: " % sum(p.numel() for p in params) + "; ".join(f"{k} {v:.2f}s" for k, v in adam.items()))
    del params, adam

    # -- torch.compile ---------------------------------------------------------------------------------------
    if args.compile:
        model = copy.deepcopy(pristine.pretrained_model)
        compiled = torch.compile(model, dynamic=True)

        def compiled_pass():
            out = compiled(input_ids=lm_in, attention_mask=torch.ones_like(lm_in), use_cache=False)
            out.logits[:, -length:].log_softmax(-1).mean().backward()
            model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        compiled_pass()
        results["compile"] = {"first_call_s": time.perf_counter() - t0, "steady_s": best_of(compiled_pass, args.repeats),
                              "eager_s": best_of(train_pass, args.repeats)}
        say("torch.compile: first call {first_call_s:.1f}s, steady {steady_s:.2f}s vs eager {eager_s:.2f}s".format(
            **results["compile"]))

    results["load_average"].append(os.getloadavg()[0])
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
