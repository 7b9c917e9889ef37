"""Everything that can be checked before a model loads, gathered from the layers that know it: the values
alone (``cory.config``), the model spec (``cory.assets``), the task, reward and data (``cory.tasks``), and the
run folder (``cory.outputs``). A mistake raises ConfigError with one line; nothing has been written yet."""
from __future__ import annotations

import importlib.util
import netrc
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from cory import memory
from cory.assets import ModelSpec, check_4bit, model_spec, weights_fingerprint
from cory.config import INVOCATION_FIELDS, PPOArgs, on_resume_fields, to_dict
from cory.errors import AssetError, ConfigError
from cory.final import file_digest, final_complete
from cory.method import method_of
from cory.outputs import (check_checkpoint_file, check_output_dir, checkpoints, evaluation_refusal, latest_checkpoint,
                          load_checkpoint_file, read_manifest, restart_refusal)
from cory.tasks import check_config as check_task
from cory.tasks import REWARD_METRICS, task_spec


@dataclass(frozen=True)
class RunPlan:
    """What the checks found that a run needs before it loads anything."""
    spec: ModelSpec  # the model name, resolved once for every loader
    resume_from: Path | None = None  # the checkpoint a --resume continues from, checked; None: from iteration 0
    base_fingerprint: str | None = None  # the base model's weights (``weights_fingerprint``), recorded by checkpoints
    trained_precision: str | None = None  # the precision the checkpoint resumed from was trained in, where recorded


def check_config(cfg: PPOArgs) -> ModelSpec:
    """Checks of a resolved config that read files but write nothing (run by the CLI and the runner); the
    model name resolved (from the disk alone) into the spec the loaders take."""
    try:
        spec = model_spec(cfg.model_name)
    except AssetError as e:
        raise ConfigError(str(e)) from None
    check_task(cfg)
    check_context(cfg, spec)
    check_memory(cfg, spec)
    evaluation = task_spec(cfg.task).evaluation
    if cfg.eval_every and evaluation.metrics != REWARD_METRICS:
        raise ConfigError(f"eval_every: {cfg.task} is evaluated by {evaluation.metrics} over many samples per "
                          f"question, too slow within a run; set eval_every: 0 and run python -m lab.evaluate "
                          "on the final models")
    if cfg.eval_every and cfg.use_peft:
        raise ConfigError("eval_every: not with use_peft (the base model the KL is measured against is the adapters' "
                          "own base); set eval_every: 0 and run python -m lab.evaluate on the final models")
    return spec


def check_run(cfg: PPOArgs) -> RunPlan | None:
    """Every check a training run makes before it writes anything or loads a model: the config (above), then what
    the run will write: its folder, what it may replace or continue, and the loggers it reports to (before the folder
    is created). Returns what the run needs of it; None for the ``--resume`` of a finished run (``nothing_to_do``),
    which checks nothing further and changes nothing."""
    if nothing_to_do(cfg):
        return None
    spec = check_config(cfg)
    if cfg.load_in_4bit:
        check_4bit()
        if not cfg.use_peft:
            raise ConfigError("load_in_4bit: needs use_peft: true (4-bit weights cannot be trained directly)")
    check_output_dir(cfg.output_dir, resume=cfg.resume is not None, overwrite=cfg.overwrite, method=cfg.method,
                     task=cfg.task)
    fingerprint = weights_fingerprint(spec)
    resume_from = check_resumable(Path(cfg.output_dir), cfg, fingerprint) if cfg.resume is not None else None
    if cfg.report_to == "wandb":
        check_wandb()
    if cfg.report_to == "tensorboard":
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("report_to: tensorboard is not installed (pip install tensorboard), or use "
                              "--report_to none")
    trained = load_checkpoint_file(resume_from / "state.pt").get("precision") if resume_from is not None else None
    return RunPlan(spec, resume_from, fingerprint, trained if isinstance(trained, str) else None)


