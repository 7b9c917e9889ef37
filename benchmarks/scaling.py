"""How a PPO and a CORY iteration's time and peak memory grow with batch size, response length and model
size: benchmarks/iteration.py (variants ppo and cory) over a grid, one table.

    python benchmarks/scaling.py                         # the grid below, about 25 minutes on 2 cores
    python benchmarks/scaling.py --quick                 # tiny preset only, seconds

Rows: the cpu preset (SmolLM2-135M) at batch 8, 16, 32 with the preset's responses (4-15 tokens, one
length per batch), at batch 16 with fixed 8- and 24-token responses, and the tiny preset (3.3M
parameters) at batch 16. Each row is the median of --iterations after --warmup.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRID = [  # (label, preset, batch, response length min, max)
    ("cpu b8", "cpu", 8, None, None),
    ("cpu b16", "cpu", 16, None, None),
    ("cpu b32", "cpu", 32, None, None),
    ("cpu b16 r8", "cpu", 16, 8, 8),
    ("cpu b16 r24", "cpu", 16, 24, 24),
    ("tiny b16", "tiny", 16, None, None),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="the tiny preset only")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = []
    for label, preset, batch, rmin, rmax in GRID:
        if args.quick and preset != "tiny":
            continue
        out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
        cmd = [sys.executable, str(HERE / "iteration.py"), "--preset", preset, "--batch_size", str(batch),
               "--iterations", str(args.iterations), "--warmup", str(args.warmup), "--variants", "ppo,cory",
               "--json", out]
        if rmin is not None:
            cmd += ["--response_length_min", str(rmin), "--response_length_max", str(rmax)]
        print(f"{label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        result = json.loads(Path(out).read_text())
        Path(out).unlink()
        s = result["summary"]
        rows.append({"label": label, "preset": preset, "batch_size": batch, "response_length": [rmin, rmax],
                     "params": result["raw"]["ppo"]["weights"]["total"],
                     **{f"{m}_s": s[m]["seconds_per_iteration"] for m in ("ppo", "cory")},
                     **{f"{m}_peak_mb": s[m]["peak_rss_mb"] for m in ("ppo", "cory")},
                     **{f"{m}_tokens_per_s": s[m]["tokens_per_s"] for m in ("ppo", "cory")}})
    print(f"\n{'setting':<14}{'params':>9}{'PPO s/it':>10}{'CORY s/it':>11}{'ratio':>7}"
          f"{'PPO MiB':>9}{'CORY MiB':>9}")
    for r in rows:
        print(f"{r['label']:<14}{r['params'] / 1e6:>8.1f}M{r['ppo_s']:>10.2f}{r['cory_s']:>11.2f}"
              f"{r['cory_s'] / r['ppo_s']:>7.2f}{r['ppo_peak_mb']:>9.0f}{r['cory_peak_mb']:>9.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
