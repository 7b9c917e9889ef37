"""One variant's iterations, measured in a process of their own: ``benchmarks/iteration.py`` (the command, the
summary and the report; its docstring says what is measured and how FLOPs are counted) starts this module's
``worker`` as ``iteration.py --worker VARIANT`` so that each variant's peak resident memory is its own.

What is measured here: the matmul peaks of this machine, the model's weight counts, resident memory (the kernel's
high-water mark, restarted per phase), and each agent's generation and PPO step (wall and CPU seconds, tokens, the
memory of each phase), over ``--warmup`` + ``--iterations`` iterations of the variant's run.
"""
from __future__ import annotations

import dataclasses
import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# preset fields settable by flag
OVERRIDES = ("response_length_min", "response_length_max", "max_pass_tokens", "precision", "model_name",
             "reward_model", "dataset", "advantage_estimator", "num_generations")


# ----------------------------------------------------------------------------- measurements

# ----------------------------------------------------------------------------- measurements

def matmul_peak_gflops(size: int = 2048, repeats: int = 5, device: str = "cpu", kind: str = "fp32") -> float:
    """GEMM throughput, best of ``repeats``: the machine's practical limit for these models. ``kind``: fp32
    (TF32 off), tf32 (float32 inputs, TF32 tensor cores) or bf16; on a CPU only fp32 is meaningful."""
    import torch

    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    try:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            a @ b
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return 2 * size ** 3 / best / 1e9


def matmul_peaks(device: str) -> dict:
    if device != "cuda":
        from cory.device.precision import native_bf16_cpu

        # bf16 on a CPU that computes it natively (AVX-512 BF16 or AMX); emulated, it is no peak to measure against
        return {"fp32": matmul_peak_gflops(), **({"bf16": matmul_peak_gflops(kind="bf16")} if native_bf16_cpu() else {})}
    return {kind: matmul_peak_gflops(8192, 10, "cuda", kind) for kind in ("fp32", "tf32", "bf16")}


