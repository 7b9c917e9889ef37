"""Generation levers: transformers' static KV cache and torch.compile of the decoding step, against the
dynamic cache a run uses today, over a sequence of calls shaped like a run's.

    python benchmarks/generation.py --model embedded:smollm2-135m --batch_size 32 --new_tokens 64 --calls 5
    python benchmarks/generation.py --model tiny --batch_size 4 --new_tokens 8 --calls 3      # smoke check
    # on a GPU (GSM8K's shapes: batch 32, 256-token answers; IMDB's: batch 256, 4-15 tokens)
    python benchmarks/generation.py --device cuda --model random:llama-1b --batch_size 32 --new_tokens 256
    python benchmarks/generation.py --device cuda --model random:gpt2-large --batch_size 256 \
        --prompt_tokens 2,8 --new_tokens 4,15 --calls 20

Each call samples one batch as a run does (top_k 0, top_p 1, answers of the drawn length: EOS is held off
until then), on left-padded random prompts whose lengths are drawn afresh each call, so the shapes change
from call to call as they do between iterations. The same seed gives every variant the same prompts:

    dynamic          transformers' default cache on the left-padded batch (what runs used until cory.generation)
    shared_prefix    the dynamic cache, the beginning every prompt shares read once for the batch
                     (``cory.generation``: what runs use; with ``--shared_tokens 0`` the same call as dynamic)
    static           cache_implementation "static", compilation off
    static_compile   the static cache with the decoding step compiled (transformers' auto-compile; on a CPU
                     its CompileConfig is forced onto the CPU)

Reported per variant: the first call (compilation included), the median of the later calls, the slowest later
call (a recompilation for a new shape shows there), tokens per second, peak memory, the total for a run of
--run_calls generations (first + (n - 1) x median) against dynamic's, and a greedy check: the share of
greedy tokens equal to the dynamic cache's on the first prompts.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from harness import add_json_flags, check_json_flags, run_main, save_json
from cory.config import PPOArgs  # imports nothing heavy: the checks stay before any model

PROGRAM = "python benchmarks/generation.py"

VARIANTS = ("dynamic", "shared_prefix", "static", "static_compile")
PRECISIONS = PPOArgs.__dataclass_fields__["precision"].metadata["choices"]


def int_range(text: str, name: str) -> tuple[int, int]:
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--{name}: {text!r} is not N or MIN,MAX (whole numbers)") from None
    lo, hi = (parts[0], parts[0]) if len(parts) == 1 else parts if len(parts) == 2 else (0, -1)
    if not 1 <= lo <= hi:
        raise ValueError(f"--{name}: {text!r} must be N or MIN,MAX with 1 <= MIN <= MAX")
    return lo, hi


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--model", default="embedded:smollm2-135m", help="a model spec, e.g. tiny, embedded:smollm2-135m, "
                                                                     "random:llama-1b")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", default="tf32", help="fp32, tf32 or bf16 (bf16: autocast, as runs generate)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--prompt_tokens", default="60,160", help="prompt length, N or MIN,MAX drawn per call")
    p.add_argument("--new_tokens", default="256", help="answer length, N or MIN,MAX drawn per call")
    p.add_argument("--shared_tokens", type=int, default=0, help="every prompt begins with the same this many tokens "
                   "(GSM8K's and arithmetic's one-shot example), counted in --prompt_tokens")
    p.add_argument("--calls", type=int, default=5, help="generations per variant (the first compiles)")
    p.add_argument("--run_calls", type=int, default=200, help="generations in the run the totals are for "
                                                               "(100 iterations x 2 agents for CORY)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    add_json_flags(p)
    args = p.parse_args(argv)
    args.prompt_tokens = int_range(args.prompt_tokens, "prompt_tokens")
    args.new_tokens = int_range(args.new_tokens, "new_tokens")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        if v not in VARIANTS:
            raise ValueError(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"--device: {args.device!r} is not one of cpu, cuda")
    if args.precision not in PRECISIONS:
        raise ValueError(f"--precision: {args.precision!r} is not one of {', '.join(PRECISIONS)}")
    for name in ("batch_size", "calls", "run_calls"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    check_json_flags(args, PROGRAM)
    args.spec = model(args.model)
    return args


def model(name: str):
    """``--model`` resolved as a run resolves its model (``cory.assets``), before anything loads: a spec that names
    no model, a folder without a model, a hub id neither cached nor reachable is one line."""
    from cory.assets import HUB, RANDOM_SHAPES, SMOLLM2_SPEC, TINY_SPEC, check_hub_asset, model_spec
    from cory.errors import AssetError

    try:
        spec = model_spec(name, "--model")
        if spec.kind == HUB:
            stand_in = f"random:{name}" if name in RANDOM_SHAPES else "random:NAME"
            check_hub_asset(name, hint=f"download it, or use a stand-in of its shape ({stand_in}), {SMOLLM2_SPEC} "
                                       f"or {TINY_SPEC}")
    except AssetError as e:
        message = str(e)
        raise ValueError(message if message.startswith("--model") else f"--model: {message}") from None
    return spec


def batches(args, vocab: int, pad: int, eos: int):
    """(input_ids, attention_mask, new_tokens) per call, left-padded as trl pads, the same for every variant."""
    import torch

    g = torch.Generator().manual_seed(args.seed)
    out = []
    for _ in range(args.calls):
        lengths = torch.randint(args.prompt_tokens[0], args.prompt_tokens[1] + 1, (args.batch_size,), generator=g)
        width = int(lengths.max())
        ids = torch.full((args.batch_size, width), pad, dtype=torch.long)
        mask = torch.zeros((args.batch_size, width), dtype=torch.long)
        shared = torch.randint(0, vocab, (args.shared_tokens,), generator=g)
        for i, n in enumerate(lengths.tolist()):
            tokens = torch.randint(0, vocab, (n,), generator=g)
            tokens[:args.shared_tokens] = shared[:n]
            tokens[tokens == eos] = (eos + 1) % vocab
            ids[i, width - n:] = tokens
            mask[i, width - n:] = 1
        new = int(torch.randint(args.new_tokens[0], args.new_tokens[1] + 1, (1,), generator=g))
        out.append((ids, mask, new))
    return out


def variant_kwargs(variant: str, device: str) -> dict:
    from transformers import CompileConfig

    if variant in ("dynamic", "shared_prefix"):
        return {}
    if variant == "static":
        return dict(cache_implementation="static", disable_compile=True)
    config = CompileConfig()
    if device == "cpu":
        config._compile_all_devices = True  # transformers auto-compiles only on accelerators
        config.mode = "default"  # "reduce-overhead" means CUDA graphs
    return dict(cache_implementation="static", compile_config=config)


def timed_calls(generate, calls: list, variant: str, sync) -> tuple[list[float], int, list[int]]:
    """Each call's batch sampled by ``variant``, timed: (seconds per call, tokens sampled, new tokens per call)."""
    from tqdm.auto import tqdm

    times, tokens, steps = [], 0, []
    for ids, mask, new in tqdm(calls, desc=variant, unit="call", leave=False):
        sync()
        t0 = time.perf_counter()
        out = generate(variant, ids, mask, new, do_sample=True, top_k=0, top_p=1.0)
        sync()
        times.append(time.perf_counter() - t0)
        tokens += out.numel()
        steps.append(new)
    return times, tokens, steps


