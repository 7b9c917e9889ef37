"""One run of an experiment: what its folder already holds (``pair_state``), the command that trains it, the
process that runs it (``execute``, with ``Children`` passing a stop signal on), and ``runs.json``'s record of it
(``Record``). ``lab.experiments`` plans the runs and drives them through these."""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cory.config import load_yaml
from cory.errors import ConfigError
from cory.run.final import final_complete
from lab.design import DESIGN_DIGEST, design_digest
from cory.run.outputs import LOCK, MANIFEST, RUNNER_PID, latest_checkpoint, read_jsonl, read_manifest
from cory.run.run_rules import (check_output_dir, copied_run, evaluation_refusal, read_folder, restart_refusal,
                                run_finished)

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Pair:
    method: str
    seed: int
    kl_coef: float | None
    script: str         # repo-relative (absolute when outside the repository)
    preset: str | None  # repo-relative; None: the script's own values
    flags: list[str]    # --set overrides, eta, then the method's own flags (later flags win)
    run_dir: Path       # absolute
    steps: int
    intended: dict      # field -> value this command asks for (to compare with a run already there)
    script_args: tuple = ()  # a one-file task's method argument: FILE ppo|cory
    workdir: Path = REPO  # where the run's process runs: a one-file task's, in the folder the runner was run in

    @property
    def label(self) -> str:
        return self.method if self.kl_coef is None else f"{self.method}_kl{self.kl_coef:g}"

    @property
    def key(self) -> str:
        return f"{self.label}/seed_{self.seed}"


# ----------------------------------------------------------------------------- what is already there

def _logged_steps(run_dir: Path) -> set[int]:
    rows = read_jsonl(run_dir / "metrics.jsonl")  # a line cut by a kill is skipped
    return {row["step"] for row in rows if isinstance(row.get("step"), int)}


def _saved_config(run_dir: Path) -> dict | None:
    try:
        return load_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else None
    except ConfigError:
        return None


def pair_state(pair: Pair) -> tuple[str, str]:
    """("new" | "finished" | "resume" | "overwrite", why) for a run folder, from what it holds."""
    d = pair.run_dir
    if not d.is_dir() or all(p.name == LOCK for p in d.iterdir()):
        return "new", "not started"
    saved = _saved_config(d)
    logged = _logged_steps(d)
    saved_steps = saved.get("steps") if saved else None
    if saved and saved_steps == pair.steps and final_complete(d) and pair.steps - 1 in logged:
        return "finished", f"finished ({pair.steps} iterations)"
    ckpt = latest_checkpoint(d)
    if saved and saved_steps == pair.steps and set(range(pair.steps)) <= logged and ckpt is None:
        # every iteration's metrics and no weights at all: a committed results folder (git keeps no weights),
        # whose metrics are the result - rerunning would only overwrite them
        return "finished", f"finished ({pair.steps} iterations; weights not kept)"
    if saved is None or ckpt is None:
        return "overwrite", "cut off before its first checkpoint"
    done = int(ckpt.name.split("_")[-1])
    if done > pair.steps:
        return "overwrite", f"its checkpoint is past --steps {pair.steps}"
    # a resumed run redoes the iterations after the checkpoint; rows missing before it would stay missing
    if done > (max(logged) + 1 if logged else 0):
        return "overwrite", f"metrics.jsonl lacks rows before its checkpoint at {done}"
    return "resume", f"cut off after {len(logged)} logged iterations; resuming from checkpoint {done}"


def mismatch(pair: Pair) -> str | None:
    """Why the run already in the folder is not the one this command asks for: more iterations than --steps (by
    its config, its metrics or its checkpoint: whatever the folder holds), or a field set otherwise; else None."""
    d = pair.run_dir
    saved = _saved_config(d)
    ckpt = latest_checkpoint(d)
    done = max([int(ckpt.name.split("_")[-1])] if ckpt is not None else [], default=0)
    logged = _logged_steps(d)
    ran = max([saved["steps"]] if saved and isinstance(saved.get("steps"), int) else [], default=0)
    ran = max(ran, done, max(logged) + 1 if logged else 0)
    if ran > pair.steps:
        return (f"{ran} iterations, more than --steps {pair.steps} (a runner never shortens a run: ask for --steps "
                f"{ran} or more)")
    ran_by = (read_manifest(d) or {}).get("method")
    family = next((m for m in ("cory", "ppo") if pair.method.startswith(m)), None)
    if family is not None and isinstance(ran_by, str) and ran_by != family:
        return f"method={ran_by!r} (its {MANIFEST}; this command asks for {pair.method})"
    if saved is None:
        return None
    # the task first: a run copied from another task's experiment is named by it, not by a setting it also changes
    for key, want in sorted(pair.intended.items(), key=lambda item: item[0] != "task"):
        have = saved.get(key)
        same = (have == want or (isinstance(have, (int, float)) and isinstance(want, (int, float))
                                 and not isinstance(have, bool) and math.isclose(have, want, rel_tol=1e-9)))
        if not same:
            return f"{key}={have!r} (this command asks for {want!r})"
    return None


