"""Everything that can be checked before a model loads, gathered from the layers that know it: the values
alone (``cory.config``), the model spec (``cory.assets``), the task, reward and data (``cory.tasks``), and the
run folder: whether the run may start, resume, continue or overwrite there (``cory.run.run_rules``). A mistake raises
ConfigError with one line; nothing has been written yet."""
from __future__ import annotations

import importlib.util
import netrc
import os
from dataclasses import dataclass
from pathlib import Path

from cory.device import memory
from cory.assets import (HUB, SMOLLM2_SPEC, UNREACHABLE, HubAsset, ModelSpec, check_4bit, hub_unavailable,
                         model_spec, weights_fingerprint)
from cory.config import PPOArgs
from cory.errors import AssetError, ConfigError
from cory.method import method_of
from cory.run.run_rules import check_output_dir, check_resumable
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
    return spec


REPO = Path(__file__).resolve().parents[2]  # where the presets are (configs/<task>/<method>_<preset>.yaml)


def hub_assets(cfg: PPOArgs, spec: ModelSpec | None = None) -> list[HubAsset]:
    """Every Hugging Face hub repository a run of ``cfg`` fetches, from the config and the disk alone (nothing is
    downloaded and the hub is not asked): the model where ``model_name`` is a hub id (the policy, the reference
    and the tokenizer), then what the task's own rules fetch (``register_task(hub_assets=...)``: IMDB's classifier
    reward and its reviews, GSM8K's openai/gsm8k unless ``dataset_path`` is set)."""
    if spec is None:
        try:
            spec = model_spec(cfg.model_name)
        except AssetError as e:
            raise ConfigError(str(e)) from None
    found = []
    if spec.kind == HUB:
        found.append(HubAsset("model_name", cfg.model_name, offline=f"--model_name a local model folder (or "
                                                                     f"{SMOLLM2_SPEC})"))
    task = task_spec(cfg.task)
    if task.hub_assets is None:
        return found
    try:
        listed = list(task.hub_assets(cfg))
    except Exception as e:  # noqa: BLE001 - a plug-in's own bug, named with its place
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"task {cfg.task}: hub_assets() raised {type(e).__name__}: {first} (registered at "
                          f"{task.where})") from None
    if not all(isinstance(asset, HubAsset) for asset in listed):
        raise ConfigError(f"task {cfg.task}: hub_assets() must return cory.assets.HubAsset values (registered at "
                          f"{task.where})")
    return found + listed


def check_hub(cfg: PPOArgs, spec: ModelSpec | None = None) -> None:
    """The hub assets a run cannot go without (``hub_assets``) are in the local cache or on the hub, asked before any
    model loads; else one AssetError naming all of them (and those whose task would fall back), with what runs
    offline instead, so that a run does not name a model, then a reward, then a dataset in three runs."""
    missing, unreachable = [], False
    for asset in hub_assets(cfg, spec):
        why = hub_unavailable(asset.repo_id, asset.repo_type, ask=not unreachable)  # one unreachable hub is enough
        if why is not None:
            missing.append((asset, why))
            unreachable = unreachable or why == UNREACHABLE
    if all(asset.fallback is not None for asset, _ in missing):
        return  # nothing missing, or only what the task replaces by its own rule (and says so when it does)
    reasons = set(why for _, why in missing)
    named = [f"{a.repo_type} '{a.repo_id}' ({a.field}" + (f" {cfg.dataset}" if a.field == "dataset" else "")
             + (f": else {a.fallback}" if a.fallback else "") + (f"; {why}" if len(reasons) > 1 else "") + ")"
             for a, why in missing]
    one = len(named) == 1
    listed = named[0] if one else f"{', '.join(named[:-1])} and {named[-1]}"
    reason = f" and {reasons.pop()}" if len(reasons) == 1 else ""
    preset = Path("configs", cfg.task, f"{cfg.method}_cpu.yaml")
    instead = (f"--config {preset} (the embedded model)" if (REPO / preset).is_file() else
               f"--model_name {SMOLLM2_SPEC}")
    each = ", ".join(a.offline for a, _ in missing if a.offline)
    each = f", or set in {'its' if one else 'their'} place {each}" if each else ""
    raise AssetError(f"{listed} {'is' if one else 'are'} not in the local Hugging Face cache{reason}; to run offline "
                     f"use {instead} instead{each} (docs/gpu.md)")


def check_run(cfg: PPOArgs) -> RunPlan:
    """Every check a training run makes before it writes anything or loads a model: the config (above), the hub
    assets it needs (``check_hub``), then what the run will write: its folder, what it may replace or continue, and
    the loggers it reports to (before the folder is created). Returns what the run needs of it. (The ``--resume`` of
    a finished run is asked first, ``run_rules.nothing_to_do``, and checks nothing.)"""
    spec = check_config(cfg)
    check_hub(cfg, spec)  # before the 4-bit check: the offline preset it names needs no GPU either
    if cfg.load_in_4bit:
        check_4bit()
        if not cfg.use_peft:
            raise ConfigError("load_in_4bit: needs use_peft: true (4-bit weights cannot be trained directly)")
    check_output_dir(cfg.output_dir, resume=cfg.resume is not None, overwrite=cfg.overwrite, method=cfg.method,
                     task=cfg.task)
    # after the folder's checks: hashing a large local model must not delay a refusal of the folder
    fingerprint = weights_fingerprint(spec)  # what a checkpoint records of the base model, and a resume compares
    resumed = check_resumable(Path(cfg.output_dir), cfg, fingerprint) if cfg.resume is not None else None
    if cfg.report_to == "wandb":
        check_wandb()
    if cfg.report_to == "tensorboard":
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("report_to: tensorboard is not installed (pip install tensorboard), or use "
                              "--report_to none")
    resume_from, state = resumed or (None, {})
    trained = state.get("precision")
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
