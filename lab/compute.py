"""What a run computed in, as its log says: the precision and the CPU's kind (``precision: bf16 (auto on a CPU with
AVX-512 BF16 ...)``, the line every training run prints first; of a run restarted, its last attempt's). ``auto`` picks per CPU, so these are facts of the
machine a run met, not of its config: lab.results names a folder whose runs disagree, and lab.learners sets a cost
against another only among runs that computed alike.
"""
from __future__ import annotations

from pathlib import Path

from cory.run.targets import open_regular


# the CPU's kind as the precision line of a run's log gives it (cory.device.precision.AUTO_ON_CPU's reasons, CUDA's)
_KINDS = (("AVX-512 BF16", "AVX-512 BF16"), ("AMX", "AMX"), ("without native bfloat16", "no native bf16"),
          ("CUDA", "CUDA"), ("as configured", "configured"))


def logged_precision(log: Path) -> tuple[str, str] | None:
    """(precision, why) from the last ``precision:`` line of the run log ``log``: what the run's latest attempt
    computed in. The runner appends every attempt to one log, and an attempt restarted from the beginning throws
    the earlier rows away, so the first line may name a precision no kept row was computed in; a resumed attempt
    prints the precision its checkpoint recorded (``auto, kept from the run's checkpoint``), so the last line is
    the checkpoint's word, and the log is what a committed run keeps (its checkpoints are not committed). None
    where the log or the line is missing, or the log is not a regular file (a pipe is not waited on)."""
    try:
        with open_regular(log, encoding="utf-8", errors="replace") as f:
            line = None
            for ln in f:
                if ln.startswith("precision: "):
                    line = ln
    except OSError:
        return None
    if line is None:
        return None
    precision, _, why = line[len("precision: "):].strip().partition(" ")
    return precision, why


def compute_of(root: Path, label: str, seed: int) -> str:
    """"<precision>, <CPU kind>" from the run's log (logs/<label>/seed_<n>.log, ``logged_precision``: its last
    attempt's line); "?" where the log or the line is missing."""
    said = logged_precision(Path(root) / "logs" / label / f"seed_{seed}.log")
    if said is None:
        return "?"
    precision, why = said
    kind = next((name for key, name in _KINDS if key in why), None)
    return f"{precision}, {kind}" if kind else precision


def mixed_precision_notes(root: Path, seeds: dict[str, list[int]]) -> list[str]:
    """A note where the folder's runs (``seeds``: label -> seeds) computed in different precisions (each run's log
    says which): ``auto`` picks per CPU, so runs of one comparison made on two machines can differ without a word in
    their configs. No note where they agree or a log says nothing."""
    by_precision: dict[str, list[str]] = {}
    for label, run_seeds in sorted(seeds.items()):
        for seed in run_seeds:
            compute = compute_of(root, label, seed)
            if compute != "?":
                by_precision.setdefault(compute.split(",")[0], []).append(f"{label}/seed_{seed}")
    if len(by_precision) > 1:
        parts = [f"{precision} in {', '.join(keys) if len(keys) <= 3 else f'{len(keys)} runs'}"
                 for precision, keys in sorted(by_precision.items(), key=lambda kv: -len(kv[1]))]
        return ["The runs computed in different precisions (each run's log): " + "; ".join(parts) + ". `auto` "
                "picks per CPU (bf16 on AVX-512 BF16 without AMX), so runs made on two machines differ; a "
                "comparison pins it (`--set precision=fp32`) or says why not."]
    return []
