"""Record what training produces, to hold a change of the PPO step to the same numbers (issue 26).

    python tests/record_step.py            # writes tests/data/step_record.json
    python tests/record_step.py bf16       # the same runs in bfloat16: tests/data/step_record_bf16.json

Runs, in this process, tiny PPO and CORY (3 iterations) and the embedded-model PPO and CORY at batch 8 (2
iterations), and keeps each run's metrics rows (times and memory aside) and, per final model, the norm of its
weight update and the update's projections onto fixed random directions (a 135M-weight update cannot be stored
whole; a relative difference of the updates shows as the same relative difference of the projections).
tests/test_step_record.py runs the same and compares.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RECORD = REPO / "tests" / "data" / "step_record.json"
RECORD_BF16 = REPO / "tests" / "data" / "step_record_bf16.json"  # made with AVX-512 BF16 kernels (no AMX)


def kernel_family(flags) -> str:
    """Which bfloat16 kernels a CPU with these flags runs: "amx" (AMX tiles), "avx512_fp16" (AVX-512 BF16 and FP16
    without AMX, oneDNN's AVX512_CORE_FP16 level: an Intel Xeon), "avx512_bf16" (AVX-512 BF16 alone: an AMD EPYC), or
    "emulated". bf16 numbers repeat within a family and differ across them (other instructions, other summation
    orders): the embedded PPO's first reward was 0.0519 on the Xeon against the EPYC's 0.0616."""
    flags = set(flags)
    if "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_fp16" if "avx512_fp16" in flags else "avx512_bf16"
    return "emulated"


def bf16_record_path(family: str):
    """Where the bf16 record of a kernel family lives (the first one, AVX-512 BF16's, keeps its old name)."""
    return RECORD_BF16 if family == "avx512_bf16" else RECORD_BF16.with_name(f"step_record_bf16_{family}.json")
DIRECTIONS = 8
# (name, script, config, extra flags): explicit values, so the record does not follow later preset changes (the
# precision default became auto, the cpu CORY preset's score_norm false, after the record was made)
CPU = {"steps": 2, "batch_size": 8, "mini_batch_size": 8, "learning_rate": 1e-4, "reward_model": "vader", "eval_every": 0}
RUNS = [
    ("tiny_ppo", "ppo", "configs/imdb/ppo_tiny.yaml", {"steps": 3, "precision": "fp32"}),
    ("tiny_cory", "cory", "configs/imdb/cory_tiny.yaml", {"steps": 3, "precision": "fp32"}),
    ("cpu_ppo", "ppo", "configs/imdb/ppo_cpu.yaml", {**CPU, "precision": "fp32"}),
    ("cpu_cory", "cory", "configs/imdb/cory_cpu.yaml", {**CPU, "precision": "fp32", "score_norm": True}),
]
# the same runs computing in bfloat16 (precision: bf16, what auto picks on a CPU with native bf16), recorded apart
BF16_RUNS = [(f"{name}_bf16", method, config, {**over, "precision": "bf16"}) for name, method, config, over in RUNS]


def script_class(method: str, task: str = "imdb"):
    """The training script's config class (its paper values), as a user edits it."""
    import importlib

    return importlib.import_module(f"{task}_train.{method}").Hyperparameters


def projections(update: torch.Tensor, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(DIRECTIONS):
        u = torch.randn(update.numel(), generator=g, dtype=torch.float32)
        out.append(float((u / u.norm()).double() @ update.double()))
    return out


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for _, p in sorted(model.state_dict().items())])


def record_run(method: str, config: str, over: dict, out: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from cory.assets import locate, model_spec
    from cory.config import build, load_yaml
    from cory.models import load_causal_lm
    from cory.run.outputs import read_jsonl
    from cory.train import prepare_run

    values = load_yaml(REPO / config)
    values.update(over, output_dir=str(out))
    cfg = build(script_class(method), values)
    prepare_run(cfg).fit()
    rows = [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))}
            for r in read_jsonl(out / "metrics.jsonl")]
    base = flat(load_causal_lm(locate(model_spec(cfg.model_name))))
    models = {}
    for agent in sorted(p.name for p in (out / "final").iterdir() if p.is_dir()):
        update = flat(AutoModelForCausalLM.from_pretrained(out / "final" / agent)) - base
        models[agent] = {"update_norm": float(update.norm()), "projections": projections(update)}
    return {"rows": rows, "models": models}


def main() -> None:
    """``python tests/record_step.py [bf16]``: the float32 record, or with ``bf16`` the bfloat16 one."""
    import subprocess

    bf16 = sys.argv[1:] == ["bf16"]
    runs, path = (BF16_RUNS, bf16_record_path(kernel_family(cpu_flags()))) if bf16 else (RUNS, RECORD)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {"commit": commit, "runs": {}}
    if bf16:
        record["cpu_flags"] = cpu_flags()
    with tempfile.TemporaryDirectory() as tmp:
        for name, method, config, over in runs:
            record["runs"][name] = record_run(method, config, over, Path(tmp) / name)
            print(f"recorded {name}", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


def cpu_flags() -> list[str]:
    """The CPU's bfloat16-relevant flags (a record in bf16 depends on the kernels these select)."""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return sorted(words & {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"})


if __name__ == "__main__":
    main()
