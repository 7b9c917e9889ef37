"""A run's folder: resolved config, metrics and samples (JSON lines), atomic checkpoints."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import yaml

from cory.config import ConfigError

CHECKPOINTS = "checkpoints"


MANIFEST = "cory_run.json"
# what a run writes into its folder: --overwrite deletes these and nothing else
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "samples.jsonl", CHECKPOINTS, "final", MANIFEST, ".config.yaml.tmp",
               ".metrics.jsonl.tmp", ".samples.jsonl.tmp", "wandb")


def _ours(entry: Path) -> bool:
    return entry.name in RUN_ENTRIES or (entry.name.startswith("eval_") and entry.suffix == ".json")


def read_manifest(run_dir: str | os.PathLike) -> dict | None:
    """The marker a run writes when it starts (``{"project": "cory", "method", "task"}``), or None."""
    try:
        data = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("project") == "cory" else None


def check_writable(path: Path, name: str = "output_dir") -> None:
    """``path`` (a file or folder to be written, created with its parents if need be) can be written: its
    nearest existing ancestor is a folder we may write in. ``name`` is the field or flag to blame."""
    path = Path(path).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if existing == path:  # already there: a file is replaced within its folder, a folder is written into
        folder = path if path.is_dir() else path.parent
    elif not existing.is_dir():
        raise ConfigError(f"{name}: {path} would be inside {existing}, which is a file, not a folder")
    else:
        folder = existing
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}: cannot write in {folder} (permission denied); choose another place")


def check_output_dir(output_dir: str, *, resume: bool, overwrite: bool) -> None:
    """Refuse to touch an existing run unless asked to, and anything but a run at all; writes nothing."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output_dir: {output_dir} exists and is not a folder")
    check_writable(path)
    if resume:  # without a complete checkpoint the run starts again from iteration 0, in the same folder
        return
    if not path.is_dir() or not any(path.iterdir()):
        return
    if not overwrite:
        raise ConfigError(f"output_dir: {output_dir} already holds files; pass --resume {output_dir} to continue "
                          f"the run there or --overwrite to replace it")
    # --overwrite deletes only what a run of this project wrote, in a folder that says it is one
    if read_manifest(path) is None:
        raise ConfigError(f"output_dir: {output_dir} is not a run folder of this project (no {MANIFEST}); "
                          "--overwrite only replaces runs, choose another output_dir")
    foreign = sorted(p.name for p in path.iterdir() if not _ours(p))
    if foreign:
        raise ConfigError(f"output_dir: {output_dir} also holds files no run writes ({', '.join(foreign[:3])}); "
                          "--overwrite would delete them, so it refuses: move them or choose another output_dir")


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint: only fully written folders are ever renamed into place."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and (p / "state.pt").is_file())
    return done[-1] if done else None


def _clean(value):
    """JSON-safe scalars: numpy/torch numbers to float, non-finite to None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDir:
    """Writes only from the main process; the other ranks get a RunDir with ``enabled=False``."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self.metrics_path = self.path / "metrics.jsonl"
        self.samples_path = self.path / "samples.jsonl"

    def start(self, cfg_dict: dict, *, resume_step: int | None, overwrite: bool, method: str = "") -> None:
        if not self.enabled:
            return
        if overwrite and self.path.exists():  # check_output_dir made sure it holds only what a run writes
            for entry in self.path.iterdir():
                if _ours(entry):
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
        if read_manifest(self.path) is None:
            _atomic_write(self.path / MANIFEST, json.dumps({"project": "cory", "method": method,
                                                            "task": cfg_dict.get("task")}) + "\n")
        saved = {k: v for k, v in cfg_dict.items() if k not in ("resume", "overwrite")}
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
        if resume_step is not None:
            # rows logged after the checkpoint are redone by the resumed run: drop them, keep the rest
            for p in (self.metrics_path, self.samples_path):
                _truncate_jsonl(p, resume_step)
            # a save cut short by a kill leaves its temporary folder behind
            for tmp in (self.path / CHECKPOINTS).glob(".tmp_step_*"):
                shutil.rmtree(tmp, ignore_errors=True)

    def log_metrics(self, row: dict) -> None:
        self._append(self.metrics_path, [row])

    def log_samples(self, rows: list[dict]) -> None:
        self._append(self.samples_path, rows)

    def _append(self, path: Path, rows: list[dict]) -> None:
        if not self.enabled or not rows:
            return
        with open(path, "a") as f:
            for row in rows:
                f.write(json.dumps(_clean(row)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def save_checkpoint(self, step: int, write, keep: int) -> Path | None:
        """``write(folder)`` fills a temporary folder that is renamed to ``step_N`` when complete."""
        if not self.enabled:
            return None
        root = self.path / CHECKPOINTS
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step_{step:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp_step_{step:06d}_", dir=root))
        try:
            write(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        older = sorted(p for p in root.glob("step_*") if p.is_dir() and p != final)
        for p in older[: max(0, len(older) - (keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
        return final


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _truncate_jsonl(path: Path, first_dropped_step: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
        if row.get("step", -1) < first_dropped_step:
            kept.append(line)
    _atomic_write(path, "".join(line + "\n" for line in kept))


def read_jsonl_rows(path: str | os.PathLike) -> tuple[list[dict], int]:
    """The rows of a JSON-lines file that parse (a kill can cut the last line), and how many lines did not; a
    missing file has none. What the experiment runner and the reports read a run's metrics with."""
    path = Path(path)
    rows, bad = [], 0
    if not path.is_file():
        return rows, bad
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every row of a JSON-lines file this project wrote whole (a line that does not parse is an error)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
