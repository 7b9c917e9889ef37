"""Where a PPO and a CORY iteration spend their time and memory, and how close they get to the machine.

    python benchmarks/iteration.py --preset cpu --batch_size 16 --iterations 3
    python benchmarks/iteration.py --preset tiny --batch_size 4 --iterations 2      # seconds, a smoke check
    # what a run would use (preset, model, precision, pass budget), printed without loading anything:
    python benchmarks/iteration.py --preset paper --device cuda --model random:gpt2-large --batch_size 256 --dry_run
    # on a GPU, random-weight stand-ins of the paper's shapes (no hub needed):
    python benchmarks/iteration.py --device cuda --model random:gpt2-large --batch_size 256 --precision tf32
    python benchmarks/iteration.py --device cuda --task gsm8k --model random:llama-2-7b --batch_size 32 \
        --mini_batch_size 2 --gradient_accumulation_steps 16 --response_length_min 256 --response_length_max 256 \
        --precision bf16 --variants ppo_peft,cory_peft

Each variant runs in a fresh subprocess (``iteration_worker.py``, so peak resident memory is its own), at the
task's preset (``--preset``: configs/<task>/{ppo,cory}_<preset>.yaml, any the task has: tiny, cpu, gpu, paper;
embedded SmolLM2-135M + VADER for IMDB's ``cpu``; a hub model of ``paper`` needs ``--model`` a stand-in here), with
the same seed and so the same prompts and response lengths, the full batch in one PPO mini-batch:

    ppo        our PPO iteration (cory.game.ppo_iteration)
    cory       our CORY iteration (cory.game.cory_iteration)
    authors    CORY as the released code runs it, built from the same pieces: trl's stock PPOTrainer and
               Adam, trl's default list generation in batches of 4, and role exchange by save_pretrained
               + reload into new PPOTrainers every swap_period iterations
    ppo_peft, cory_peft   the same with LoRA adapters (use_peft), for memory only

On CUDA the memory figures are the caching allocator's peak of allocated tensors per phase (generation, the
rollout and reference passes, the full-vocabulary KL, the training passes), and MFU is given against the fp32,
TF32 and bf16 matmul peaks measured in the same worker.

Reported per variant: seconds per iteration (median over --iterations after --warmup), split into
pioneer generation, observer generation, reward, pioneer PPO step, observer PPO step, role exchange and
other; tokens per second; peak resident memory; model FLOPs per second as a fraction of this machine's fp32
matmul peak, measured in the same worker right before and after its iterations (the best of the run is
used). Model FLOPs are the work PPO's math needs, on the real (unpadded) prompt + response tokens, a prefix
every prompt shares counted once:
a forward pass is 2 x (non-embedding weights x tokens + LM-head weights x scored tokens); its backward
is one more of that for the activations' gradients plus 2 x trainable weights x tokens for the weights'
(so a training pass is 3 forwards when every weight trains, about 2 with LoRA's frozen base). A PPO step
needs the reference's forward, ppo_epochs training passes and, unless its epoch-0 forward can give them
(one mini-batch), a forward for the rollout's log-probs and values; a generation counts one forward over
prompt + response. Redundant passes (trl runs the rollout forward and then the same epoch-0 forward) are
not credited, and attention's own products (about 2% at these lengths) are left out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import (ChildError, Stopped, UsageError, add_json_flags, check_json_flags, child_error, cpu_info,
                     report_stop, running, save_json, stopped_by_signals, temporary_folder)
from iteration_worker import OVERRIDES, REPO, worker

PROGRAM = "python benchmarks/iteration.py"
UNUSED_DIR = "unused"  # a config's output_dir where it is only read (the workers' own are temporary folders)

TASKS = ("imdb", "gsm8k", "arithmetic")  # each with <task>_train/{ppo,cory}.py and configs/<task>/
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # the workers run offline


def presets(task: str) -> list[str]:
    """The presets a task has: configs/<task>/ppo_<preset>.yaml."""
    return sorted(p.stem.split("_", 1)[1] for p in (REPO / "configs" / task).glob("ppo_*.yaml"))
VARIANTS = ("ppo", "cory", "authors", "ppo_peft", "cory_peft")
COMPONENTS = {
    "ppo": [("generate", "time/generate_s"), ("reward", "time/reward_s"), ("step", "time/step_s")],
    "cory": [("pioneer_generate", "time/pioneer_generate_s"), ("observer_generate", "time/observer_generate_s"),
             ("reward", "time/reward_s"), ("pioneer_step", "time/pioneer_step_s"),
             ("observer_step", "time/observer_step_s"), ("exchange", "time/swap_s")],
}
TARGETS = {"outside_share": 0.05, "step_mfu": 0.60, "exchange_s": 0.050, "speedup": 1.5, "peft_extra": 0.30,
           "cory_over_ppo": 2.5}


# ----------------------------------------------------------------------------- FLOPs

def forward_flops(w: dict, tokens: int, scored: int) -> float:
    return 2.0 * (w["body"] * tokens + w["head"] * scored)


def needed_tokens(step: dict) -> int:
    """The prompt + response tokens a step's passes need, a prefix every prompt shares (GSM8K's and arithmetic's
    one-shot example) counted once as a pass holds it (``cory.packing``); per sequence in records before 2026-11-28."""
    shared = step.get("shared_prefix_tokens", 0) * (step.get("sequences", 1) - 1)
    return step["prompt_tokens"] + step["response_tokens"] - shared


def ppo_step_flops(w: dict, tokens: int, scored: int, epochs: int, one_minibatch: bool) -> float:
    """The model FLOPs a PPO step needs (see this module's docstring)."""
    forward = forward_flops(w, tokens, scored)
    backward = forward + 2.0 * (w["body_trainable"] * tokens + w["head_trainable"] * scored)
    rollout = 0.0 if one_minibatch else forward
    return rollout + forward + epochs * (forward + backward)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def roles(row: dict, method: str) -> dict:
    """agent name -> role in this iteration."""
    if method == "ppo":
        return {"policy": "policy"}
    p = row["pioneer"]
    return {p: "pioneer", ("llm2" if p == "llm1" else "llm1"): "observer"}


def by_role(row: dict, method: str, phase: str) -> dict:
    """role -> its agent's record of ``phase`` (generate or step) in this iteration."""
    role = roles(row, method)
    return {role[a["agent"]]: a for a in row["agents"] if a["phase"] == phase}


def iteration_figures(r: dict, res: dict, peak: float) -> dict:
    """One timed iteration's seconds, tokens and model FLOPs, and its PPO steps' MFU, CPU seconds and memory."""
    method, w = res["method"], res["weights"]
    comps = {name: r["times"].get(key, 0.0) for name, key in COMPONENTS[method]}
    steps, gens = by_role(r, method, "step"), by_role(r, method, "generate")
    tok = {k: (needed_tokens(a), a["response_tokens"]) for k, a in steps.items()}
    step_flops = {k: ppo_step_flops(w, *tok[k], res["ppo_epochs"], res.get("one_minibatch", True)) for k in steps}
    exchange, exchange_cpu = comps.get("exchange", 0.0), r.get("exchange_cpu_s", 0.0)
    core = sum(a["wall_s"] for a in r["agents"])  # the generations and PPO steps
    core_cpu = sum(a["cpu_s"] for a in r["agents"])
    return {
        "steady_s": r["total_s"] - exchange, "steady_cpu_s": r["cpu_s"] - exchange_cpu,
        "exchange_s": exchange, "exchange_cpu_s": exchange_cpu, "swap_step": r["swap_step"], "components": comps,
        "outside_s": r["total_s"] - exchange - core, "outside_cpu_s": r["cpu_s"] - exchange_cpu - core_cpu,
        "tokens": sum(a["prompt_tokens"] + a["response_tokens"] for a in steps.values()),
        "padded": sum(a["padded_tokens"] for a in steps.values()),
        "flops": sum(step_flops.values()) + sum(forward_flops(w, *tok[k]) for k in steps),
        "step_mfu": {k: step_flops[k] / steps[k]["wall_s"] / 1e9 / peak for k in steps},
        # per core: the peak was measured with all of the run's threads
        "step_mfu_cpu": {k: step_flops[k] / steps[k]["cpu_s"] / 1e9 / (peak / res["threads"]) for k in steps},
        "step_cpu_s": {k: steps[k]["cpu_s"] for k in steps}, "generate_cpu_s": {k: gens[k]["cpu_s"] for k in gens},
        "step_memory_mb": {k: {"before": steps[k]["rss_before_mb"], "peak": steps[k]["rss_peak_mb"]} for k in steps},
    }


def summarize(res: dict, peak: float) -> dict:
    """Medians over the timed iterations; for CORY the exchange is charged 1/swap_period per iteration."""
    method = res["method"]
    timed = [r for r in res["rows"] if not r["warmup"]] or res["rows"]
    cory = method == "cory"
    per_iter = [iteration_figures(r, res, peak) for r in timed]
    swaps = [p["exchange_s"] for p in per_iter if p["swap_step"]]
    exchange_s = median(swaps) if swaps else (0.0 if cory else None)
    period = res["swap_period"] or 1
    steady, steady_cpu = median([p["steady_s"] for p in per_iter]), median([p["steady_cpu_s"] for p in per_iter])
    comps = {k: median([p["components"][k] for p in per_iter]) for k in per_iter[0]["components"]}
    if cory:
        comps["exchange"] = exchange_s / period
    total = steady + (exchange_s / period if cory else 0.0)
    comps["other"] = median([p["outside_s"] - p["components"]["reward"] for p in per_iter])
    out = {
        "variant": res["variant"], "iterations": len(per_iter), "threads": res["threads"],
        "max_pass_tokens": res.get("max_pass_tokens"), "pass_tokens_used": res.get("pass_tokens_used"),
        "seconds_per_iteration": total, "cpu_seconds_per_iteration": steady_cpu, "components_s": comps,
        "tokens_per_s": median([p["tokens"] / p["steady_s"] for p in per_iter]),
        "padding_waste": 1 - sum(p["tokens"] for p in per_iter) / max(1, sum(p["padded"] for p in per_iter)),
        "peak_rss_mb": res["peak_rss_mb"], "rss_loaded_mb": res["rss_loaded_mb"],
        "model_gflops_per_s": median([p["flops"] / p["steady_s"] / 1e9 for p in per_iter]),
        "load_average": res["load_average"], "matmul_peak_gflops_worker": res["matmul_peak_gflops"],
    }
    out["mfu"] = out["model_gflops_per_s"] / peak
    names = list(per_iter[0]["step_mfu"])
    for key in ("step_mfu", "step_mfu_cpu", "step_cpu_s", "generate_cpu_s"):
        out[key] = {k: median([p[key][k] for p in per_iter]) for k in names}
    out["step_memory_mb"] = {k: {"before": max(p["step_memory_mb"][k]["before"] for p in per_iter),
                                 "peak": max(p["step_memory_mb"][k]["peak"] for p in per_iter)} for k in names}
    last = res["rows"][-1]
    out["phase_peak_gib"] = {k: a["phase_peak_gib"] for k, a in by_role(last, method, "step").items()}
    out["generate_peak_gib"] = {k: a["peak_gib"] for k, a in by_role(last, method, "generate").items()}
    for key in ("device", "precision", "matmul_peaks", "cuda_peak_gib", "cuda_loaded_gib", "model", "task"):
        out[key] = res.get(key)
    if res.get("matmul_peaks"):
        flops = out["model_gflops_per_s"]
        out["mfu_by_peak"] = {k: flops / v for k, v in res["matmul_peaks"].items()}
        out["step_mfu_by_peak"] = {k: {a: out["step_mfu"][a] * peak / v for a in out["step_mfu"]}
                                   for k, v in res["matmul_peaks"].items()}
    if cory:
        out["exchange_s"] = exchange_s
        out["amortized_s"] = {str(k): steady + exchange_s / k for k in sorted({period, 5})}
        exchange_cpu = median([p["exchange_cpu_s"] for p in per_iter if p["swap_step"]]) if swaps else 0.0
        out["exchange_cpu_s"] = exchange_cpu
        out["amortized_cpu_s"] = {str(k): steady_cpu + exchange_cpu / k for k in sorted({period, 5})}
        out["outside_share"] = (median([p["outside_s"] for p in per_iter]) + exchange_s / period) / total
        out["outside_share_cpu"] = median([p["outside_cpu_s"] / p["steady_cpu_s"] for p in per_iter])
    return out


def targets(summary: dict, raw: dict) -> list[dict]:
    """Each target of the issue next to its figure: wall clock, and CPU seconds of the process (steadier
    than wall clock when other processes share the cores)."""
    rows = []
    cory, ppo, authors = summary.get("cory"), summary.get("ppo"), summary.get("authors")

    def add(target, goal, measured, met):
        rows.append({"target": target, "goal": goal, "measured": measured, "met": bool(met)})

    if cory:
        add("CORY time outside its 2 generations + 2 PPO steps", "< 5%",
            f"{cory['outside_share']:.2%} wall, {cory['outside_share_cpu']:.2%} CPU",
            cory["outside_share"] < TARGETS["outside_share"])
    on_cuda = any(v.get("cuda_peak_gib") is not None for v in summary.values())
    if ppo and on_cuda:  # CPU seconds on CUDA are the host's waiting, and the peak is the precision's own
        wall = ppo["step_mfu"]["policy"]
        add(f"PPO update: model FLOP/s / {ppo['precision']} matmul peak", ">= 60%", f"{wall:.0%} wall",
            wall >= TARGETS["step_mfu"])
    elif ppo:
        wall, cpu = ppo["step_mfu"]["policy"], ppo["step_mfu_cpu"]["policy"]
        add("PPO update: model FLOP/s / fp32 matmul peak", ">= 60%", f"{wall:.0%} wall, {cpu:.0%} CPU",
            wall >= TARGETS["step_mfu"])
    if cory and ppo:
        ratio = cory["seconds_per_iteration"] / ppo["seconds_per_iteration"]
        add("CORY / PPO seconds per iteration", f"<= {TARGETS['cory_over_ppo']}x", f"{ratio:.2f}x",
            ratio <= TARGETS["cory_over_ppo"])
    if cory:
        add("role exchange", "< 50 ms", f"{cory['exchange_s'] * 1e3:.3f} ms", cory["exchange_s"] < TARGETS["exchange_s"])
    if cory and authors:
        for k in authors["amortized_s"]:
            wall = authors["amortized_s"][k] / cory["amortized_s"][k]
            cpu = authors["amortized_cpu_s"][k] / cory["amortized_cpu_s"][k]
            add(f"our CORY vs the authors' loop, swap_period {k}", ">= 1.5x", f"{wall:.2f}x wall, {cpu:.2f}x CPU",
                wall >= TARGETS["speedup"])
    if cory and ppo:
        w = raw["cory"]["weights"]
        # one policy (all its weights) and Adam's two moments per trainable weight, fp32
        budget = (w["total"] + 2 * w["trainable"]) * 4 / 2 ** 20
        # on CUDA the models live on the card: the allocator's peak, not the host's resident memory
        key, scale = ("cuda_peak_gib", 1024) if on_cuda else ("peak_rss_mb", 1)
        extra = (cory[key] - ppo[key]) * scale
        add("peak memory CORY - PPO", f"<= policy + Adam = {budget:.0f} MiB", f"{extra:.0f} MiB", extra <= budget)
    cp, pp = summary.get("cory_peft"), summary.get("ppo_peft")
    if cp and pp:
        extra = cp["peak_rss_mb"] / pp["peak_rss_mb"] - 1
        add("peak memory CORY vs PPO, both use_peft", "< +30%", f"{extra:+.1%}", extra < TARGETS["peft_extra"])
    return rows


def print_table(summary: dict, checks: list[dict], peak: float) -> None:
    first = next(iter(summary.values()))
    print(f"\ndevice {first['device']}, model {first['model']}, task {first['task']}, precision {first['precision']}; "
          f"matmul peak for MFU (that precision's on CUDA, fp32 on a CPU; best in this run): {peak:.1f} GFLOP/s")

    def budget(v):  # `auto` with what it chose per agent at the first step
        used = [f"{a} {n or 'no limit'}" for a, n in (v.get("pass_tokens_used") or {}).items() if n is not None]
        chosen = f" (chose {', '.join(used)})" if v["max_pass_tokens"] == "auto" and used else ""
        return f"{v['max_pass_tokens'] or 'no limit'}{chosen}"

    budgets = ", ".join(f"{k} {budget(v)}" for k, v in summary.items())
    print(f"tokens per PPO forward pass (max_pass_tokens; the authors' loop runs trl's own passes): {budgets}")
    cols = {"pioneer_generate": "pio_gen", "observer_generate": "obs_gen", "generate": "generate", "reward": "reward",
            "pioneer_step": "pio_step", "observer_step": "obs_step", "step": "step", "exchange": "exchange",
            "other": "other"}  # a component -> its column's heading
    print(f"{'variant':<10} {'s/iter':>7} {'CPU s':>7} " + " ".join(f"{head:>8}" for head in cols.values())
          + f" {'tok/s':>6} {'MFU':>4}")
    for name, s in summary.items():
        comps = s["components_s"]
        cells = " ".join(f"{comps[c]:8.2f}" if c in comps else f"{'':>8}" for c in cols)
        print(f"{name:<10} {s['seconds_per_iteration']:7.2f} {s['cpu_seconds_per_iteration']:7.2f} {cells} "
              f"{s['tokens_per_s']:6.1f} {s['mfu']:4.0%}")
    print("\nPPO update, model FLOP/s / matmul peak (wall clock | CPU time):")
    for name, s in summary.items():
        print(f"  {name:<10} " + ", ".join(f"{k} {s['step_mfu'][k]:.0%} | {s['step_mfu_cpu'][k]:.0%}" for k in s["step_mfu"]))
    print("\nmemory, MiB: peak RSS; RSS after loading; per PPO step: RSS before it -> its peak")
    for name, s in summary.items():
        steps = ", ".join(f"{k} {m['before']:.0f} -> {m['peak']:.0f}" for k, m in s["step_memory_mb"].items())
        print(f"  {name:<10} {s['peak_rss_mb']:6.0f}; {s['rss_loaded_mb']:5.0f}; {steps}")
    print("\npeak memory per phase, GiB (CUDA: allocated tensors; CPU: resident), last iteration:")
    for name, s in summary.items():
        gen = ", ".join(f"{k} {v:.2f}" for k, v in s["generate_peak_gib"].items())
        steps = "; ".join(f"{k}: " + ", ".join(f"{ph} {v:.2f}" for ph, v in sorted(m.items()))
                          for k, m in s["phase_peak_gib"].items())
        whole = f"; whole run {s['cuda_peak_gib']:.2f} (weights etc. {s['cuda_loaded_gib']:.2f})" if s.get("cuda_peak_gib") else ""
        print(f"  {name:<10} generate: {gen}; step {steps}{whole}")
    if any(s.get("mfu_by_peak") for s in summary.values()):
        print("\nMFU against each matmul peak measured in the same worker (GFLOP/s: "
              + ", ".join(f"{k} {v:.0f}" for k, v in next(iter(summary.values()))["matmul_peaks"].items()) + "):")
        for name, s in summary.items():
            print(f"  {name:<10} iteration " + ", ".join(f"{k} {v:.0%}" for k, v in s["mfu_by_peak"].items())
                  + "; PPO update " + "; ".join(f"{k}: " + ", ".join(f"{a} {m:.0%}" for a, m in d.items())
                                                 for k, d in s["step_mfu_by_peak"].items()))
    print(f"\n{'target':<52} {'goal':<30} measured")
    for c in checks:
        print(f"{c['target']:<52} {c['goal']:<30} {c['measured']:<28} {'met' if c['met'] else 'NOT met'}")


# ----------------------------------------------------------------------------- the command

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--preset", default="cpu", help="configs/<task>/<method>_<preset>.yaml: any preset the task has "
                   "(tiny, cpu, gpu, paper; default cpu); a hub model in it needs --model, a stand-in, offline")
    p.add_argument("--task", default="imdb", help="imdb, gsm8k or arithmetic: configs/<task>/<method>_<preset>.yaml")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--model", "--model_name", dest="model_name", default=None,
                   help="a model spec instead of the preset's, e.g. random:gpt2-large, random:llama-2-7b")
    p.add_argument("--reward_model", default=None,
                   help="the task's reward instead of the preset's: the paper preset's hub classifier needs a stand-in "
                        "offline, e.g. vader or a local classifier directory (../shared/gpu/stand_ins.py distilbert-imdb)")
    p.add_argument("--dataset", default=None,
                   help="where prompts come from instead of the preset's: the paper preset's hub dataset needs "
                        "builtin (or a local copy) offline; prompts' lengths come from the task, not the source")
    p.add_argument("--precision", default=None, help="auto | fp32 | tf32 | bf16 (default: the preset's)")
    p.add_argument("--advantage_estimator", default=None, help="the learner, gae | rloo | grpo (default: the "
                   "preset's); the authors' loop takes gae only")
    p.add_argument("--num_generations", type=int, default=None, help="answers per prompt, K (rloo and grpo: 2 or "
                   "more; the batch counts answers)")
    p.add_argument("--mini_batch_size", type=int, default=None, help="default: the whole batch in one mini-batch")
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--swap_period", type=int, default=2, help="CORY and the authors' loop (default 2)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--peft_iterations", type=int, default=1, help="iterations of the memory-only LoRA variants")
    p.add_argument("--response_length_min", type=int, default=None)
    p.add_argument("--response_length_max", type=int, default=None)
    p.add_argument("--max_pass_tokens", default=None,
                   help="tokens per PPO forward pass for ppo/cory variants: auto or a number (default: the preset's)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    add_json_flags(p, "write the full results here")
    p.add_argument("--dry_run", action="store_true", help="print each variant's preset, model, precision, batch and "
                   "PPO pass budget as a run would use them, then stop (nothing is loaded)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker_out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.task not in TASKS:
        raise UsageError(f"--task: {args.task!r} is not one of {', '.join(TASKS)}")
    if args.preset not in presets(args.task):
        raise UsageError(f"--preset: {args.preset!r} is not one of {', '.join(presets(args.task))} (configs/{args.task}/)")
    for name, low in (("batch_size", 1), ("iterations", 1), ("warmup", 0), ("swap_period", 1),
                      ("peft_iterations", 1), ("threads", 0)):
        if getattr(args, name) < low:
            raise UsageError(f"--{name}: must be >= {low}, got {getattr(args, name)}")
    if args.max_pass_tokens is not None and args.max_pass_tokens != "auto":
        if not args.max_pass_tokens.isdigit():
            raise UsageError(f"--max_pass_tokens: auto or an integer >= 0, got {args.max_pass_tokens!r}")
        args.max_pass_tokens = int(args.max_pass_tokens)
    if args.device not in ("cpu", "cuda"):
        raise UsageError(f"--device: {args.device!r} is not one of cpu, cuda")
    if args.device == "cuda" and not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA GPU is visible here")
    if args.precision is not None and args.precision not in ("auto", "fp32", "tf32", "bf16"):
        raise UsageError(f"--precision: {args.precision!r} is not one of auto, fp32, tf32, bf16")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise UsageError(f"--variants: {','.join(bad) or 'nothing'} is not a subset of {','.join(VARIANTS)}")
    args.variants = variants
    if "authors" in variants and args.warmup + args.iterations <= args.swap_period:
        raise UsageError(f"--iterations: the authors' loop needs warmup + iterations > swap_period "
                         f"({args.swap_period}) so that an exchange is timed")
    if not args.worker:
        check_configs(args)
        check_json_flags(args, PROGRAM)
    return args


# a field of a worker's config -> the flag of this command that sets it
FLAG_OF_FIELD = {**{f: f"--{f}" for f in ("batch_size", "mini_batch_size", "gradient_accumulation_steps", "seed",
                                          "swap_period", *OVERRIDES)},
                 "model_name": "--model", "steps": "--iterations"}


def as_flags(args, variant: str, message: str) -> UsageError:
    """A config's one-line error about a field, said about the flag that set it (else about the preset)."""
    field, colon, rest = message.partition(":")
    if colon and field in FLAG_OF_FIELD and (field != "model_name" or args.model_name is not None):
        return UsageError(f"{FLAG_OF_FIELD[field]}:{rest}")
    method = "ppo" if variant.startswith("ppo") else "cory"
    return UsageError(f"--preset {args.preset} (configs/{args.task}/{method}_{args.preset}.yaml): {message}")


def check_configs(args) -> None:
    """Each variant's config as its worker builds it, checked by the config's own validation and its model name
    resolved from the disk alone: a bad flag, or flags the config refuses together, is one line before any worker."""
    from cory.assets import model_spec
    from cory.errors import AssetError, ConfigError
    from cory.tasks.registry import check_values
    from iteration_worker import build_cfg

    for variant in args.variants:
        try:
            _, cfg = build_cfg(args, variant, UNUSED_DIR)
            model_spec(cfg.model_name)
            check_values(cfg)  # a dataset or reward the task does not take, --dry_run included
        except (ConfigError, AssetError) as e:
            raise as_flags(args, variant, str(e)) from None


def check_assets(args) -> None:
    """What the workers load, found on this machine offline as they will look for it: the model (a hub id must be in
    the local Hugging Face cache), the task's reward and data, by the training run's own checks (``check_config``)."""
    from cory.assets import HUB, RANDOM_SHAPES, SMOLLM2_SPEC, TINY_SPEC, check_hub_asset
    from cory.errors import AssetError, ConfigError
    from cory.run.preflight import check_config
    from iteration_worker import build_cfg

    os.environ.update(OFFLINE)  # as the workers run
    for variant in args.variants:
        _, cfg = build_cfg(args, variant, UNUSED_DIR)
        try:
            spec = check_config(cfg)
            if spec.kind == HUB:
                stand_in = f"random:{cfg.model_name}" if cfg.model_name in RANDOM_SHAPES else "random:NAME"
                check_hub_asset(cfg.model_name, hint=f"this benchmark runs offline: use a stand-in of its shape "
                                                     f"({stand_in}), {SMOLLM2_SPEC} or {TINY_SPEC}")
        except (ConfigError, AssetError) as e:
            message = str(e)
            if message.startswith("model '"):
                message = f"model_name: {message}"
            raise as_flags(args, variant, message) from None


def run_worker(args, variant: str, folder: Path) -> dict:
    """One variant's worker, its result, log and temporary files in ``folder`` (its TMPDIR). Its one-line error
    comes back as a ChildError; a signal to this command stops it (``harness.stopped_by_signals``)."""
    out, log_path = folder / f"{variant}.json", folder / f"{variant}.log"
    iterations, warmup = ((args.peft_iterations, 0) if variant.endswith("_peft") else (args.iterations, args.warmup))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, "--worker_out", str(out),
           "--preset", args.preset, "--batch_size", str(args.batch_size), "--iterations", str(iterations),
           "--warmup", str(warmup), "--swap_period", str(args.swap_period), "--threads", str(args.threads),
           "--seed", str(args.seed), "--variants", variant, "--task", args.task, "--device", args.device,
           "--gradient_accumulation_steps", str(args.gradient_accumulation_steps)]
    if args.mini_batch_size is not None:
        cmd += ["--mini_batch_size", str(args.mini_batch_size)]
    for field in OVERRIDES:
        if getattr(args, field) is not None:
            cmd += [f"--{field}", str(getattr(args, field))]
    env = {**os.environ, **OFFLINE, "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore",
           "TMPDIR": str(folder)}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU measurement stays on the CPU on a GPU machine
    print(f"running {variant} ...", file=sys.stderr, flush=True)
    with open(log_path, "w") as log:  # a file, not a pipe: nothing to drain while the worker is stopped
        with running(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log) as proc:
            proc.wait()
    output = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        line = child_error(output)
        if line:
            raise ChildError(line, proc.returncode)
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise ChildError(f"error: {variant} failed (exit {proc.returncode}); its last lines:\n{tail}", 1)
    for line in output.splitlines():
        if line.startswith(f"[{variant}]"):
            print(line, file=sys.stderr)
    return json.loads(out.read_text())


def settings(args, variant: str) -> dict:
    """What ``variant`` runs with: the preset's values with this command's flags, as the worker builds them."""
    from cory.device.precision import resolve_precision
    from iteration_worker import authors_cfg, build_cfg

    _, cfg = build_cfg(args, variant, UNUSED_DIR)
    if variant == "authors":
        cfg = authors_cfg(cfg)
    precision, why = resolve_precision(cfg.precision, args.device)
    budget = cfg.max_pass_tokens if variant != "authors" else "trl's own passes"
    if budget == "auto":
        budget = "auto (from the GPU's free memory at the first step)" if args.device == "cuda" else "auto (no limit on a CPU)"
    return {"variant": variant, "preset": args.preset, "task": args.task, "device": args.device,
            "model": cfg.model_name, "reward": cfg.reward_model, "precision": f"{precision} ({why})",
            "max_pass_tokens": budget or "no limit",
            "batch": cfg.batch_size, "mini_batch": cfg.mini_batch_size, "ppo_epochs": cfg.ppo_epochs,
            "learner": cfg.advantage_estimator + (f" K {cfg.num_generations}" if cfg.num_generations > 1 else ""),
            "response_tokens": f"{cfg.response_length_min}-{cfg.response_length_max}"}


def dry_run(args) -> list[str]:
    """One line per variant: the values its figures would be measured at."""
    return [", ".join(f"{k} {v}" for k, v in settings(args, v).items()) for v in args.variants]


def main(argv=None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if not args.worker and not args.dry_run:
            check_assets(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.worker:
        return run_as_worker(args)
    for line in dry_run(args):  # the values every figure below is measured at (auto budgets: measured, below)
        print(line)
    if args.dry_run:
        return 0
    started = time.perf_counter()
    try:
        with stopped_by_signals(), temporary_folder("cory_bench_") as folder:
            raw = {v: run_worker(args, v, folder) for v in args.variants}
    except ChildError as e:
        print(str(e) if str(e).startswith("error: ") else f"error: {e}", file=sys.stderr)
        return e.status
    except Stopped as e:
        return report_stop(e, "its worker was stopped and its temporary folder removed; nothing written")
    peak = max(max(r["matmul_peak_gflops"]) for r in raw.values())
    summary = {v: summarize(r, peak) for v, r in raw.items()}
    checks = targets(summary, raw)
    print_table(summary, checks, peak)
    cpu = cpu_info()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}, load {cpu['load']}")
    report = {"command": PROGRAM + " " + " ".join(sys.argv[1:] if argv is None else argv), "cpu": cpu,
              "matmul_peak_gflops": peak, "wall_s": time.perf_counter() - started, "summary": summary,
              "targets": checks}
    print("\n" + json.dumps({"matmul_peak_gflops": peak, "summary": summary, "targets": checks}, indent=1))
    return save_json(args.json, {**report, "raw": raw}) if args.json else 0


def run_as_worker(args) -> int:
    """``--worker VARIANT``: its measurements into ``--worker_out``; a mistake found only here (a model or data the
    checks could not see) is one line, exit 2 (1 for a run that cannot go on), which the command passes on."""
    from cory.errors import AssetError, ConfigError, RunError

    try:
        result = worker(args)
    except (ConfigError, AssetError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, RunError) else 2
    Path(args.worker_out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
