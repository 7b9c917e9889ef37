"""When a run may start, resume, continue or be overwritten: the rules, in the order a run meets them, each with
the one-line error a user gets (a ConfigError, raised before any model loads and before anything is written).
Nothing here writes or deletes: a rule refuses, or lets the run go on (what a run writes, and so what
``--overwrite`` may delete: ``cory.run.outputs``).

1. A script trains its own task (``check_script_task``).
2. ``--resume RUN``: RUN is a run folder that no other process is writing, of this script's method and task
   (``check_resume_folder``); its config.yaml holds only this script's fields (``check_saved_fields``); the command
   changes only the fields marked [resume] (``resume_changes``), and not the folder (``check_stays_in_folder``).
3. The ``--resume`` of a run that has done its iterations and holds its final models changes nothing
   (``nothing_to_do``).
4. ``output_dir`` is a folder (or can be made one), outside every run's folder, writable, and no other process is
   writing it; a run starts only in an empty one, goes on in one only with ``--resume``, and ``--overwrite``
   replaces only a run made there that holds nothing a run does not write (``check_output_dir``).
5. A resume continues from the newest checkpoint: one of this script's method and task, whose files were saved
   together, hold data only and come from the same base model and training settings, and that has not done more
   than ``--steps`` iterations (``check_resumable``, ``check_one_checkpoint``, ``check_trained_config``). Without
   one the run starts again from iteration 0, unless that would delete results no restart gives back
   (``restart_refusal``); continuing replaces the final models, and their evaluations go too, unless they came with
   a copied run (``evaluation_refusal``).
6. A result file a command writes on its own (a benchmark's ``--json``) is outside every run folder
   (``check_output_json``).

A resume's rules (5) judge what one read of the folder found (``read_folder``: its run's identity, checkpoints,
rows, final models and evaluations), so that no rule reads it again; the experiment runner (``lab.runs``) asks the
same rules, of its own read, before it reruns or replaces a run. Two things can only be
found with the models loaded, and are refused there (``cory.run.checkpoint.restore``): an agent file that does not fit
the model, and a saved data stream the task does not take.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from cory.config import (INVOCATION_FIELDS, REQUIRED, CoryArgs, PPOArgs, field_types, field_help, metadata,
                         on_resume_fields, to_dict)
from cory.errors import ConfigError
from cory.run.final import FINAL, file_digest, final_complete, final_iterations
from cory.method import method_of
from cory.run.outputs import (LOCK, MANIFEST, check_checkpoint_file, checkpoints, evaluations, in_use,
                              linked_checkpoints, load_checkpoint_file, read_jsonl, read_manifest, run_folder_of,
                              scan_run_dir, written_here)
from cory.run.targets import check_output_file, check_writable
from cory.tasks.base import STATE_COUNTS, state_count


# -- 1. a script and its task -----------------------------------------------------------------------------------------
def check_script_task(cls, task: str | None, method: str) -> None:
    """A script trains its own task: a config of another one names the script that trains it."""
    script_task = cls.__dataclass_fields__["task"].default
    if script_task is not REQUIRED and task is not None and task != script_task:
        raise ConfigError(f"task: this script trains {script_task}, the config asks for {task}; use "
                          f"{task}_train/{method}.py")


# -- 2. what --resume names, and what it may change -------------------------------------------------------------------
def check_resume_folder(run_dir: Path, method: str, task: str | None) -> Path:
    """``run_dir`` is a run folder no other process is writing, of ``method``'s script of ``task`` (None: any
    task); returns its config.yaml."""
    busy = in_use(run_dir)  # its config.yaml may not be written yet, or be about to change
    if busy:
        raise ConfigError(busy)
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"resume: {saved_path} not found; is {run_dir} a run folder?")
    check_identity(run_dir, run_identity(run_dir), method, task)
    return saved_path


def check_saved_fields(cls, saved: dict, path: Path) -> None:
    """The saved config of a run (``path``) as ``cls``: a field the script does not have means another method's
    run."""
    fields = field_types(cls)
    foreign = [k for k in saved if k not in fields]
    anyones = set(field_types(CoryArgs)) | set(field_types(PPOArgs))
    retired = [k for k in foreign if k not in anyones]
    if retired:  # no method's script has them: not another method's run
        raise ConfigError(f"resume: {path} holds fields no script has now ({', '.join(retired[:3])}): retired since "
                          f"the run was made, or added by hand; delete them from {path} to resume it")
    if foreign:
        raise ConfigError(f"resume: {path} holds fields this script does not have ({', '.join(foreign[:3])}): "
                          "a run of another method; resume it with its own script")


def resume_changes(cls, asked, saved, given: set[str], saved_path: Path) -> dict:
    """What this command sets (``given``: in --config or as a flag) must agree with the run's config (``saved``)
    unless it may change on a resume; returns the fields it changes, with their new values."""
    changed = {}
    for name in sorted(given - {"resume", "output_dir"}):
        new, old = getattr(asked, name), getattr(saved, name)
        if new != old:
            if not metadata(cls, name)["on_resume"]:
                may = ", ".join(n for n, _, _, m in field_help(cls) if m["on_resume"] and n not in INVOCATION_FIELDS)
                raise ConfigError(f"resume: {name} is {old!r} in {saved_path}, this command asks for {new!r}; a "
                                  f"resumed run keeps its training settings (may change: {may})")
            changed[name] = new
    return changed


def check_stays_in_folder(output_dir: str | None, run_dir: Path) -> None:
    """A resumed run stays in its folder: an ``--output_dir`` given with ``--resume`` names the same one."""
    if output_dir is not None and Path(output_dir).expanduser().resolve() != run_dir.resolve():
        raise ConfigError(f"output_dir: a resumed run stays in its folder ({run_dir}); drop --output_dir")


def check_identity(run_dir: Path, identity: tuple[str, str | None], method: str, task: str | None) -> None:
    """The run in ``run_dir``, of ``identity`` (``run_identity``), is one that ``method``'s script of ``task``
    continues (None: any task); else one line naming the script that does."""
    was, was_task = identity
    if was != method or (task and was_task and was_task != task):
        on = f" on the {was_task} task" if was_task else ""
        raise ConfigError(f"resume: {run_dir} is a {was} run{on}; continue it with {script_of(was, was_task)}")


def script_of(method: str, task: str | None) -> str:
    """The training script that continues a ``method`` run of ``task``; named generically where a manifest records
    no task."""
    if task:
        return f"{task}_train/{method}.py"
    return f"<task>_train/{method}.py, the script of the task it was trained on (its manifest names none)"


def aside(checkpoint: Path) -> str:
    """What every damaged-checkpoint refusal advises."""
    return f"move {checkpoint} aside to resume from an older checkpoint, or start again with --overwrite"


def run_identity(run_dir: Path) -> tuple[str, str | None]:
    """(method, task) of the run in ``run_dir``, from its manifest; runs from before the manifest: a CORY run's
    config has swap_period."""
    return _identity(read_manifest(run_dir) or {}, _saved_config(Path(run_dir)))


def _identity(manifest: dict, saved: dict) -> tuple[str, str | None]:
    return (manifest.get("method") or ("cory" if "swap_period" in saved else "ppo"),
            manifest.get("task") or saved.get("task"))


def _saved_config(run_dir: Path) -> dict:
    """The run's config.yaml as saved; {} where it cannot be read as a mapping."""
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        return {}
    return saved if isinstance(saved, dict) else {}


