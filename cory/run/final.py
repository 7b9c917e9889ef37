"""A run's final models (``RUN/final/<agent>/``) and the evaluations that score them.

final/ is written whole or not at all: the models go into a temporary folder beside it (``.final_tmp_*``), which is
renamed to ``final`` once complete, so a save cut short (a kill, a full disk) never leaves a final/ that counts as a
finished run's. With them goes ``final/cory_final.json``: the size of every file written (a final/ whose files no
longer have them, e.g. a copy cut short, is not whole, and ``--resume`` writes it again from the last checkpoint),
and the digest of its contents (``contents_id``): an evaluation
(``lab.evaluate``'s ``eval_<task>.json``, the run's own ``final_evaluation.json``) records the digest of the
weights it scored, and the runner and the report take an evaluation whose digest is not that of final/'s contents
any more (a ``--resume`` has since replaced the models, or a hand copied others over them) as stale, not as the
final models' result.

Torch-free: the runner and the report read run folders through this module."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

FINAL = "final"
MARKER = "cory_final.json"   # in final/: {"project": "cory", "iterations": N, "id": "sha256:<hex>", "files": {path: bytes}}
TMP = re.compile(r"\.final_(tmp|old)_\w+")  # a final/ being written, or the one it replaces
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
RECORD = "final_weights"     # the key of an evaluation's record of the weights it scored


def write_final(run_dir: Path, iterations: int, write: Callable[[Path], None]) -> Path:
    """``write(folder)`` fills a temporary folder in ``run_dir`` with the final models; it gets its id and is then
    renamed to ``run_dir/final``, replacing the one before (moved aside first, deleted after)."""
    final = run_dir / FINAL
    tmp = Path(tempfile.mkdtemp(prefix=".final_tmp_", dir=run_dir))
    old = None
    try:
        write(tmp)
        marker = {"project": "cory", "iterations": iterations, "id": contents_id(tmp), "files": _file_sizes(tmp)}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        if final.is_dir() and not final.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=".final_old_", dir=run_dir))
            os.replace(final, old / FINAL)
        os.rename(tmp, final)
    finally:
        for leftover in (tmp, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return final


def remove_unfinished(run_dir: Path) -> None:
    """The temporary folders of a final/ whose save was cut short (and of the one it was replacing)."""
    for entry in Path(run_dir).iterdir():
        if TMP.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _file_sizes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _sizes_hold(final: Path) -> bool:
    """Every file final/'s marker lists is there with the size it was written with (a final/ written before the
    marker listed them passes)."""
    try:
        files = json.loads((final / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return True
    if not isinstance(files, dict):
        return True
    for name, size in files.items():
        try:
            if (final / name).stat().st_size != size:
                return False
        except (OSError, ValueError):
            return False
    return True


def _has_weights(model_dir: Path) -> bool:
    return (model_dir / "config.json").is_file() and any((model_dir / n).is_file() for n in WEIGHT_FILES)


def final_complete(run_dir: str | os.PathLike, agents: tuple[str, ...] | list[str] | None = None) -> bool:
    """``run_dir/final`` holds whole models: every model folder (each of ``agents`` when given) with its config and
    weights, each file of the size it was written with. (A final/ written by ``write_final`` does until a file of it
    is damaged; one written before may have been cut short.)"""
    final = Path(run_dir) / FINAL
    if not final.is_dir():
        return False
    if agents is None:
        agents = [d.name for d in final.iterdir() if d.is_dir()]
    return bool(agents) and all(_has_weights(final / name) for name in agents) and _sizes_hold(final)


def final_iterations(run_dir: str | os.PathLike) -> int | None:
    """The iterations done by the models in ``run_dir/final``, as its marker records them; None without one."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        done = json.loads((Path(run_dir) / FINAL / MARKER).read_text()).get("iterations")
        return done if isinstance(done, int) and not isinstance(done, bool) else None
    return None


def final_weights_id(run_dir: str | os.PathLike) -> str | None:
    """Which weights ``run_dir/final`` holds now (``contents_id``); None when there is no final/. An evaluation
    records it (``RECORD``)."""
    final = Path(run_dir) / FINAL
    return contents_id(final) if final.is_dir() else None


def contents_id(final: Path) -> str:
    """``sha256:`` and a digest of the contents of every file in the folder ``final`` but its marker (names and
    bytes), so that weights replaced by others, of the same size or with the marker kept, are other weights."""
    h = hashlib.sha256()
    for path in sorted(p for p in final.rglob("*") if p.is_file() and p != final / MARKER):
        h.update(f"{path.relative_to(final)}\0{_cached_digest(path)}\n".encode())
    return "sha256:" + h.hexdigest()


def _legacy_id(final: Path) -> str:
    """What evaluations recorded before the digest: the id drawn when final/ was written (kept by a copy, and by
    weights replaced under it), or for a final/ older than ids, its files' names, sizes and modification times."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        marker = json.loads((final / MARKER).read_text())
        if isinstance(marker.get("id"), str):
            return marker["id"]
    h = hashlib.sha256()
    for path in sorted(p for p in final.rglob("*") if p.is_file()):
        st = path.stat()
        h.update(f"{path.relative_to(final)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "files:" + h.hexdigest()[:32]


# (device, inode, size, mtime, ctime) -> sha256: a file is read once per process, however often its id is asked
# (the report asks for every evaluation); a file changed since has another ctime, which no one can set
_DIGESTS: dict[tuple, str] = {}


def _cached_digest(path: Path) -> str:
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)
    return _DIGESTS[key]


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (hex): what a checkpoint's state.pt records of each agent file beside it (and what a
    resume checks them by, ``run_rules.check_one_checkpoint``)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_evaluation(path: Path) -> dict | None:
    """An evaluation's document, or None when the file cannot be read as one (cut short, damaged)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    results = doc.get("results", []) if isinstance(doc, dict) else None
    return doc if isinstance(results, list) and all(isinstance(r, dict) for r in results) else None


def stale(run_dir: str | os.PathLike, doc: dict) -> bool:
    """The evaluation ``doc`` beside ``run_dir`` scored other weights than its final/ holds now. An evaluation that
    records none (written before they were recorded, e.g. a committed one) or a run without final/ (git keeps no
    weights; deleted to save space) cannot be checked, and is trusted."""
    recorded = doc.get(RECORD)
    if not isinstance(recorded, str):
        return False
    if not recorded.startswith("sha256:"):  # recorded before the digest: checked as it was then
        final = Path(run_dir) / FINAL
        return final.is_dir() and _legacy_id(final) != recorded
    current = final_weights_id(run_dir)
    return current is not None and current != recorded
