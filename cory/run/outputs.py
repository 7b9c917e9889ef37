"""A run's folder, its files only: what a run writes (and so all that ``--overwrite`` deletes), the manifest, the
lock, resolved config, metrics and samples (JSON lines), atomic checkpoints and their data-only loader. Whether a
run may start, resume, continue or overwrite there is decided in ``cory.run.run_rules``.

The checks made before any model loads (``cory.run.preflight``, ``cory.run.run_rules``, the command line's ``--help`` and
``--print_config``) read run folders through this module, so torch is imported only inside the functions that save
or load checkpoints: those checks stay quick and torch-free."""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import tempfile
import time
import warnings
from pathlib import Path

import yaml

from cory.run import final as final_models
from cory.errors import ConfigError
from cory.method import AGENT_NAMES
from cory.run.targets import TEMPORARY
from cory.tasks import registered

CHECKPOINTS = "checkpoints"
DIGESTS = "weight_digests.json"
LOCK = ".cory.lock"
# the experiment runner's pid, in the environment of the runs it starts: a run whose parent is no longer that
# process stops after its iteration, checkpointed, as on SIGTERM (the runner may die by SIGKILL, which it cannot
# pass on)
RUNNER_PID = "CORY_RUNNER_PID"


MANIFEST = "cory_run.json"
# What a run writes, down to each file: --overwrite deletes these and nothing else, and refuses when anything
# else is there (a user's notes inside final/ are as much theirs as beside it).
OWN_FINAL_EVALUATION = "final_evaluation.json"  # the run's own evaluation of its final models (cory.heldout)
RUN_FILES = frozenset({"config.yaml", "metrics.jsonl", "samples.jsonl", "eval.jsonl", MANIFEST, OWN_FINAL_EVALUATION,
                       ".config.yaml.tmp", ".metrics.jsonl.tmp", ".samples.jsonl.tmp", ".eval.jsonl.tmp",
                       ".cory_run.json.tmp", f".{OWN_FINAL_EVALUATION}.tmp"})
LOGGER_DIRS = frozenset({"wandb", "tensorboard"})  # written by the loggers, whole
CHECKPOINT_FILES = frozenset({f"{name}.pt" for name in AGENT_NAMES} | {"state.pt"})
_CHECKPOINT = re.compile(r"step_(\d{6,})")
_CHECKPOINT_TMP = re.compile(r"\.tmp_step_\d{6,}_\w+")
# what save_pretrained writes for a causal LM and its tokenizer (weights whole or in shards)
_MODEL_FILE = re.compile(r"(generation_)?config\.json|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors"
                         r"\.index\.json|pytorch_model(-\d{5}-of-\d{5})?\.bin|pytorch_model\.bin\.index\.json|"
                         r"tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|"
                         r"vocab\.(json|txt)|merges\.txt|spiece\.model|chat_template\.(jinja|json)")


def _is_eval_file(name: str) -> bool:
    """lab.evaluate's results beside a run: eval_<task>.json, or eval_<task>_<protocol>.json for another
    protocol than training's, of a registered task (and the temporary file of one being written)."""
    temporary = TEMPORARY.fullmatch(name)
    name = temporary["name"] if temporary else name.removesuffix(".tmp")
    return any(name == f"eval_{task}{'' if protocol == 'training' else '_' + protocol}.json"
               for task, spec in registered().items() for protocol in spec.evaluation.protocols)


def _kind(rel: tuple[str, ...], is_dir: bool) -> str | None:
    """How a path inside a run folder (its parts, relative) counts: "ours" (written by a run, whole), "walk"
    (a run's folder, whose entries count one by one) or None (not a run's)."""
    name, depth = rel[-1], len(rel)
    if depth == 1:
        if is_dir:
            if final_models.TMP.fullmatch(name):  # a final/ being written, or the one it replaced: whole
                return "ours"
            return "walk" if name in (CHECKPOINTS, "final") else ("ours" if name in LOGGER_DIRS else None)
        return "ours" if name in RUN_FILES or name == LOCK or _is_eval_file(name) else None
    if rel[0] == CHECKPOINTS:
        if depth == 2:
            return "walk" if is_dir and (_CHECKPOINT.fullmatch(name) or _CHECKPOINT_TMP.fullmatch(name)) else None
        return "ours" if depth == 3 and not is_dir and name in CHECKPOINT_FILES else None
    if depth == 2:  # in final/
        if is_dir:
            return "walk" if name in AGENT_NAMES else None
        return "ours" if name in (DIGESTS, final_models.MARKER) else None
    return "ours" if depth == 3 and not is_dir and _MODEL_FILE.fullmatch(name) else None