# -- 3. a finished run ------------------------------------------------------------------------------------------------
def nothing_to_do(cfg: PPOArgs) -> str | None:
    """For ``--resume`` of a run that has done its ``steps`` iterations and holds its final models: the line that
    says so, and the resume then changes nothing (no config, row, evaluation or model rewritten); else None."""
    run_dir = Path(cfg.output_dir)
    done = checkpoints(run_dir)
    # without a checkpoint (keep_resume_checkpoint: false dropped it), final/'s marker says what the run has done
    last = done[-1][0] if done else final_iterations(run_dir)
    if cfg.resume is None or last != cfg.steps:
        return None
    if not final_complete(run_dir, method_of(cfg).agents):
        return None  # cut off while saving them (a final/ from before they were written whole): the resume writes them
    extend = ("--steps N, more iterations, extends it" if done else
              "it kept no checkpoint, keep_resume_checkpoint: false, so a longer run starts in another folder")
    return (f"nothing to do: {run_dir} has done its {cfg.steps} iterations and holds its final models; nothing "
            f"changed ({extend})")


# -- 4. the folder a run writes ---------------------------------------------------------------------------------------
def check_output_dir(output_dir: str, *, resume: bool, overwrite: bool, method: str = "", task: str = "") -> None:
    """Refuse to touch an existing run unless asked to, and anything but a run at all; writes nothing. ``method``
    and ``task``: this run's, so that a folder holding another method's run gets advice that works."""
    path = Path(output_dir)
    if path.is_symlink() and not path.exists():  # a folder cannot be made where the link is
        raise ConfigError(f"output_dir: {output_dir} is a symbolic link to {os.readlink(path)}, which does not "
                          "exist; create that folder or choose another output_dir")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output_dir: {output_dir} exists and is not a folder")
    # a run inside another's folder is a user's file to that run (its --overwrite refuses, its copy carries it)
    host = next((d for start in (path.absolute(), path.resolve()) for d in start.parents
                 if read_manifest(d) is not None), None)
    if host is not None:
        raise ConfigError(f"output_dir: {output_dir} is inside the run folder {host}, which holds only what its run "
                          "writes; choose a folder outside it")
    check_writable(path)
    busy = in_use(path) if path.is_dir() else None
    if busy:
        raise ConfigError(busy)
    if resume:  # without a complete checkpoint the run starts again from iteration 0, in the same folder
        return
    if not path.is_dir() or all(p.name == LOCK for p in path.iterdir()):  # a lock alone: a run that never began
        return
    if not overwrite:
        there = read_manifest(path) or {}
        was, was_task = run_identity(path)  # the manifest's word, or its config.yaml's task where it names none
        if method and there.get("method") and (was, was_task) != (method, task):
            on = f" on {was_task}" if was_task else ""
            raise ConfigError(f"output_dir: {output_dir} holds a {was} run{on}; continue it with "
                              f"{script_of(was, was_task)} --resume {output_dir}, or choose another output_dir "
                              "(--overwrite replaces it)")
        raise ConfigError(f"output_dir: {output_dir} already holds files; pass --resume {output_dir} to continue "
                          f"the run there or --overwrite to replace it")
    # --overwrite deletes only what a run of this project wrote, in a folder that says it is one
    if read_manifest(path) is None:
        raise ConfigError(f"output_dir: {output_dir} is not a run folder of this project (no {MANIFEST}); "
                          "--overwrite only replaces runs, choose another output_dir")
    foreign = [str(p.relative_to(path)) for p in scan_run_dir(path)[1]]
    if foreign:
        raise ConfigError(f"output_dir: {output_dir} also holds files no run writes ({', '.join(foreign[:3])}"
                          f"{', ...' if len(foreign) > 3 else ''}); --overwrite would delete them, so it refuses: "
                          "move them or choose another output_dir")
    copied = copied_run(read_folder(path))
    if copied:
        raise ConfigError(f"output_dir: {copied}; --overwrite replaces only a run made in its own folder, so it "
                          "refuses: leave it as it is and start the new run in another output_dir")


