"""Minutes from starting a training script to a learned policy: wall-clock time until the run's own held-out
evaluation (``eval.jsonl``, every ``eval_every`` iterations; the base model at iteration 0) shows a reward
``--gain`` above the base model's.

    python benchmarks/learned.py                                   # PPO, cpu preset, all cores, gain 0.3
    python benchmarks/learned.py --threads 1 --json benchmarks/data/learned_1thread.json
    python benchmarks/learned.py --config configs/imdb/ppo_tiny.yaml --eval_every 1 --gain 0.01   # other flags: the script's

The run writes into a temporary folder this script makes and deletes afterwards; it is stopped (killed, so it
writes no checkpoint) as soon as the gain shows, or after ``--limit_min`` minutes. Printed beside the figure:
the CPU's flags that decide the precision, the load average and the commit, since machines and load differ.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_flags() -> list[str]:
    try:
        words = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return []
    return [f for f in FLAGS if f in words]


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line still being written
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", default="imdb_train/ppo.py")
    p.add_argument("--config", default="configs/imdb/ppo_cpu.yaml")
    p.add_argument("--gain", type=float, default=0.3, help="held-out reward above the base model's (default 0.3)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, all cores)")
    p.add_argument("--limit_min", type=float, default=30.0)
    p.add_argument("--json", default=None, help="also write the result here")
    args, passed = p.parse_known_args(argv)  # anything else goes to the training script
    if not args.gain > 0 or not args.limit_min > 0:
        print(f"error: --gain {args.gain} and --limit_min {args.limit_min} must be > 0", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="cory_learned_"))
    run_dir = tmp / "run"
    cmd = [sys.executable, args.script, "--config", args.config, *passed, "--output_dir", str(run_dir)]
    result = {"command": " ".join(["python", args.script, "--config", args.config, *passed]), "gain": args.gain, "threads": args.threads or
              os.cpu_count(), "cpu_flags": cpu_flags(), "commit": commit(), "rows": []}
    start = time.monotonic()
    log = open(tmp / "log.txt", "w")  # not a pipe: the progress bar would fill it and stall the run
    child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seen = 0
        while child.poll() is None and time.monotonic() - start < args.limit_min * 60:
            rows = read_rows(run_dir / "eval.jsonl")
            for row in rows[seen:]:
                elapsed = time.monotonic() - start
                result["rows"].append({"iterations": row["iterations"], "task_reward": row["task_reward"],
                                       "kl": row["kl"], "seen_after_s": round(elapsed, 1)})
                print(f"{elapsed / 60:6.2f} min  iteration {row['iterations']:3d}  held-out reward "
                      f"{row['task_reward']:.3f}  KL {row['kl']:.2f}", flush=True)
            seen = len(rows)
            base = result["rows"][0]["task_reward"] if result["rows"] else None
            hit = next((r for r in result["rows"] if base is not None and r["task_reward"] >= base + args.gain), None)
            if hit:
                result.update(base_reward=base, learned_at_iteration=hit["iterations"],
                              minutes=round(hit["seen_after_s"] / 60, 2))
                break
            time.sleep(1.0)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        log.close()
        err = (tmp / "log.txt").read_text(errors="replace")
        shutil.rmtree(tmp, ignore_errors=True)  # the folder this script made, nothing else
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if "minutes" not in result:
        result["minutes"] = None
        why = f"the run ended (exit {child.returncode})" if child.returncode not in (None, -signal.SIGKILL) else \
            f"not within {args.limit_min:g} minutes"
        print(f"no held-out reward {args.gain:g} above the base model's: {why}", file=sys.stderr)
        if err.strip():
            print(err.strip().splitlines()[-1][-300:], file=sys.stderr)
    else:
        print(f"learned (held-out reward {args.gain:g} above the base model's {result['base_reward']:.3f}) at "
              f"iteration {result['learned_at_iteration']}, {result['minutes']:.2f} minutes after the start; "
              f"threads {result['threads']}, CPU flags {' '.join(result['cpu_flags']) or 'none of ' + ', '.join(FLAGS)}, "
              f"load average {result['load_average']}, commit {result['commit']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["minutes"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