def weight_counts(policy) -> dict:
    """Weights that multiply activations: the transformer's (every linear layer but the LM head) and the
    head's, all and trainable."""
    import torch
    from transformers.pytorch_utils import Conv1D

    lm = policy.pretrained_model
    if hasattr(lm, "get_base_model"):  # peft
        lm = lm.get_base_model()
    head = lm.get_output_embeddings()
    body = [m.weight for m in lm.modules() if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head]
    return {"body": sum(w.numel() for w in body), "head": head.weight.numel(),
            "body_trainable": sum(w.numel() for w in body if w.requires_grad),
            "head_trainable": head.weight.numel() if head.weight.requires_grad else 0,
            "total": sum(p.numel() for p in policy.parameters()),
            "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad)}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


_EARLIER_PEAK = [0.0]  # the highest VmHWM before the last reset (a reset also hides it from getrusage)


def peak_rss_mb() -> float:
    return max(_EARLIER_PEAK[0], window_peak_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def reset_window_peak() -> bool:
    """Restart the kernel's resident-memory high-water mark (VmHWM), to read one phase's own peak."""
    _EARLIER_PEAK[0] = max(_EARLIER_PEAK[0], window_peak_mb())
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def window_peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024




# ----------------------------------------------------------------------------- the worker

def build_cfg(args, variant: str, out_dir: str):
    import importlib

    from cory.config import build, load_yaml

    method = "ppo" if variant.startswith("ppo") else "cory"
    # each script's class holds its task's paper values; the presets list only what they change
    script = importlib.import_module(f"{args.task}_train.{method}")
    base = load_yaml(REPO / "configs" / args.task / f"{method}_{args.preset}.yaml")
    base.update(output_dir=out_dir, batch_size=args.batch_size,
                mini_batch_size=args.batch_size if args.mini_batch_size is None else args.mini_batch_size,  # 0 too
                gradient_accumulation_steps=args.gradient_accumulation_steps, steps=args.warmup + args.iterations,
                seed=args.seed, use_peft=variant.endswith("_peft") or base.get("use_peft", False))
    if method == "cory":
        base.update(swap_period=args.swap_period)
    if base["use_peft"]:  # the IMDB scripts set no LoRA rank: the benchmark's adapters are GSM8K's (r 16, alpha 16)
        base.setdefault("lora_r", 16)
        base.setdefault("lora_alpha", 16)
    for field in OVERRIDES:
        if getattr(args, field) is not None:
            base[field] = getattr(args, field)
    return method, build(script.Hyperparameters, base)


def authors_agent_class():
    from cory.agent import Agent

    class AuthorsAgent(Agent):
        """An agent as the released code has it: trl's stock PPOTrainer and Adam (built with fast_ppo off) and
        trl's list generation in batches of 4, in whatever mode the last step left the model."""

        def generate(self, prompts, **generation_kwargs):
            return self.trainer.generate(prompts, return_prompt=False, **generation_kwargs)

    return AuthorsAgent


def authors_cfg(cfg):
    return dataclasses.replace(cfg, fast_ppo=False, max_pass_tokens=0)


def authors_exchange(run, folder: Path) -> float:
    """The released code's role exchange: both models to disk, then new PPOTrainers on the reloaded copies."""
    from cory import models
    from cory.assets import locate
    from cory.method import CORY

    t0 = time.perf_counter()
    agent_cls = authors_agent_class()
    for name in CORY.agents:
        run.agents[name].policy.save_pretrained(folder / name)
    run.agents.clear()
    gc.collect()
    for name in CORY.agents:
        policy = models.load_policy(locate(str(folder / name)))
        run.agents[name] = agent_cls(name, authors_cfg(run.cfg), policy, run.reference, run.tokenizer)
    return time.perf_counter() - t0


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def phase_memory(trainer, phases: dict):
    """Record the peak memory (GiB; CUDA: allocated tensors, CPU: resident) of each phase of a PPO step into
    ``phases``: for trl's step the rollout pass, the reference pass, the full-vocabulary KL (compute_rewards, while
    the full log-probabilities are alive) and the training passes; for ours (``cory.ppo``) the rollout pass (the
    reference and the KL taken in it) and the training passes. Returns a function that undoes the wrapping."""
    from cory.device import memory

    def record(kind, fn):
        def wrapped(*a, **k):
            memory.reset_peak()
            try:
                return fn(*a, **k)
            finally:
                phases[kind] = max(phases.get(kind, 0.0), memory.peak_gib())
        return wrapped

    import torch

    from cory.ppo import AgentTrainer

    if isinstance(trainer, AgentTrainer):  # ours: the rollout pass (with the reference and the KL), the training
        passes, train_on = trainer._passes, trainer.train_on

        def our_passes(*a, reference=False, **k):
            return record("rollout" if reference else "training", passes)(*a, reference=reference, **k)
        trainer._passes, trainer.train_on = our_passes, record("training", train_on)

        def undo_ours():
            del trainer._passes, trainer.train_on
        return undo_ours
    forward, rewards, minibatch = trainer.batched_forward_pass, trainer.compute_rewards, trainer.train_minibatch

    def batched_forward_pass(model, *a, **k):
        if torch.is_grad_enabled():
            kind = "training"
        elif getattr(trainer, "_in_reference", False) or model is trainer.ref_model or "rollout" in phases:
            kind = "reference"
        else:
            kind = "rollout"
        return record(kind, forward)(model, *a, **k)

    trainer.batched_forward_pass = batched_forward_pass
    trainer.compute_rewards = record("kl", rewards)
    trainer.train_minibatch = record("training", minibatch)

    def undo():
        del trainer.batched_forward_pass, trainer.compute_rewards, trainer.train_minibatch
    return undo


def instrument(run, log: list) -> None:
    """Log each agent's generation and PPO step: wall and CPU seconds, tokens, and memory (resident before the
    step; the peak of the generation, of the step and of each phase of the step). The FLOPs and tokens/s come
    from these counts."""
    from cory.device import memory
    from cory.passes import shared_tokens

    for agent in run.agents.values():
        if getattr(agent, "_instrumented", False):
            continue
        generate, step = agent.generate, agent.step

        def timed_generate(prompts, _generate=generate, _name=agent.name, **generation_kwargs):
            memory.reset_peak()
            w0, c0 = time.perf_counter(), time.process_time()
            out = _generate(prompts, **generation_kwargs)
            _sync()
            log.append({"agent": _name, "phase": "generate", "wall_s": time.perf_counter() - w0,
                        "cpu_s": time.process_time() - c0, "peak_gib": memory.peak_gib()})
            return out

        def timed_step(queries, responses, scores, _step=step, _agent=agent):
            q, r = [len(x) for x in queries], [len(x) for x in responses]
            before = rss_mb()
            reset_window_peak()
            phases = {}
            undo = phase_memory(_agent.trainer, phases)
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                stats = _step(queries, responses, scores)
                _sync()
            finally:
                undo()
            log.append({"agent": _agent.name, "phase": "step", "wall_s": time.perf_counter() - w0,
                        "cpu_s": time.process_time() - c0, "rss_before_mb": before,
                        "rss_peak_mb": max([window_peak_mb()] + [v * 1024 for v in phases.values()]),
                        "phase_peak_gib": phases, "prompt_tokens": sum(q), "response_tokens": sum(r),
                        "sequences": len(q), "shared_prefix_tokens": shared_tokens(queries, packed=True),
                        "padded_tokens": len(q) * max(a + b for a, b in zip(q, r))})
            return stats

        agent.generate, agent.step = timed_generate, timed_step
        agent._instrumented = True


def worker(args) -> dict:
    """The variant's measurements; its run folder (and the authors' loop's saved models) in a temporary folder,
    removed when it ends."""
    tmp = tempfile.mkdtemp(prefix=f"cory_bench_{args.worker}_")
    try:
        return measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepared(cfg, variant: str):
    """The run of ``cfg``, its agents the authors' where ``variant`` is theirs."""
    import numpy as np
    import torch

    from cory.method import CORY
    from cory.train import prepare_run

    run = prepare_run(cfg)
    if variant == "authors":
        agent_cls = authors_agent_class()
        for name in CORY.agents:
            old = run.agents[name]
            run.agents[name] = agent_cls(name, authors_cfg(cfg), old.policy, run.reference, run.tokenizer)
            del old
        # as prepare_run does after building trainers (trl seeds every RNG in its constructor)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
    gc.collect()
    return run


def measure(args, tmp: str) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from cory.device.precision import resolve_precision
    from cory.game import cory_iteration, is_swap_step, ppo_iteration

    variant = args.worker
    method, cfg = build_cfg(args, variant, os.path.join(tmp, "run"))
    t0 = time.perf_counter()
    run = prepared(cfg, variant)
    load_s = time.perf_counter() - t0
    weights = weight_counts(next(iter(run.agents.values())).policy)
    rss_loaded = rss_mb()
    cuda = args.device == "cuda"
    all_peaks = [matmul_peaks(args.device)]
    # MFU against the peak of the precision the run computes in (a CPU's TF32 is fp32)
    kind = resolve_precision(cfg.precision, args.device)[0]
    kind = kind if kind in all_peaks[0] else "fp32"
    peaks = [all_peaks[0][kind]]
    load_avg = [os.getloadavg()[0]]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        loaded_gib = torch.cuda.memory_allocated() / 2 ** 30

    iteration = cory_iteration if method == "cory" else ppo_iteration
    rows, steps_log = [], []
    for step in range(args.warmup + args.iterations):
        steps_log.clear()
        instrument(run, steps_log)
        t0, c0 = time.perf_counter(), time.process_time()
        exchange = exchange_cpu = 0.0
        if variant == "authors" and is_swap_step(step, cfg.swap_period):
            c1 = time.process_time()
            exchange = authors_exchange(run, Path(tmp) / f"exchange_{step}")
            exchange_cpu = time.process_time() - c1
            instrument(run, steps_log)
        batch = run.task.sample(cfg.batch_size)
        row, _ = iteration(step, batch, run.agents, run.rollout, cfg)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        if row is None:
            raise RuntimeError(f"iteration {step} was skipped (non-finite reward)")
        times = {k: v for k, v in row.items() if k.startswith("time/")}
        if variant == "authors":
            times["time/swap_s"] += exchange
        rows.append({"step": step, "warmup": step < args.warmup, "total_s": total, "cpu_s": cpu, "times": times,
                     "exchange_s": exchange, "exchange_cpu_s": exchange_cpu,
                     "swap_step": method == "cory" and is_swap_step(step, cfg.swap_period),
                     "pioneer": row.get("pioneer"), "agents": list(steps_log)})
        print(f"[{variant}] iteration {step}: {total:.1f}s", file=sys.stderr, flush=True)
    cuda_peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
    all_peaks.append(matmul_peaks(args.device))
    peaks.append(all_peaks[-1][kind])
    load_avg.append(os.getloadavg()[0])
    return {"variant": variant, "method": method, "threads": torch.get_num_threads(), "preset": args.preset,
            "batch_size": cfg.batch_size, "ppo_epochs": cfg.ppo_epochs,
            "one_minibatch": cfg.mini_batch_size >= cfg.batch_size, "max_pass_tokens": cfg.max_pass_tokens, "swap_period": getattr(cfg, "swap_period", None),
            "use_peft": cfg.use_peft, "weights": weights, "load_s": load_s, "rss_loaded_mb": rss_loaded,
            "peak_rss_mb": peak_rss_mb(), "matmul_peak_gflops": peaks, "load_average": load_avg, "rows": rows,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "precision": cfg.precision,
            "matmul_peaks": {k: max(p[k] for p in all_peaks) for k in all_peaks[0]},
            "cuda_peak_gib": cuda_peak, "cuda_loaded_gib": loaded_gib if cuda else None,
            "model": cfg.model_name, "task": cfg.task,
            # what `auto` chose at the first step, per agent (0: no limit); the authors' loop runs trl's own passes
            "pass_tokens_used": {name: getattr(agent.trainer, "max_pass_tokens", None)
                                 for name, agent in run.agents.items()}}