# -- 5. what a resume continues, restarts or replaces -----------------------------------------------------------------
def check_resumable(run_dir: Path, cfg: PPOArgs, fingerprint: str | None = None) -> tuple[Path, dict] | None:
    """The run in ``run_dir`` is one this script continues (same method and task), what the resume replaces was
    written here, its newest checkpoint's files hold data only and can be read, and its base model is the one
    ``fingerprint`` describes now (``weights_fingerprint``). Returns that checkpoint and its state (state.pt, read
    once); None when there is none (the run starts again from iteration 0). The folder is read first
    (``read_folder``), then judged."""
    method = method_of(cfg)
    folder = read_folder(run_dir, method.agents)
    check_identity(run_dir, folder.identity, method.name, cfg.task)
    if folder.linked:  # it is passed over, so the run would redo its iteration and then fail to save over the link
        raise ConfigError(f"resume: {folder.linked[0]} is a symbolic link (to {os.readlink(folder.linked[0])}), not "
                          "a checkpoint this run saved; a run never writes through a link, so it refuses: move the "
                          f"link out of {folder.linked[0].parent}, then resume")
    if not folder.checkpoints:  # the run would start again from iteration 0, deleting every row
        dropped = dropped_refusal(folder, cfg)
        if dropped:
            raise ConfigError(dropped)
        refusal = restart_refusal(folder)
        if refusal:
            raise ConfigError(f"resume: {refusal} and no checkpoint to resume from; resuming would start it again "
                              "and delete them, so it refuses: leave it as it is and start a new run in another "
                              f"folder (--config {run_dir / 'config.yaml'} --output_dir NEW)")
        return None
    checkpoint = folder.checkpoints[-1][1]
    refusal = evaluation_refusal(folder)  # continuing replaces the final models they describe
    if refusal:
        raise ConfigError(f"resume: {refusal}; continuing the run replaces the models it describes and would delete "
                          f"it, so it refuses: move it out of {run_dir}, then resume")
    state = load_checkpoint_file(checkpoint / "state.pt")
    for name in method.agents:
        if not (checkpoint / f"{name}.pt").is_file():
            raise ConfigError(f"resume: {checkpoint} has no {name}.pt, which a {method.name} run's checkpoint holds "
                              f"({', '.join(a + '.pt' for a in method.agents)}): damaged, or not this method's; "
                              f"{aside(checkpoint)}")
        check_checkpoint_file(checkpoint / f"{name}.pt")
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ConfigError(f"resume: {checkpoint / 'state.pt'} holds no iteration count; move that checkpoint "
                          "folder aside to resume from an older one, or start again with --overwrite")
    if state["step"] > cfg.steps:  # its weights have seen more iterations than the run would then say
        raise ConfigError(f"steps: {run_dir} has done {state['step']} iterations, more than --steps {cfg.steps}; a "
                          f"resumed run can only be extended (--steps {state['step']} or more)")
    check_trained_config(checkpoint, state.get("config"), cfg)
    base = state.get("base_model")
    if isinstance(base, str) and fingerprint is not None and base != fingerprint:
        raise ConfigError(f"resume: the base model {cfg.model_name} has changed since {checkpoint.name} was saved (its "
                          "weights or config.json differ from those the run started from, which are its KL "
                          "reference too); resume with the model it was trained from, or start again with --overwrite")
    check_one_checkpoint(checkpoint, state, method.agents)
    # HF Trainer's documentation says its save_only_model checkpoints cannot be resumed, and its code then resumes them
    # with a fresh optimizer, without a warning; here the data, random streams, KL coefficient and score statistics come
    # back, Adam's moments do not, and a resume says so
    if state.get("model_only"):
        warnings.warn(f"resume: {checkpoint} holds no optimizer state (saved with save_only_model: true): Adam's "
                      "moments start afresh, so the resumed run is not the one an uninterrupted run gives")
    return checkpoint, state