def check_context(cfg: PPOArgs, spec: ModelSpec) -> None:
    """The longest answer, with its prompt, must fit the model's context (where the model's config.json is
    on this machine); CORY's observer reads the pioneer's answer too."""
    context = spec.context
    if context is None:
        return
    cory = method_of(cfg).observer_reads_pioneer(cfg)
    answers = 2 if cory else 1
    room = task_spec(cfg.task).prompt_tokens  # the prompt's room beside the answers
    longest = (context - room) // answers
    if cfg.response_length_max > longest:
        why = " and the observer's prompt also holds the pioneer's answer" if cory else ""
        raise ConfigError(f"response_length_max: {cfg.response_length_max} tokens do not fit {cfg.model_name}'s "
                          f"context of {context} tokens ({room} kept for the prompt{why}); at most {longest}")


def check_memory(cfg: PPOArgs, spec: ModelSpec) -> None:
    """A batch that cannot fit this machine, even idle, is refused before anything loads (a billion queries would
    otherwise grow the task's sampler for a minute and end in MemoryError). The bound is a floor of what generating
    one batch holds at once: each query's next-token logits over the vocabulary and their softmax, in float32 (trl
    generates the whole batch in one call; transformers samples from float32 logits, and the softmax is made while
    they are held), and its int64 token ids (a prompt token at least, and the longest answer). The model, its KV
    cache and PPO's passes need more, so a batch under the bound may still not fit; one over it never does, on any
    device here (the RAM, or the largest GPU)."""
    answer = 1 + cfg.response_length_max  # the ids of a prompt token and the longest answer
    per_query = 8 * (spec.vocab or 0) + 8 * answer  # 2 float32 values per vocabulary entry, an int64 per id
    need = cfg.batch_size * per_query
    room = memory.ram_bytes()
    if room is not None and need <= room:
        return
    room = max(room or 0, memory.gpu_bytes()) or None  # the largest GPU, asked only when the RAM is short
    if room is None or need <= room:
        return
    held = (f"2 x {spec.vocab:,} float32 logits and probabilities and {answer:,} token ids" if spec.vocab else
            f"{answer:,} token ids, logits not counted: {cfg.model_name}'s vocabulary is not known here")
    if per_query > room:
        raise ConfigError(f"response_length_max: {cfg.response_length_max:,} tokens cannot fit this machine's memory "
                          f"({_gib(room)}): generating one answer holds at least {_gib(per_query)} ({held}); at most "
                          f"{room // 8 - (spec.vocab or 0) - 1:,} here, and far fewer in practice")
    raise ConfigError(f"batch_size: {cfg.batch_size:,} queries cannot fit this machine's memory ({_gib(room)}): "
                      f"generating their answers holds at least {_gib(need)} at once (per "
                      f"query: {held}); at most {room // per_query:,} here, and fewer in practice (the model and its "
                      "KV cache need memory too)")


def _gib(n: int) -> str:
    return f"{n / memory.GIB:,.1f} GiB"


def run_identity(run_dir: Path) -> tuple[str, str | None]:
    """(method, task) of the run in ``run_dir``, from its manifest; runs from before the manifest: a CORY run's
    config has swap_period."""
    import yaml

    manifest = read_manifest(run_dir) or {}
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    return (manifest.get("method") or ("cory" if "swap_period" in saved else "ppo"),
            manifest.get("task") or saved.get("task"))


def check_identity(run_dir: Path, method: str, task: str | None) -> None:
    """The run in ``run_dir`` is one that ``method``'s script of ``task`` continues (None: any task); else one line
    naming the script that does."""
    was, was_task = run_identity(run_dir)
    if was != method or (task and was_task and was_task != task):
        raise ConfigError(f"resume: {run_dir} is a {was} run on the {was_task} task; continue it with "
                          f"{was_task}_train/{was}.py")


def nothing_to_do(cfg: PPOArgs) -> str | None:
    """For ``--resume`` of a run that has done its ``steps`` iterations and holds its final models: the line that
    says so, and the resume then changes nothing (no config, row, evaluation or model rewritten); else None."""
    run_dir = Path(cfg.output_dir)
    done = checkpoints(run_dir)
    if cfg.resume is None or not done or done[-1][0] != cfg.steps:
        return None
    if not final_complete(run_dir, method_of(cfg).agents):
        return None  # cut off while saving them (a final/ from before they were written whole): the resume writes them
    return (f"nothing to do: {run_dir} has done its {cfg.steps} iterations and holds its final models; nothing "
            "changed (--steps N, more iterations, extends it)")