def variant_result(times: list[float], tokens: int, steps: list[int], run_calls: int, peak_gib: float | None,
                   greedy_equal: float | None) -> dict:
    """One variant's figures from its calls' seconds: the first call (compilation, cache allocation) apart from
    the later ones, a run's total of ``run_calls`` calls, and a decoding step's time for the whole batch (prompt
    reading included) after the first call."""
    later, later_steps = times[1:] or times, steps[1:] or steps
    return {"first_call_s": times[0], "median_call_s": statistics.median(later), "slowest_later_call_s": max(later),
            "calls_s": times, "tokens_per_s": tokens / sum(times),
            "run_total_s": times[0] + (run_calls - 1) * statistics.median(later),
            "peak_gib": peak_gib, "greedy_equal_to_dynamic": greedy_equal,
            "ms_per_new_token": 1000 * sum(later) / sum(later_steps)}


def print_variant(variant: str, r: dict, run_calls: int) -> None:
    print(f"{variant:>15}: first {r['first_call_s']:.2f} s, median {r['median_call_s']:.2f} s, slowest later "
          f"{r['slowest_later_call_s']:.2f} s, {r['tokens_per_s']:.0f} tok/s, {run_calls} calls "
          f"{r['run_total_s']:.0f} s, {r.get('ms_per_new_token', 0):.1f} ms/token" + (f", peak {r['peak_gib']:.1f} GiB" if r["peak_gib"] else "")
          + (f", greedy equal {r['greedy_equal_to_dynamic']:.0%}" if r["greedy_equal_to_dynamic"] is not None
             else ""), flush=True)