def dropped_refusal(folder: Folder, cfg: PPOArgs) -> str | None:
    """Why the ``--resume`` of a run made here that finished and then dropped its checkpoint
    (``keep_resume_checkpoint: false``) cannot go on, else None (``folder`` read with this method's agents). (One
    that asks for the iterations it has done has nothing to do, ``nothing_to_do``.)"""
    done, run_dir = folder.final_iterations, folder.path
    if done is None or not folder.final_whole or copied_run(folder):
        return None
    kept = f"{run_dir} finished its {done} iterations and kept no checkpoint (keep_resume_checkpoint: false)"
    if cfg.steps < done:
        return f"steps: {kept}, more than --steps {cfg.steps}; a run cannot be shortened: start a new one"
    return (f"resume: {kept}, so it cannot go on to --steps {cfg.steps}; start a run of {cfg.steps} iterations in "
            f"another folder (--config {run_dir / 'config.yaml'} --steps {cfg.steps} --output_dir NEW), with "
            "--keep_resume_checkpoint true to extend that one later")


def check_one_checkpoint(checkpoint: Path, state: dict, agents) -> None:
    """The files of ``checkpoint`` were saved together: its state.pt's step is the folder's (a state copied from
    another step would resume from that step, on weights trained further or less), and each agent file is the one
    whose sha256 it records (not copied in from another step, seed or method). A checkpoint saved before it
    recorded them is taken as whole, with a warning: the step is still checked."""
    move_aside = aside(checkpoint)
    folder_step = int(checkpoint.name.split("_")[-1])
    if state["step"] != folder_step:
        raise ConfigError(f"resume: {checkpoint / 'state.pt'} is the state after {state['step']} iterations, not "
                          f"after {folder_step} as its folder {checkpoint.name} says: it is not that checkpoint's "
                          f"own; {move_aside}")
    rng = state.get("rng")
    lacking = next((key for key in ("task", "rng") if key not in state), None) or next(
        (f"rng.{key}" for key in ("torch", "numpy", "python", "length") if not isinstance(rng, dict) or key not in rng),
        None)
    if lacking:  # restore() would stop on it with a traceback, after the models have loaded
        raise ConfigError(f"resume: {checkpoint / 'state.pt'} holds no {lacking!r} (damaged, or edited by hand), so "
                          f"the run cannot be restored from it; {move_aside}")
    counts = [key for key in STATE_COUNTS if key in state["task"]] if isinstance(state["task"], dict) else []
    for key in counts:
        try:  # the task checks them too, but only after the models have loaded
            state_count(state["task"], key)
        except ValueError as e:
            raise ConfigError(f"resume: {checkpoint / 'state.pt'}: its {e} (damaged, or edited by hand), so the "
                              f"run cannot be restored from it; {move_aside}") from None
    recorded = state.get("files")
    if not isinstance(recorded, dict):
        warnings.warn(f"resume: {checkpoint / 'state.pt'} records no digest of its agent files (saved before they "
                      "were recorded); they are taken as its own")
        return
    for name in agents:
        path = checkpoint / f"{name}.pt"
        if recorded.get(path.name) != file_digest(path):
            raise ConfigError(f"resume: {path} is not the file {checkpoint / 'state.pt'} was saved with (its sha256 "
                              "differs: copied from another checkpoint, run or method, or damaged); " + move_aside)