def lost_by(pair: Pair, state: str) -> str | None:
    """Why running ``pair`` as ``state`` says would delete what its folder holds and no rerun gives back (one line),
    else None. "overwrite" starts the run again from iteration 0 with --overwrite: refused for a run copied or cloned
    from another folder (a committed results/ folder), a finished run's results, or files no run writes; "resume"
    deletes the evaluations of the models it replaces: refused where they came with a copied run."""
    d = pair.run_dir
    if state == "resume":
        refusal = evaluation_refusal(read_folder(d))
        return refusal and (f"{refusal}; continuing the run replaces the models it describes and would delete it, so "
                            f"the runner refuses: move it out of {rel(d)}, then rerun")
    if state != "overwrite":
        return None
    refusal = restart_refusal(read_folder(d))
    if refusal:
        saved = _saved_config(d)
        missing = "missing" if not (d / "config.yaml").is_file() else "unreadable (not UTF-8 YAML)"
        advice = (f"its config.yaml is {missing}: put it back, or use a new --out" if saved is None else
                  f"extending a run needs its checkpoints: rerun with --steps {pair.steps} into a new --out"
                  if saved.get("steps") != pair.steps else
                  "--restart_cut_off moves it under the experiment's cut_off/ and starts it again, or use a new --out"
                  if cut_off_elsewhere(pair, state) else "leave it as it is and use a new --out")
        return (f"{refusal} and no checkpoint; the runner would start it again and delete them, so it refuses: "
                f"{advice}")
    try:  # what the run's own --overwrite refuses (files no run writes, a folder no run made), refused here first
        check_output_dir(str(d), resume=False, overwrite=True)
    except ConfigError as e:
        return str(e)
    return None


def cut_off_elsewhere(pair: Pair, state: str) -> bool:
    """A run cut off in another copy of its folder, as committed from a lent GPU's call: the metrics of its first
    iterations, no checkpoint (weights are not committed), so it cannot resume here, only start again."""
    d = pair.run_dir
    saved = _saved_config(d)
    return (state == "overwrite" and saved is not None and saved.get("steps") == pair.steps
            and copied_run(folder := read_folder(d)) is not None and not run_finished(folder))


