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


def check_output_dir(output_dir: str, *, resume: bool, overwrite: bool) -> None:
    """Refuse to touch an existing run unless asked to; writes nothing."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output_dir: {output_dir} exists and is not a folder")
    if resume:
        if latest_checkpoint(path) is None:
            raise ConfigError(f"resume: no complete checkpoint in {output_dir}/{CHECKPOINTS}")
        return
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(
            f"output_dir: {output_dir} already holds a run; pass --resume {output_dir} to continue it "
            f"or --overwrite true to replace it")
    if overwrite and path.is_dir() and any(path.iterdir()) and not (path / "config.yaml").is_file():
        # --overwrite deletes the folder: only ever a run folder (every run writes config.yaml first)
        raise ConfigError(f"output_dir: {output_dir} is not a run folder (no config.yaml); "
                          f"--overwrite only replaces runs, choose another output_dir")


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

    def start(self, cfg_dict: dict, *, resume_step: int | None, overwrite: bool) -> None:
        if not self.enabled:
            return
        if overwrite and self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
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


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