def check_resumable(run_dir: Path, cfg: PPOArgs, fingerprint: str | None = None) -> Path | None:
    """The run in ``run_dir`` is one this script continues (same method and task), what the resume replaces was
    written here, its newest checkpoint's state can be read, and its base model is the one ``fingerprint`` describes
    now (``weights_fingerprint``). Returns that checkpoint; None when there is none (the run starts again from
    iteration 0)."""
    method = method_of(cfg)
    check_identity(run_dir, method.name, cfg.task)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:  # the run would start again from iteration 0, deleting every row
        refusal = restart_refusal(run_dir)
        if refusal:
            raise ConfigError(f"resume: {refusal} and no checkpoint to resume from; resuming would start it again "
                              "and delete them, so it refuses: leave it as it is and start a new run in another "
                              f"folder (--config {run_dir / 'config.yaml'} --output_dir NEW)")
        return None
    refusal = evaluation_refusal(run_dir)  # continuing replaces the final models they describe
    if refusal:
        raise ConfigError(f"resume: {refusal}; continuing the run replaces the models it describes and would delete "
                          f"it, so it refuses: move it out of {run_dir}, then resume")
    state = load_checkpoint_file(checkpoint / "state.pt")
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
    for name in method.agents:
        if not (checkpoint / f"{name}.pt").is_file():
            raise ConfigError(f"resume: {checkpoint} has no {name}.pt; is it a {method.name} run?")
        check_checkpoint_file(checkpoint / f"{name}.pt")
    check_one_checkpoint(checkpoint, state, method.agents)
    return checkpoint


def check_one_checkpoint(checkpoint: Path, state: dict, agents) -> None:
    """The files of ``checkpoint`` were saved together: its state.pt's step is the folder's (a state copied from
    another step would resume from that step, on weights trained further or less), and each agent file is the one
    whose sha256 it records (not copied in from another step, seed or method). A checkpoint saved before it
    recorded them is taken as whole, with a warning: the step is still checked."""
    aside = f"move {checkpoint} aside to resume from an older checkpoint, or start again with --overwrite"
    folder_step = int(checkpoint.name.split("_")[-1])
    if state["step"] != folder_step:
        raise ConfigError(f"resume: {checkpoint / 'state.pt'} is the state after {state['step']} iterations, not "
                          f"after {folder_step} as its folder {checkpoint.name} says: it is not that checkpoint's "
                          f"own; {aside}")
    rng = state.get("rng")
    lacking = next((key for key in ("task", "rng") if key not in state), None) or next(
        (f"rng.{key}" for key in ("torch", "numpy", "python", "length") if not isinstance(rng, dict) or key not in rng),
        None)
    if lacking:  # restore() would stop on it with a traceback, after the models have loaded
        raise ConfigError(f"resume: {checkpoint / 'state.pt'} holds no {lacking!r} (damaged, or edited by hand), so "
                          f"the run cannot be restored from it; {aside}")
    recorded = state.get("files")
    if not isinstance(recorded, dict):
        warnings.warn(f"resume: {checkpoint / 'state.pt'} records no digest of its agent files (saved before they "
                      "were recorded); they are taken as its own")
        return
    for name in agents:
        path = checkpoint / f"{name}.pt"
        if recorded.get(path.name) != file_digest(path):
            raise ConfigError(f"resume: {path} is not the file {checkpoint / 'state.pt'} was saved with (its sha256 "
                              "differs: copied from another checkpoint, run or method, or damaged); " + aside)


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


def check_wandb() -> None:
    """wandb will log: installed, and logged in (or told to log offline), before any folder is created."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError("report_to: wandb is not installed (pip install wandb), or use --report_to none")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    try:
        path = os.environ.get("NETRC") or Path.home() / ".netrc"
        host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("//")[-1].rstrip("/")
        if netrc.netrc(path).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise ConfigError("report_to: wandb is not logged in here; run `wandb login`, set WANDB_API_KEY, or "
                      "WANDB_MODE=offline to log locally (or use --report_to none)")