def set_aside(pairs: list[Pair], out: Path) -> Path:
    """Move runs cut off elsewhere to ``out/cut_off/<n>/<label>/seed_<s>/``, n the next free number (one per call),
    nothing deleted, so that their folders are new and the runner starts them again. Returns ``out/cut_off/<n>``."""
    root = out / "cut_off"
    taken = [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
    attempt = root / str(max(taken, default=0) + 1)
    for pair in pairs:
        dest = attempt / pair.label / f"seed_{pair.seed}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        pair.run_dir.rename(dest)
    return attempt


# ----------------------------------------------------------------------------- running

def _display(cmd: list[str]) -> str:
    return shlex.join(["python", *cmd[1:]])


def rel(path: Path, base: Path = REPO) -> str:
    """``path`` as a command run in ``base`` names it: relative to it when inside, else absolute."""
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def command(pair: Pair, mode: str) -> list[str]:
    out = rel(pair.run_dir, pair.workdir)
    preset = [] if pair.preset is None else ["--config", pair.preset]
    cmd = [sys.executable, pair.script, *pair.script_args, *preset, *pair.flags,
           "--seed", str(pair.seed), "--steps", str(pair.steps), "--output_dir", out]
    if mode == "resume":
        cmd += ["--resume", out]
    elif mode == "overwrite":
        cmd += ["--overwrite", "true"]
    return cmd


def git_state(tree: str | os.PathLike = REPO) -> tuple[str | None, bool | None]:
    """The commit ``tree`` is at and whether a tracked file differs from it (untracked files are not the code that
    runs); None for what git cannot tell."""
    try:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return commit, (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


# runs.json's run keys, as Pair.key writes them: <method>[_kl<eta>]/seed_<n>, a relative path of two plain names
RUN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*/seed_[0-9]+")
_JSON = {dict: "object", list: "list", str: "string", int: "number", float: "number", bool: "boolean",
         type(None): "null"}
# Record's fields that hold lists: what each item is, in words and as types
_LISTS = {"invocations": ("objects", (dict,)), "methods": ("strings", (str,)), "seeds": ("whole numbers", (int,)),
          "kl_coefs": ("numbers", (int, float))}


def json_kind(value) -> str:
    """``value``'s JSON type in a word ("list", "null")."""
    return _JSON.get(type(value), type(value).__name__)


def _attempts_refusal(name: str, key: str, run) -> str | None:
    """Why the record of run ``key`` in ``name`` is not a run's record with a list of attempts; None when it is."""
    if not isinstance(run, dict):
        return f"{name}'s run {key!r} is a JSON {json_kind(run)}, not a run's record (an object)"
    attempts = run.get("attempts", [])
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        return f"{name}'s run {key!r} has attempts that are not a list of objects"
    for a in attempts:
        for field, kinds in (("exit_status", (int,)), ("wall_time_s", (int, float))):
            if a.get(field) is not None and (isinstance(a[field], bool) or not isinstance(a[field], kinds)):
                return (f"{name}'s run {key!r} has an attempt whose {field} is a JSON {json_kind(a[field])}, not a "
                        "number")
    return None


def record_refusal(doc, name: str = "runs.json") -> str | None:
    """Why ``doc`` (runs.json, parsed; ``name``, the file as the words name it) is not of the shape ``Record``
    writes, naming the field ("runs.json's runs are a JSON list, not ..."); None when it is. A field that is missing
    is not named (an older runner wrote fewer), nor a key outside RUN_KEY's grammar (a reader looks its runs up by
    key; a writer that makes paths of them checks them itself)."""
    if not isinstance(doc, dict):
        return f"{name} holds a JSON {json_kind(doc)}, not the runner's record"
    for field in ("task", "preset"):
        if doc.get(field) is not None and not isinstance(doc[field], str):
            return f"{name}'s {field} is a JSON {json_kind(doc[field])}, not a string"
    runs = doc.get("runs", {})
    if not isinstance(runs, dict):
        return f"{name}'s runs are a JSON {json_kind(runs)}, not an object of runs"
    for key, run in runs.items():
        if refusal := _attempts_refusal(name, key, run):
            return refusal
    for field, (items, kinds) in _LISTS.items():
        value = doc.get(field)
        if value is not None and (not isinstance(value, list) or
                                  any(isinstance(v, bool) or not isinstance(v, kinds) for v in value)):
            return f"{name}'s {field} are not a list of {items}"
    return None


def now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


class Record:
    """runs.json, rewritten atomically after every change so a killed runner leaves it consistent."""

    def __init__(self, out: Path, spec: dict):
        self.path = out / "runs.json"
        self.lock = threading.Lock()
        prior = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.data = {**prior, **{k: v for k, v in spec.items() if k not in ("out", "jobs")}}
        # the folder holds every earlier command's runs too: list them all, not only this command's
        for key in ("methods", "seeds", "kl_coefs"):
            before = prior.get(key) or []
            self.data[key] = before + [v for v in spec[key] or [] if v not in before] or spec[key]
        self.data.setdefault("invocations", [])
        self.data.setdefault("runs", {})
        if not self.data["runs"]:  # the design the folder's runs start from; a later edit is named by the report
            self.data[DESIGN_DIGEST] = design_digest(out)

    def save(self) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(".runs.json.tmp")
            try:  # a full disk leaves the runs.json before, not a cut one
                tmp.write_text(json.dumps(self.data, indent=2) + "\n")
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)

    def run(self, pair: Pair) -> dict:
        with self.lock:
            rec = self.data["runs"].setdefault(pair.key, {"attempts": []})
            rec.update(method=pair.method, seed=pair.seed, kl_coef=pair.kl_coef, script=pair.script,
                       preset=pair.preset, run_dir=rel(pair.run_dir))
            return rec


class Children:
    """The training processes running now. Each runs in a session of its own, and a stop signal the runner
    gets (Ctrl-C, or SIGTERM from a scheduler or ``kill``) is passed on to each once, from here: it saves a
    checkpoint and stops, and the runner records it. No run is started after the first signal."""

    def __init__(self):
        # re-entrant: the signal handler (``stop``) may run in the main thread while that thread is inside ``start``
        self.lock = threading.RLock()
        self.running: set[subprocess.Popen] = set()
        self.stopped_by: int | None = None

    def start(self, cmd: list[str], **kwargs) -> subprocess.Popen | None:
        with self.lock:
            if self.stopped_by is not None:
                return None
            # the run stops, checkpointed, if this runner dies without passing a signal on (cory.run.outputs.RUNNER_PID)
            env = {**(kwargs.pop("env", None) or os.environ), RUNNER_PID: str(os.getpid())}
            proc = subprocess.Popen(cmd, start_new_session=True, env=env, **kwargs)
            self.running.add(proc)
            if self.stopped_by is not None:  # the signal came while Popen ran, in this thread: it passes on now
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(self.stopped_by)
            return proc

    def wait(self, proc: subprocess.Popen) -> int:
        status = proc.wait()
        with self.lock:
            self.running.discard(proc)
        return status

    def stop(self, signum: int) -> None:
        with self.lock:
            if self.stopped_by is None:
                self.stopped_by = signum
            for proc in self.running:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)


