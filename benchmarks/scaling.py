"""How a PPO and a CORY iteration's time and peak memory grow with batch size, response length and model
size: benchmarks/iteration.py (variants ppo and cory) over a grid, one table.

    python benchmarks/scaling.py                         # the grid below, about 25 minutes on 2 cores
    python benchmarks/scaling.py --quick                 # tiny preset only, seconds

Rows: the cpu preset (SmolLM2-135M) at batch 8, 16, 32 with the preset's responses (4-15 tokens, one
length per batch), at batch 16 with fixed 8- and 24-token responses, and the tiny preset (3.3M
parameters) at batch 16. Each row is the median of --iterations after --warmup. ``--json`` writes
``{"command": ..., "rows": [one per setting]}``. A signal (Ctrl-C, SIGTERM, SIGHUP) stops the iteration benchmark
running and removes this script's temporary folder; iteration.py's own one-line error comes back as that line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from harness import (ChildError, add_json_flags, check_json_flags, child_error, run_main, running, save_json,
                     temporary_folder)

HERE = Path(__file__).resolve().parent
PROGRAM = "python benchmarks/scaling.py"
GRID = [  # (label, preset, batch, response length min, max)
    ("cpu b8", "cpu", 8, None, None),
    ("cpu b16", "cpu", 16, None, None),
    ("cpu b32", "cpu", 32, None, None),
    ("cpu b16 r8", "cpu", 16, 8, 8),
    ("cpu b16 r24", "cpu", 16, 24, 24),
    ("tiny b16", "tiny", 16, None, None),
]


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="the tiny preset only")
    add_json_flags(p, "write the table's rows here")
    args = p.parse_args(argv)
    for name, low in (("iterations", 1), ("warmup", 0)):  # as iteration.py takes them, before any run starts
        if getattr(args, name) < low:
            raise ValueError(f"--{name}: must be >= {low}, got {getattr(args, name)}")
    check_json_flags(args, PROGRAM)
    return args


def measure(args, label: str, preset: str, batch: int, rmin, rmax, folder: Path) -> dict:
    """One row of the grid: benchmarks/iteration.py's result for it (its --json in ``folder``)."""
    out = folder / f"row{len(list(folder.glob('row*.json')))}.json"
    cmd = [sys.executable, str(HERE / "iteration.py"), "--preset", preset, "--batch_size", str(batch),
           "--iterations", str(args.iterations), "--warmup", str(args.warmup), "--variants", "ppo,cory",
           "--json", str(out)]
    if rmin is not None:
        cmd += ["--response_length_min", str(rmin), "--response_length_max", str(rmax)]
    print(f"{label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    log_path = folder / "log.txt"
    with open(log_path, "w") as log:  # a file, not a pipe: nothing to drain while the run is stopped
        # SIGTERM first: iteration.py stops its worker (SIGKILL after its own 30 s) and removes its folder; a longer
        # grace here, so that a slow stop is not cut short with the worker left running, orphaned
        with running(cmd, grace=90, stdout=subprocess.DEVNULL, stderr=log,
                     env={**os.environ, "TMPDIR": str(folder)}) as proc:
            proc.wait()
    if proc.returncode != 0:
        output = log_path.read_text(errors="replace")
        line = child_error(output)
        if line is not None:  # its refusal, as it said it
            raise ChildError(line, proc.returncode if proc.returncode > 0 else 1)
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise ChildError(f"error: {label}: benchmarks/iteration.py failed (exit {proc.returncode}); its last "
                         f"lines:\n{tail}", 1)
    return json.loads(out.read_text())


def main(argv=None) -> int:
    return run_main(parse, measure_grid, argv, stopped="the iteration benchmark it started was stopped and its "
                    "temporary folder removed; nothing written")


def measure_grid(args, argv: list[str]) -> int:
    rows = []
    try:
        with temporary_folder("cory_scaling_") as folder:
            for label, preset, batch, rmin, rmax in GRID:
                if args.quick and preset != "tiny":
                    continue
                result = measure(args, label, preset, batch, rmin, rmax, folder)
                s = result["summary"]
                rows.append({"label": label, "preset": preset, "batch_size": batch, "response_length": [rmin, rmax],
                             "params": result["raw"]["ppo"]["weights"]["total"],
                             **{f"{m}_s": s[m]["seconds_per_iteration"] for m in ("ppo", "cory")},
                             **{f"{m}_peak_mb": s[m]["peak_rss_mb"] for m in ("ppo", "cory")},
                             **{f"{m}_tokens_per_s": s[m]["tokens_per_s"] for m in ("ppo", "cory")}})
    except ChildError as e:
        print(str(e), file=sys.stderr)
        return e.status
    print(f"\n{'setting':<14}{'params':>9}{'PPO s/it':>10}{'CORY s/it':>11}{'ratio':>7}"
          f"{'PPO MiB':>9}{'CORY MiB':>9}")
    for r in rows:
        print(f"{r['label']:<14}{r['params'] / 1e6:>8.1f}M{r['ppo_s']:>10.2f}{r['cory_s']:>11.2f}"
              f"{r['cory_s'] / r['ppo_s']:>7.2f}{r['ppo_peak_mb']:>9.0f}{r['cory_peak_mb']:>9.0f}")
    return save_json(args.json, {"command": " ".join([PROGRAM, *argv]), "rows": rows}) if args.json else 0


if __name__ == "__main__":
    raise SystemExit(main())