def scan_run_dir(root: Path, rel: tuple[str, ...] = ()) -> tuple[list[tuple[Path, str]], list[Path]]:
    """([(path, "ours" | "walk")], [foreign paths]) in a run folder; a run's folder comes after its entries."""
    ours, foreign = [], []
    for entry in sorted(root.iterdir()):
        is_dir = entry.is_dir() and not entry.is_symlink()
        kind = _kind(rel + (entry.name,), is_dir)
        if kind == "walk":
            inner, strange = scan_run_dir(entry, rel + (entry.name,))
            ours += inner
            foreign += strange
            ours.append((entry, kind))
        elif kind == "ours":
            ours.append((entry, kind))
        else:
            foreign.append(entry)
    return ours, foreign


def _remove(path: Path, kind: str) -> None:
    """Delete one entry a run wrote; a run's folder only once empty, so whatever else is in it stays."""
    if kind == "walk":
        with contextlib.suppress(OSError):
            path.rmdir()
    elif path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_checkpoint(folder: Path) -> None:
    for name in CHECKPOINT_FILES:
        (folder / name).unlink(missing_ok=True)
    _remove(folder, "walk")


def checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(completed iterations, folder) of every complete checkpoint, oldest first: only the project's own names
    (``step_000003``) count, and only fully written folders are ever renamed into place."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.fullmatch(p.name))]
    return sorted((step, p) for step, p in found if p.is_dir() and not p.is_symlink() and (p / "state.pt").is_file())


def linked_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The entries of the run's checkpoints folder under a checkpoint's name that are symbolic links, by name:
    ``checkpoints`` passes over them, and a save under that name would write through the link."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _CHECKPOINT.fullmatch(p.name) and p.is_symlink())


def read_manifest(run_dir: str | os.PathLike) -> dict | None:
    """The marker a run writes when it starts (``{"project": "cory", "method", "task", "folder"}``), or None."""
    try:
        data = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("project") == "cory" else None


def folder_id(path: str | os.PathLike) -> int:
    """What tells a folder from a copy of it: its inode number, which a copy (``cp -r``, a git clone, a move to
    another file system) does not keep and a rename within the file system does. A run's manifest records it."""
    return os.stat(path).st_ino


def written_here(run_dir: str | os.PathLike) -> bool:
    """The run in ``run_dir`` was made in this folder: its manifest records this folder, not the one it was copied or
    cloned from. A committed results/ folder's rows are results no command here wrote (and git keeps no weights)."""
    return (read_manifest(run_dir) or {}).get("folder") == folder_id(run_dir)


def evaluations(run_dir: str | os.PathLike) -> list[Path]:
    """lab.evaluate's results beside a run (``eval_<task>.json``)."""
    return sorted(p for p in Path(run_dir).iterdir() if p.is_file() and _is_eval_file(p.name))


def run_folder_of(path: str | os.PathLike) -> Path | None:
    """The run folder ``path`` would be written in: the nearest folder above it (as given, or with its links
    resolved) that holds a run's manifest or lock; None when there is none."""
    path = Path(path).absolute()
    for start in (path, path.resolve()):
        for folder in start.parents:
            if read_manifest(folder) is not None or (folder / LOCK).is_file():
                return folder
    return None