# a run that saved a checkpoint and stopped on a signal (128 + SIGINT or SIGTERM), or was stopped by one
STOPPED = (130, 143, -signal.SIGINT, -signal.SIGTERM)


def execute(pair: Pair, mode: str, record: Record, out: Path, env: dict, why: str = "",
            children: Children | None = None, progress: Progress | None = None) -> dict:
    """Run one training process to the end; its output goes to OUT/logs/."""
    from tqdm.auto import tqdm

    cmd = command(pair, mode)
    log = out / "logs" / pair.label / f"seed_{pair.seed}.log"
    tqdm.write(f"start  {pair.key} ({why}): {_display(cmd)}\n       its output (the run's own bar): {rel(log)}")
    log.parent.mkdir(parents=True, exist_ok=True)
    attempt = {"mode": mode, "command": _display(cmd), "started": now(), "wall_time_s": None,
               "exit_status": None, "log": rel(log)}
    rec = record.run(pair)
    with record.lock:
        rec["attempts"].append(attempt)
        rec["status"] = "running"
    record.save()
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"\n==== {attempt['started']} {attempt['command']}\n")
        f.flush()
        children = children or Children()
        if progress is not None:
            progress.start(pair)
        proc = children.start(cmd, cwd=pair.workdir, stdout=f, stderr=subprocess.STDOUT, env=env,
                              stdin=subprocess.DEVNULL)
        if proc is not None:
            with record.lock:
                attempt["pid"] = proc.pid
            record.save()
        status = None if proc is None else children.wait(proc)
    if progress is not None:
        progress.end(pair)
    with record.lock:
        attempt["wall_time_s"] = round(time.perf_counter() - t0, 1)
        attempt["exit_status"] = status
        if status not in (0, None):
            attempt["error"] = _last_error(log)
        rec["status"] = ("finished" if status == 0 else
                         "interrupted" if status is None or status in STOPPED else "failed")
    record.save()
    return attempt


class Progress:
    """Where each running run stands, for the runner's bar: ``ppo/seed_0 12/30 ETA 8m``, read from the
    iterations its metrics.jsonl holds (the rate from this attempt's own iterations, so a resumed run's earlier
    ones do not make it look fast)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: dict[str, tuple[Pair, int, float]] = {}  # key -> (pair, iterations at start, start time)

    @staticmethod
    def done(pair: Pair) -> int:
        path = pair.run_dir / "metrics.jsonl"
        return len(_logged_steps(pair.run_dir)) if path.is_file() else 0  # never opens a pipe put there

    def start(self, pair: Pair) -> None:
        with self.lock:
            self.running[pair.key] = (pair, self.done(pair), time.monotonic())

    def end(self, pair: Pair) -> None:
        with self.lock:
            self.running.pop(pair.key, None)

    def line(self) -> str:
        with self.lock:
            running = list(self.running.values())
        parts = []
        for pair, at_start, t0 in running:
            done = self.done(pair)
            part = f"{pair.key} {done}/{pair.steps}"
            if done > at_start:
                eta = (time.monotonic() - t0) / (done - at_start) * max(pair.steps - done, 0)
                part += f" ETA {_minutes(eta)}"
            parts.append(part)
        return ", ".join(parts)


def _minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h" if seconds >= 5400 else f"{math.ceil(seconds / 60):.0f}m"


def _last_error(log: Path) -> str:
    text = log.read_text(errors="replace")
    text = text[text.rfind("\n==== ") + 1:]  # this attempt's output only (the log is appended to)
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()][1:]
    for ln in reversed(lines):
        if ln.startswith("error:") or "Error" in ln.split(":")[0]:
            return ln[:300]
    return lines[-1][:300] if lines else "no output"