def compare_with_dynamic(variants: dict) -> None:
    """Each variant's speed-up over the dynamic cache (what runs use), per median call and over a whole run."""
    base = variants["dynamic"]
    for r in variants.values():
        r["median_speedup_vs_dynamic"] = base["median_call_s"] / r["median_call_s"]
        r["run_speedup_vs_dynamic"] = base["run_total_s"] / r["run_total_s"]
    print("vs dynamic (median call / whole run): " + ", ".join(
        f"{v} {r['median_speedup_vs_dynamic']:.2f}x / {r['run_speedup_vs_dynamic']:.2f}x" for v, r in variants.items()))


def main(argv=None) -> int:
    return run_main(parse, measure, argv)


def measure(args, argv: list[str]) -> int:
    import torch

    from cory import models
    from cory.assets import locate
    from cory.device.precision import precision_context, resolve_precision, set_precision
    from cory.errors import AssetError
    from cory.generation import generate_from_shared_prefix

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA GPU here", file=sys.stderr)
        return 2
    set_precision(args.precision)
    args.precision = resolve_precision(args.precision, args.device)[0]
    try:
        spec = locate(args.spec)  # the offline models built once into the cache
    except AssetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tokenizer = models.load_tokenizer(spec)
    model = models.load_causal_lm(spec).to(args.device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    calls = batches(args, model.config.vocab_size, pad, tokenizer.eos_token_id)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def generate(variant, ids, mask, new, **sampling):
        with torch.inference_mode(), precision_context(args.precision, args.device):
            if variant == "shared_prefix":
                prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
                out, width = generate_from_shared_prefix(model, prompts, pad, max_new_tokens=new, min_new_tokens=new,
                                                         pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
                                                         **sampling)
                return out[:, width:].cpu()
            return model.generate(input_ids=ids.to(args.device), attention_mask=mask.to(args.device),
                                  max_new_tokens=new, min_new_tokens=new, pad_token_id=pad,
                                  eos_token_id=tokenizer.eos_token_id, **sampling,
                                  **variant_kwargs(variant, args.device))[:, ids.shape[1]:].cpu()

    results = {"command": " ".join([PROGRAM, *argv]), "model": args.model, "device": args.device, "precision": args.precision,
               "batch_size": args.batch_size, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
               "calls": args.calls, "shared_tokens": args.shared_tokens, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "variants": {}}
    greedy = {}
    for variant in args.variants:
        torch._dynamo.reset()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(args.seed)
        times, tokens, steps = timed_calls(generate, calls, variant, sync)
        ids, mask, _ = calls[0]
        greedy[variant] = generate(variant, ids[:4], mask[:4], min(args.new_tokens[1], 32), do_sample=False)
        peak = torch.cuda.max_memory_allocated() / 2 ** 30 if args.device == "cuda" else None
        equal = float((greedy[variant] == greedy["dynamic"]).float().mean()) if "dynamic" in greedy else None
        results["variants"][variant] = variant_result(times, tokens, steps, args.run_calls, peak, equal)
        print_variant(variant, results["variants"][variant], args.run_calls)
    if "dynamic" in results["variants"]:
        compare_with_dynamic(results["variants"])
    return save_json(args.json, results) if args.json else 0


if __name__ == "__main__":
    raise SystemExit(main())