class RunLock:
    """One writer per run folder: an exclusive ``flock`` on ``.cory.lock`` in it, which the system drops when the
    holder ends, killed or not, so no lock outlives its run. The file names the holder for the refusal."""

    def __init__(self, run_dir: str | os.PathLike, name: str = "output_dir", holder: str = "run"):
        self.run_dir = Path(run_dir)
        self.name, self.holder = name, holder  # for the refusal: the flag, and what else writes there
        self.path = self.run_dir / LOCK
        self._file = None  # a file object: dropped unreleased, it closes and the lock goes with it
        self._created = False

    def acquire(self) -> "RunLock":
        self._created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            _flock_past_probes(f)
        except BlockingIOError:
            f.close()
            raise ConfigError(in_use(self.run_dir, self.name, self.holder)
                              or f"{self.name}: {self.run_dir} is locked by another process") from None
        except OSError as e:  # a file system without locks: say so, and go on as before locks existed
            warnings.warn(f"{self.name}: cannot lock {self.path} ({e.strerror}); make sure no other run writes "
                          f"{self.run_dir}")
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": shlex.join(sys.argv),
                  "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        f.truncate(0)
        f.write(json.dumps(holder) + "\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        """Unlock; a folder this run created and left holding nothing but the lock goes too."""
        if self._file is None:
            return
        if self.run_dir.is_dir() and all(p.name == LOCK for p in self.run_dir.iterdir()):
            self.path.unlink(missing_ok=True)
            if self._created:
                with contextlib.suppress(OSError):
                    self.run_dir.rmdir()
        self._file.close()
        self._file = None


PROBE_GRACE_S = 1.0  # how long taking a lock waits out other processes' probes (``in_use``), which take it shared


def _flock_past_probes(f) -> None:
    """An exclusive lock on ``f``, retried for ``PROBE_GRACE_S``: a probe holds a shared lock for microseconds, and
    a data-parallel run's processes all probe at start, so one failed try is not yet another writer; a run's lock is
    held for its whole life, so it still refuses."""
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def in_use(run_dir: Path, name: str = "output_dir", holder: str = "run") -> str | None:
    """The refusal when another process holds ``run_dir``'s lock, else None; takes nothing. The probe takes the
    lock shared, so that two probes at once (a data-parallel run's processes, each checking its folder) do not each
    see the other as a writer, as an exclusive probe did."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        try:
            h = json.loads(os.read(fd, 65536))
            who = f"pid {h['pid']} on {h['host']}, started {h['started']}: {h['command'][:160]}"
        except (ValueError, KeyError, TypeError):
            who = "starting"
        return (f"{name}: {run_dir} is being written by another {holder} ({who}); wait for it to end or stop it, "
                f"or choose another {name}")
    except OSError:  # no locks on this file system: nothing to learn
        return None
    finally:
        os.close(fd)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint (see ``checkpoints``), or None."""
    done = checkpoints(run_dir)
    return done[-1][1] if done else None


def _numpy_globals() -> list:
    """What numpy arrays and scalars unpickle with (the random generators' states, some optimizer scalars)."""
    import numpy as np
    from numpy._core.multiarray import _reconstruct, scalar

    return [np.ndarray, np.dtype, _reconstruct, scalar, *{type(np.dtype(c)) for c in "?bBhHiIlLqQefd"}]


def check_checkpoint_file(path: Path) -> None:
    """``path`` holds data only (tensors, plain values, numpy arrays): reads its pickle, not its tensors, and
    runs nothing. A file that would build any other object when loaded, e.g. call a function, is refused."""
    import torch

    if path.stat().st_size == 0:
        raise ConfigError(f"resume: {path} is empty (0 bytes; a save cut short or a disk that filled up); move "
                          f"{path.parent} aside to resume from an older checkpoint, or start again with --overwrite")
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as e:  # not a torch zip file: cut or damaged on disk
        raise ConfigError(f"resume: {path} cannot be read ({type(e).__name__}: not a complete checkpoint); move "
                          f"{path.parent} aside to resume from an older one, or start again with --overwrite"
                          ) from None
    allowed = {f"{g.__module__}.{g.__name__}" for g in _numpy_globals()}
    code = sorted(set(found) - allowed)
    if code:
        raise ConfigError(f"resume: {path} was not written by this project: loading it would call {code[0]}, "
                          "which could run any code, so it is not loaded; resume only runs you trust")


def check_saveable(obj, what: str) -> None:
    """``obj`` goes into a checkpoint and comes back through ``load_checkpoint_file``: saved once to a temporary
    file and read with the same check, before a run trains, so that its checkpoints do not turn out unreadable at
    the resume. A ConfigError names ``what`` and the object the loader would refuse."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.pt"
        try:
            torch.save(obj, path)
        except Exception as e:  # noqa: BLE001 - anything pickle refuses, said in one line
            raise ConfigError(f"{what} cannot be saved in a checkpoint ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); return plain values") from None
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    allowed = {f"{g.__module__}.{g.__name__}" for g in _numpy_globals()}
    code = sorted(set(found) - allowed)
    if code:
        raise ConfigError(f"{what} holds a {code[0]}, which the checkpoint loader refuses (it loads data only: "
                          "numbers, strings, lists, dicts, tensors, numpy arrays), so the run could never be "
                          "resumed; return plain values")


def load_checkpoint_file(path: Path):
    """A checkpoint file's contents, loaded as data only (``torch.load(weights_only=True)``)."""
    import torch

    check_checkpoint_file(path)
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        raise ConfigError(f"resume: {path} cannot be read ({type(e).__name__}); move {path.parent} aside to resume "
                          "from an older checkpoint, or start again with --overwrite") from None


def json_safe(value):
    """JSON-safe scalars: numpy/torch numbers to float, non-finite to None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
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
        self.eval_path = self.path / "eval.jsonl"  # held-out evaluations during the run (eval_every)

    def start(self, cfg_dict: dict, *, resume_step: int | None, overwrite: bool, method: str = "") -> None:
        if not self.enabled:
            return
        if overwrite and self.path.exists():
            for entry, kind in scan_run_dir(self.path)[0]:
                if entry.name != LOCK:  # held by this run
                    _remove(entry, kind)
        self.path.mkdir(parents=True, exist_ok=True)
        if read_manifest(self.path) is None:
            # the folder's id tells the run's files from those of a copy (copied_run)
            _atomic_write(self.path / MANIFEST, json.dumps({"project": "cory", "method": method,
                                                            "task": cfg_dict.get("task"),
                                                            "folder": folder_id(self.path)}) + "\n")
        saved = {k: v for k, v in cfg_dict.items() if k not in ("resume", "overwrite")}
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
        if resume_step is not None:
            # held-out evaluations of the final models describe models this run is about to replace
            for entry in self.path.iterdir():
                if entry.is_file() and (_is_eval_file(entry.name) or entry.name == OWN_FINAL_EVALUATION):
                    entry.unlink()
            # rows logged after the checkpoint are redone by the resumed run: drop them, keep the rest
            for p in (self.metrics_path, self.samples_path):
                _truncate_jsonl(p, resume_step)
            # its rows count completed iterations; the one at the checkpoint was written before it was saved, and
            # a run starting again from iteration 0 evaluates its base model again
            _truncate_jsonl(self.eval_path, resume_step + 1 if resume_step else 0, key="iterations")
            # a save cut short by a kill leaves its temporary folder behind
            final_models.remove_unfinished(self.path)
            root = self.path / CHECKPOINTS
            for tmp in root.iterdir() if root.is_dir() else ():
                if _CHECKPOINT_TMP.fullmatch(tmp.name) and tmp.is_dir() and not tmp.is_symlink():
                    remove_checkpoint(tmp)

    def log_metrics(self, row: dict) -> None:
        self._append(self.metrics_path, [row])

    def log_samples(self, rows: list[dict]) -> None:
        self._append(self.samples_path, rows)

    def log_eval(self, rows: list[dict]) -> None:
        self._append(self.eval_path, rows)

    def write_own_final_evaluation(self, doc: dict) -> None:
        if self.enabled:
            _atomic_write(self.path / OWN_FINAL_EVALUATION, json.dumps(json_safe(doc)) + "\n")

    def _append(self, path: Path, rows: list[dict]) -> None:
        if not self.enabled or not rows:
            return
        with open(path, "a") as f:
            for row in rows:
                f.write(json.dumps(json_safe(row)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def save_checkpoint(self, step: int, write, keep: int | None) -> Path | None:
        """``write(folder)`` fills a temporary folder that is renamed to ``step_N`` when complete; then only the newest
        ``keep`` checkpoints stay (None: every one)."""
        if not self.enabled:
            return None
        root = self.path / CHECKPOINTS
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step_{step:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp_step_{step:06d}_", dir=root))
        try:
            write(tmp)
            if final.exists():
                remove_checkpoint(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                remove_checkpoint(tmp)
        older = [p for _, p in checkpoints(self.path) if p != final]
        for p in older[: max(0, len(older) - (keep - 1))] if keep is not None else []:
            remove_checkpoint(p)
        return final


    def drop_checkpoints(self) -> tuple[int, list[Path]]:
        """Delete the run's checkpoint files (``keep_resume_checkpoint: false``, once final/ is written): in each
        folder of a checkpoint's name (``step_N``, or one being written), the files of a checkpoint's names that are
        regular files; then each folder left empty. Links are neither followed nor deleted, and a user's file (any
        other name, a folder such as ``step_best``) stays, with its folder. Returns (bytes freed, what was left)."""
        root = self.path / CHECKPOINTS
        if not self.enabled or root.is_symlink() or not root.is_dir():
            return 0, [root] if self.enabled and root.is_symlink() else []
        freed, left = 0, []
        for folder in sorted(root.iterdir()):
            if (not (_CHECKPOINT.fullmatch(folder.name) or _CHECKPOINT_TMP.fullmatch(folder.name))
                    or folder.is_symlink() or not folder.is_dir()):
                left.append(folder)
                continue
            for name in sorted(CHECKPOINT_FILES):
                path = folder / name
                with contextlib.suppress(FileNotFoundError):
                    st = path.lstat()
                    if stat.S_ISREG(st.st_mode):
                        path.unlink()
                        freed += st.st_size
            left += sorted(folder.iterdir())
            _remove(folder, "walk")  # only once empty
        _remove(root, "walk")
        return freed, left


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _truncate_jsonl(path: Path, first_dropped_step: int, key: str = "step") -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write (or damaged: a byte that is not UTF-8)
        if row.get(key, -1) < first_dropped_step:
            kept.append(line)
    _atomic_write(path, "".join(line + "\n" for line in kept))


class Rows(list):
    """The rows of a JSON-lines file, with ``unreadable``: how many of its lines did not parse as a JSON object."""

    unreadable: int = 0


def read_jsonl(path: str | os.PathLike) -> Rows:
    """The rows of a JSON-lines file (a missing file has none). A line that does not parse, e.g. the last line of a
    run killed mid-write, is skipped and counted in ``rows.unreadable``. The one reader of the project's
    metrics, samples and evaluations."""
    path = Path(path)
    rows = Rows()
    if not path.is_file():
        return rows
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            rows.unreadable += 1
    return rows