def check_trained_config(checkpoint: Path, trained: dict | None, cfg: PPOArgs) -> None:
    """The run's config (its config.yaml and this command's allowed changes) agrees with the one its checkpoint
    was trained with in every field that changes what a run learns; a hand-edited config.yaml would otherwise be
    recorded while the optimizer kept the old values. Checkpoints written before they recorded it pass."""
    if not isinstance(trained, dict):
        return
    may_change = set(on_resume_fields(type(cfg))) | set(INVOCATION_FIELDS)
    for name, value in to_dict(cfg).items():
        if name in may_change or name not in trained or trained[name] == value:
            continue
        raise ConfigError(f"resume: {cfg.output_dir}/config.yaml says {name} {value!r}, but its checkpoint "
                          f"{checkpoint.name} was trained with {trained[name]!r}; a resumed run keeps its training "
                          f"settings: put {name} back in config.yaml, or start again with --overwrite")


@dataclass(frozen=True)
class Folder:
    """What a run folder holds that the rules weigh before a run resumes, restarts or replaces it, read at once
    (``read_folder``): each rule below judges it and reads nothing itself."""
    path: Path
    identity: tuple[str, str | None]      # (method, task) of the run there (``run_identity``)
    checkpoints: list[tuple[int, Path]]   # (iterations, folder) of each complete checkpoint, oldest first
    linked: list[Path]                    # links under a checkpoint's name (``outputs.linked_checkpoints``)
    rows: dict[str, int]                  # the rows of metrics.jsonl, eval.jsonl and samples.jsonl, where any
    logged_all: bool                      # a metrics row for every iteration its config.yaml asks for
    evaluations: list[str]                # lab.evaluate's results beside it (``eval_<task>.json``)
    written_here: bool                    # made in this folder, not copied or cloned in (``outputs.written_here``)
    final: bool                           # it holds a final/
    final_iterations: int | None          # the iterations final/'s marker records (``final.final_iterations``)
    final_whole: bool                     # final/ holds whole models of the agents asked for (``final_complete``)

    @property
    def results(self) -> list[str]:
        """Its results, named for a refusal: its rows, its final models, their evaluations."""
        return ([f"{name} ({n} rows)" for name, n in self.rows.items()] + (["final/"] if self.final else [])
                + self.evaluations)


