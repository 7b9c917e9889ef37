"""Where a finished experiment's runs spent their time, read from what the folder holds (no run, no timing here):
each run's wall time (``runs.json``, its last attempt), its iterations' own timers summed (``metrics.jsonl``:
generation, PPO steps; an iteration's other work, rewards and role exchanges, is under 0.1%) and the remainder
outside the iterations (its held-out evaluations with their transfer readings, loading, saving). Then, per method,
the median shares and the most a run could gain if one part cost nothing: the ceiling any speed-up of that part
alone can reach.

    python benchmarks/run_profile.py results/arithmetic_cpu_horizon [--json benchmarks/data/run_profile_horizon.json]

The CPU the runs ran on is in ``runs.json``'s invocations (``cpu``) since 2026-11-29; for older folders, their
DESIGN.md names the machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from harness import add_json_flags, check_json_flags, run_main, save_json

PROGRAM = "python benchmarks/run_profile.py"
PARTS = ("generation", "steps", "outside iterations")


def parse(argv):
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("folder", help="an experiment folder written by python -m lab.experiments")
    add_json_flags(p)
    args = p.parse_args(argv)
    if not (Path(args.folder) / "runs.json").is_file():
        raise ValueError(f"{args.folder}: no runs.json there; give a folder written by python -m lab.experiments")
    check_json_flags(args, PROGRAM)
    return args


def run_parts(wall: float, rows: list[dict]) -> dict[str, float]:
    """A run's seconds by part: its iterations' timers summed, and its wall time outside them."""
    iterations = sum(r.get("time/iteration_s", 0.0) for r in rows)
    generation = sum(v for r in rows for k, v in r.items() if k.startswith("time/") and k.endswith("generate_s"))
    steps = sum(v for r in rows for k, v in r.items() if k.startswith("time/") and k.endswith("step_s"))
    return {"generation": generation, "steps": steps, "outside iterations": wall - iterations}


def profile(folder: Path) -> dict:
    runs = json.loads((folder / "runs.json").read_text())["runs"]
    out: dict = {"folder": str(folder), "runs": {}, "methods": {}}
    for name, run in sorted(runs.items()):
        finished = [a for a in run.get("attempts", []) if a.get("exit_status") == 0]
        metrics = folder / "runs" / name / "metrics.jsonl"
        if run.get("status") != "finished" or not finished or not metrics.is_file():
            continue
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        wall = finished[-1]["wall_time_s"]
        out["runs"][name] = {"method": run["method"], "wall_s": wall, "iterations": len(rows),
                             **run_parts(wall, rows)}
    for method in sorted({r["method"] for r in out["runs"].values()}):
        mine = [r for r in out["runs"].values() if r["method"] == method]
        share = {part: statistics.median(r[part] / r["wall_s"] for r in mine) for part in PARTS}
        out["methods"][method] = {"runs": len(mine), "median_wall_s": statistics.median(r["wall_s"] for r in mine),
                                  "median_share": share,
                                  "ceiling_if_free": {part: 1 / (1 - s) for part, s in share.items()}}
    return out


def table(doc: dict) -> str:
    lines = ["| run | wall s | " + " | ".join(f"{p} s" for p in PARTS) + " |", "|---" * (2 + len(PARTS)) + "|"]
    for name, r in doc["runs"].items():
        lines.append(f"| {name} | {r['wall_s']:.0f} | " + " | ".join(f"{r[p]:.0f}" for p in PARTS) + " |")
    for method, m in doc["methods"].items():
        lines.append(f"| {method}: median share of {m['runs']} run(s) | {m['median_wall_s']:.0f} | "
                     + " | ".join(f"{m['median_share'][p]:.0%}" for p in PARTS) + " |")
        lines.append(f"| {method}: the run's speed-up were it free | | "
                     + " | ".join(f"{m['ceiling_if_free'][p]:.2f}x" for p in PARTS) + " |")
    return "\n".join(lines)


def measure(args, argv) -> int:
    doc = profile(Path(args.folder))
    if not doc["runs"]:
        print(f"error: {args.folder}: no finished run with its metrics.jsonl", file=sys.stderr)
        return 1
    doc["command"] = " ".join([PROGRAM, *argv])
    print(table(doc))
    return save_json(args.json, doc) if args.json else 0


if __name__ == "__main__":
    sys.exit(run_main(parse, measure))
