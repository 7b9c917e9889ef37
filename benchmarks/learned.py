"""Minutes from starting a training script to a learned policy: wall-clock time until the run's own held-out
evaluation (``eval.jsonl``, every ``eval_every`` iterations; the base model at iteration 0) shows a reward
``--gain`` above the base model's.

    python benchmarks/learned.py                                   # PPO, cpu preset, all cores, gain 0.3
    python benchmarks/learned.py --threads 1 --json benchmarks/data/learned_1thread.json
    python benchmarks/learned.py --config configs/imdb/ppo_tiny.yaml --eval_every 1 --gain 0.01   # other flags: the script's

The run writes into a temporary folder this script makes and deletes afterwards; it is stopped (killed, so it
writes no checkpoint) as soon as the gain shows, or after ``--limit_min`` minutes; a signal to this script (Ctrl-C,
SIGTERM, SIGHUP) kills the run and deletes the folder as well. Printed beside the figure: the CPU's flags that decide
the precision, the load average and the commit, since machines and load differ. A training script's own one-line
refusal (a flag it does not take) comes back as that line, with its exit status.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import (Stopped, add_json_flags, check_json_flags, child_error, cpu_info, git_commit, report_stop,
                     running, save_json, stopped_by_signals, temporary_folder)

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = "python benchmarks/learned.py"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_flags() -> list[str]:
    words = set(cpu_info()["flags"])
    return [f for f in FLAGS if f in words]


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


def is_learned_result(path: Path) -> bool:
    """A result this benchmark wrote before it recorded its own command ("benchmark"): the training command, the
    gain, the CPU's flags and the held-out rows (benchmarks/data/learned_ppo_cpu_2cores.json)."""
    if not path.is_file():  # reading a named pipe would wait for a writer forever
        return False
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and {"command", "gain", "cpu_flags", "rows"} <= set(doc)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This benchmark's flags and the training script's (the flags it does not know), or ValueError with the one
    line naming the bad flag, before the run starts."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", default="imdb_train/ppo.py", help="the training script (a path from the repository "
                   "root, where it runs)")
    p.add_argument("--config", default="configs/imdb/ppo_cpu.yaml")
    p.add_argument("--gain", type=float, default=0.3, help="held-out reward above the base model's (default 0.3)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, all cores)")
    p.add_argument("--limit_min", type=float, default=30.0)
    add_json_flags(p, "also write the result here")
    args, passed = p.parse_known_args(argv)  # anything else goes to the training script
    if not args.gain > 0 or not math.isfinite(args.gain):
        raise ValueError(f"--gain: must be a number > 0, got {args.gain}")
    if not args.limit_min > 0 or not math.isfinite(args.limit_min):
        raise ValueError(f"--limit_min: must be a number of minutes > 0, got {args.limit_min}")
    if args.threads < 0:
        raise ValueError(f"--threads: must be >= 0 (0: torch's default), got {args.threads}")
    if not (ROOT / args.script).is_file():
        raise ValueError(f"--script: {args.script} is not a file (a path from the repository root, {ROOT}, where it "
                         "runs)")
    # a result written before this benchmark recorded its own command may be replaced without --force
    check_json_flags(args, PROGRAM, key="benchmark",
                     force=args.json is not None and is_learned_result(Path(args.json)))
    return args, passed


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, passed = parse(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    result = {"command": " ".join(["python", args.script, "--config", args.config, *passed]),
              "benchmark": " ".join([PROGRAM, *argv]), "gain": args.gain,
              "threads": args.threads or os.cpu_count(), "cpu_flags": cpu_flags(), "commit": git_commit(), "rows": []}
    try:
        with stopped_by_signals(), temporary_folder("cory_learned_") as tmp:
            child, err = watch(args, passed, env, tmp, result)
    except Stopped as e:
        return report_stop(e, "the training run it started was stopped and its temporary folder removed; "
                              "nothing written")
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if "minutes" not in result:
        line = child_error(err) if child.returncode not in (0, -signal.SIGKILL) else None
        if line:  # the training script refused what it was given: its one line, its status
            print(line, file=sys.stderr)
            return child.returncode if child.returncode > 0 else 1
        result["minutes"] = None
        why = (f"the run ended (exit {child.returncode})" if child.returncode not in (None, -signal.SIGKILL) else
               f"not within {args.limit_min:g} minutes")
        print(f"no held-out reward {args.gain:g} above the base model's: {why}", file=sys.stderr)
        if err.strip():
            print(err.strip().splitlines()[-1][-300:], file=sys.stderr)
    else:
        print(f"learned (held-out reward {args.gain:g} above the base model's {result['base_reward']:.3f}) at "
              f"iteration {result['learned_at_iteration']}, {result['minutes']:.2f} minutes after the start; "
              f"threads {result['threads']}, CPU flags {' '.join(result['cpu_flags']) or 'none of ' + ', '.join(FLAGS)}, "
              f"load average {result['load_average']}, commit {result['commit']}")
    if args.json and save_json(args.json, result):
        return 1
    return 0 if result["minutes"] is not None else 1


def watch(args, passed: list[str], env: dict, tmp: Path, result: dict) -> tuple[subprocess.Popen, str]:
    """Start the training run into ``tmp``/run (its own session, so that stopping it stops all it started) and read
    its held-out rows into ``result`` until the gain shows, the run ends or the time is up; then kill it (no
    checkpoint is written). Returns the run's process and its output."""
    run_dir = tmp / "run"
    cmd = [sys.executable, args.script, "--config", args.config, *passed, "--output_dir", str(run_dir)]
    start = time.monotonic()
    with open(tmp / "log.txt", "w") as log:  # not a pipe: the progress bar would fill it and stall the run
        # killed when the block ends: the run and whatever it started, at once
        with running(cmd, group=True, grace=0, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                     start_new_session=True) as child:
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
                hit = next((r for r in result["rows"] if base is not None and r["task_reward"] >= base + args.gain),
                           None)
                if hit:
                    result.update(base_reward=base, learned_at_iteration=hit["iterations"],
                                  minutes=round(hit["seen_after_s"] / 60, 2))
                    break
                time.sleep(1.0)
    return child, (tmp / "log.txt").read_text(errors="replace")


if __name__ == "__main__":
    sys.exit(main())
