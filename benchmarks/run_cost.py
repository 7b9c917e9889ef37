"""A run's whole cost at the arithmetic cpu preset, two checkouts paired: its iterations, its held-out evaluations and
everything else (loading, saving), each run a process of its own, the two trees taking turns (A B, then B A) on
one core, and the comparison run's cost (12 iterations, an evaluation every 3) extrapolated from the parts.

    OMP_NUM_THREADS=1 python benchmarks/run_cost.py --before /tmp/ef285e3 --method ppo --steps 2 --eval_every 2 \\
        --pairs 1 --cpu 0 --json benchmarks/data/run_cost_ppo.json

Each run is the training script itself (``arithmetic_train/METHOD.py --config configs/arithmetic/METHOD_cpu.yaml``)
under a wrapper that times every held-out evaluation (``PeriodicEvaluation.__call__``, present in both trees).
The extrapolation: a 12-iteration run with ``eval_every: 3`` is this run's fixed part (wall time less its
iterations and evaluations), its base-model evaluation, 4 evaluations of trained agents at this run's mean and
12 iterations at this run's mean. The runs must also agree: the same training answers (samples.jsonl) and the
same held-out numbers within the equivalence checks' tolerance (1e-4 relative on the KL).
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAM = "python benchmarks/run_cost.py"
FULL_STEPS, FULL_EVAL_EVERY = 12, 3  # results/arithmetic_cpu_comparison's runs
NUMBERS = ("task_reward", "greedy_reward", "kl", "base_logprob", "distinct_2", "response_length")


def child(tree: str, method: str, timings: str, argv: list[str]) -> None:
    """Run ``tree``'s training script in this process, every held-out evaluation's seconds appended to
    ``timings``."""
    sys.path.insert(0, tree)
    os.chdir(tree)
    from cory import heldout

    plain = heldout.PeriodicEvaluation.__call__

    def timed(self, models, iterations):
        t0 = time.perf_counter()
        rows = plain(self, models, iterations)
        with open(timings, "a") as f:
            f.write(json.dumps({"iterations": iterations, "agents": len(models), "seconds":
                                time.perf_counter() - t0}) + "\n")
        return rows

    heldout.PeriodicEvaluation.__call__ = timed
    sys.argv = [f"arithmetic_train/{method}.py", *argv]
    runpy.run_path(f"arithmetic_train/{method}.py", run_name="__main__")


def phases(tree: str, preset: str, problems: int, out: str) -> None:
    """In ``tree``: the parts of a PPO run at the arithmetic ``preset`` that changed, timed one by one, into
    ``out`` (JSON): one training generation (a batch of the preset's prompts), the held-out evaluation of the base
    model (iteration 0) and of a trained-like policy (2% noise on its weights, fixed seed) on the first
    ``problems`` held-out problems. The PPO step is the same code at both commits and is not run."""
    sys.path.insert(0, tree)
    os.chdir(tree)
    import torch

    import arithmetic_train.ppo as script
    from cory.config import build, load_yaml
    from cory.train import prepare_run

    settings = load_yaml(Path(tree) / "configs" / "arithmetic" / f"ppo_{preset}.yaml")
    settings.update(output_dir=tempfile.mkdtemp(prefix="run_cost_phases_"), seed=6, steps=1, eval_every=1)
    t0 = time.perf_counter()
    run = prepare_run(build(script.Hyperparameters, settings))
    doc = {"tree": tree, "load_s": time.perf_counter() - t0}
    run.run_dir.start({}, resume_step=None, overwrite=True, method="ppo")
    evaluation = run.heldout_evaluation()
    evaluation.examples = evaluation.examples[:problems]
    (name, agent), = run.agents.items()
    model = agent.policy.pretrained_model

    def timed(key, fn):
        t = time.perf_counter()
        result = fn()
        doc[f"{key}_s"] = time.perf_counter() - t
        return result

    doc["base_eval"] = timed("base_eval", lambda: evaluation({name: model}, 0))
    batch = run.task.sample(run.cfg.batch_size)
    prompts = run.rollout.prompts(batch)
    torch.manual_seed(0)
    answers = timed("generation", lambda: run.rollout.answer(agent, prompts))
    doc["generation_answers"] = [a.tolist() for a in answers.ids]
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in model.parameters():
            if w.dim() > 1:
                w.add_(0.02 * w.std() * torch.randn(w.shape, generator=noise))
    doc["trained_eval"] = timed("trained_eval", lambda: evaluation({name: model}, 1))
    Path(out).write_text(json.dumps(doc))
    shutil.rmtree(settings["output_dir"], ignore_errors=True)


def one_phases(tree: Path, args, out: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phases", str(tree), args.preset, str(args.problems),
           str(out)]
    if args.cpu is not None:
        cmd = ["taskset", "-c", str(args.cpu), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"error: the phases in {tree} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    doc = json.loads(out.read_text())
    doc.update(wall_s=time.perf_counter() - t0, commit=_git_commit(tree))
    return doc


def phases_agree(a: dict, b: dict) -> dict:
    worst = 0.0
    for key in ("base_eval", "trained_eval"):
        for ra, rb in zip(a[key], b[key]):
            for k in NUMBERS:
                if k in ra:
                    worst = max(worst, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-6))
    return {"same_training_answers": a["generation_answers"] == b["generation_answers"],
            "largest_relative_difference": worst}


def one_run(tree: Path, args, out: Path) -> dict:
    timings = out / "eval_seconds.jsonl"
    argv = ["--config", f"configs/arithmetic/{args.method}_{args.preset}.yaml", "--seed", str(args.seed), "--steps",
            str(args.steps), "--eval_every", str(args.eval_every), "--output_dir", str(out / "run")]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), args.method, str(timings), *argv]
    if args.cpu is not None:
        cmd = ["taskset", "-c", str(args.cpu), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"error: the run in {tree} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    evals = [json.loads(line) for line in timings.read_text().splitlines()]
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    iterations = [m["time/iteration_s"] for m in metrics]
    base = sum(e["seconds"] for e in evals if e["iterations"] == 0)
    trained = [e["seconds"] for e in evals if e["iterations"] > 0]
    fixed = wall - sum(iterations) - base - sum(trained)
    full_evals = FULL_STEPS // FULL_EVAL_EVERY
    return {
        "tree": str(tree), "commit": _git_commit(tree), "wall_s": wall, "iterations_s": iterations,
        "evaluations": evals, "fixed_s": fixed,
        "full_run_estimate_s": fixed + base + full_evals * sum(trained) / max(len(trained), 1)
        + FULL_STEPS * sum(iterations) / len(iterations),
        "eval_rows": [json.loads(line) for line in (out / "run" / "eval.jsonl").read_text().splitlines()],
        "samples": [json.loads(line) for line in (out / "run" / "samples.jsonl").read_text().splitlines()],
    }


def agree(a: dict, b: dict) -> dict:
    """Whether two runs drew the same training answers and read the same held-out numbers."""
    same_samples = a["samples"] == b["samples"]
    worst = 0.0
    for ra, rb in zip(a["eval_rows"], b["eval_rows"]):
        for key in NUMBERS:
            if key in ra:
                worst = max(worst, abs(ra[key] - rb[key]) / max(abs(ra[key]), 1e-6))
    return {"same_training_answers": same_samples, "eval_rows": len(a["eval_rows"]) == len(b["eval_rows"]),
            "largest_relative_difference": worst}


def _git_commit(tree: Path) -> str:
    from harness import git_commit

    return git_commit(tree)


def _cpu() -> dict:
    from harness import cpu_info

    info = cpu_info()
    info["load_before"] = info.pop("load")
    return info


def parse(argv):
    """The flags, checked before any run (a ValueError: the harness's one line, exit 2)."""
    from harness import add_json_flags, check_json_flags

    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--before", required=True, help="a checkout of the baseline (git worktree add /tmp/X COMMIT)")
    p.add_argument("--after", default=str(REPO))
    p.add_argument("--method", choices=("ppo", "cory"), default="ppo")
    p.add_argument("--preset", choices=("cpu", "tiny"), default="cpu", help="tiny: a check of this script")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--eval_every", type=int, default=2)
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--cpu", type=int, default=None, help="pin every run to this core (taskset)")
    p.add_argument("--problems", type=int, default=0, help="instead of whole runs, the changed parts alone "
                   "(generation, base and trained evaluation on this many held-out problems; phases())")
    add_json_flags(p, "where the pairs go, rewritten after each pair (required)")
    args = p.parse_args(argv)
    if args.json is None:
        raise ValueError("--json: required (the file the pairs are written to)")
    for name in ("steps", "eval_every", "pairs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.problems < 0:
        raise ValueError(f"--problems: must be >= 0 (0: whole runs), got {args.problems}")
    if args.cpu is not None and not 0 <= args.cpu < (os.cpu_count() or 1):
        raise ValueError(f"--cpu: no core {args.cpu} here (0 to {(os.cpu_count() or 1) - 1})")
    for side in ("before", "after"):
        tree = Path(getattr(args, side))
        if not (tree / "arithmetic_train" / f"{args.method}.py").is_file():
            raise ValueError(f"--{side}: {tree} is not a checkout of this project (no arithmetic_train/"
                             f"{args.method}.py there)")
    check_json_flags(args, PROGRAM)
    return args


def main(argv=None) -> int:
    from harness import run_main

    return run_main(parse, lambda args, argv: (main_phases if args.problems else main_runs)(args, argv), argv,
                    stopped="the pairs finished before it are in --json")


def main_runs(args, argv) -> int:
    from harness import save_json, temporary_folder

    doc = {"command": " ".join([PROGRAM, *argv]), "cpu": _cpu(), "method": args.method,
           "steps": args.steps, "eval_every": args.eval_every, "seed": args.seed, "pairs": []}
    with temporary_folder("run_cost_") as tmp:
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            pair = {}
            for side in order:
                pair[side] = one_run(Path(getattr(args, side)).resolve(), args, tmp / f"{i}_{side}")
                print(f"pair {i} {side}: {pair[side]['wall_s']:.0f} s, 12-iteration run estimated "
                      f"{pair[side]['full_run_estimate_s']:.0f} s", flush=True)
            pair["agreement"] = agree(pair["before"], pair["after"])
            pair["wall_ratio"] = pair["before"]["wall_s"] / pair["after"]["wall_s"]
            pair["full_run_ratio"] = pair["before"]["full_run_estimate_s"] / pair["after"]["full_run_estimate_s"]
            for side in ("before", "after"):
                pair[side].pop("samples")
            doc["pairs"].append(pair)
            doc["cpu"]["load_after"] = os.getloadavg()
            if save_json(args.json, doc):
                return 1
            print(f"pair {i}: wall {pair['wall_ratio']:.2f}x, 12-iteration run {pair['full_run_ratio']:.2f}x, "
                  f"{pair['agreement']}", flush=True)
    return 0


def main_phases(args, argv) -> int:
    from harness import save_json, temporary_folder

    doc = {"command": " ".join([PROGRAM, *argv]), "cpu": _cpu(), "problems": args.problems, "pairs": []}
    with temporary_folder("run_cost_") as tmp:
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            pair: dict = {}
            for side in order:
                pair[side] = one_phases(Path(getattr(args, side)).resolve(), args, tmp / f"{i}_{side}.json")
                print(f"pair {i} {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in pair[side].items()
                                                       if k.endswith("_s")), flush=True)
            pair["agreement"] = phases_agree(pair["before"], pair["after"])
            pair["ratios"] = {k: pair["before"][k] / pair["after"][k] for k in
                              ("generation_s", "base_eval_s", "trained_eval_s")}
            doc["pairs"].append(pair)
            doc["cpu"]["load_after"] = os.getloadavg()
            if save_json(args.json, doc):
                return 1
            print(f"pair {i}: {pair['ratios']}, {pair['agreement']}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--phases":
        phases(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        raise SystemExit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        raise SystemExit(main())