def read_folder(run_dir: str | os.PathLike, agents: tuple[str, ...] | None = None) -> Folder:
    """What the run folder ``run_dir`` holds (``Folder``), for a run of ``agents`` (None: the models final/ holds)."""
    run_dir = Path(run_dir)
    saved = _saved_config(run_dir)
    rows = {name: read_jsonl(run_dir / name) for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl")}
    steps, logged = saved.get("steps"), {row.get("step") for row in rows["metrics.jsonl"]}
    return Folder(run_dir, _identity(read_manifest(run_dir) or {}, saved), checkpoints(run_dir),
                  linked_checkpoints(run_dir), {name: len(r) for name, r in rows.items() if r},
                  isinstance(steps, int) and set(range(steps)) <= logged,
                  [p.name for p in evaluations(run_dir)], written_here(run_dir), (run_dir / FINAL).is_dir(),
                  final_iterations(run_dir), final_complete(run_dir, agents))


def restart_refusal(folder: Folder) -> str | None:
    """Why starting the run in ``folder`` again from iteration 0 (``--resume`` without a checkpoint, or the runner
    rerunning a run cut off before its first checkpoint) would delete what it cannot give back, as "RUN holds ...";
    None for a run cut off before its first checkpoint in this folder, whose rows the restart redoes."""
    copied = copied_run(folder)
    if copied or not run_finished(folder):
        return copied
    return f"{folder.path} holds a finished run's results ({_listing(folder.results)})"


def evaluation_refusal(folder: Folder) -> str | None:
    """Why continuing the run in ``folder`` from its checkpoint may not delete its evaluations (they describe the
    final models it replaces): they came with a run copied or cloned from another folder, so no command here wrote
    them. None when there are none, or they were written here."""
    if not folder.evaluations or folder.written_here:
        return None
    return (f"{folder.path} holds {_listing(folder.evaluations)}, the evaluation of a run copied or cloned from "
            "another folder")


def copied_run(folder: Folder) -> str | None:
    """"RUN holds a run copied or cloned from another folder (its results)" when ``folder`` holds results that no
    command wrote in this folder, else None: no command here may replace or delete them."""
    if not folder.results or folder.written_here:
        return None
    return f"{folder.path} holds a run copied or cloned from another folder ({_listing(folder.results)})"


def run_finished(folder: Folder) -> bool:
    """A finished run's results: its final models or their evaluation, or a metrics row for every iteration its
    config.yaml asks for (its checkpoints and final/ deleted, or never kept)."""
    return folder.final or bool(folder.evaluations) or folder.logged_all


def _listing(names: list[str]) -> str:
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


# -- 6. a result file beside the runs ---------------------------------------------------------------------------------
def check_output_json(path: str | os.PathLike, name: str, program: str, force: bool = False,
                      key: str = "command") -> None:
    """A result file a command writes on its own (a benchmark's ``--json``), checked before any work: a file name
    (not a folder) in a folder that exists, outside every run folder (a run's folder holds what runs write, and
    ``--overwrite`` would refuse it), not a file ``program`` did not write unless ``force``
    (``check_output_file``), and writable. A ConfigError of one line naming ``name``."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{name}: {path} is a folder; give a file name, e.g. {path / 'results.json'}")
    folder = path.absolute().parent
    if not folder.exists():
        raise ConfigError(f"{name}: folder {path.parent} does not exist; create it or choose a file in an existing "
                          "folder")
    run = run_folder_of(path)
    if run is not None:
        raise ConfigError(f"{name}: {path} is inside the run folder {run}, which holds only what a run writes; "
                          "choose a file outside it")
    check_output_file(path, name, program, force, key)
