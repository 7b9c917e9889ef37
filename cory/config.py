"""Hyperparameters: dataclass defaults < YAML preset (``--config``) < ``--field value`` flags.

Every user mistake (unknown field, wrong type, out-of-range value, missing file) raises
``ConfigError`` with one line naming the field, before any model is loaded.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A user mistake in a config file or a flag; the message is one line."""


@dataclass
class PPOArgs:
    """Single-agent PPO (the paper's baseline). The CORY arguments extend these."""

    # run
    task: str = "imdb"
    output_dir: str = "runs/ppo"
    seed: int = 0
    steps: int = 100
    # model
    model_name: str = "gpt2-large"
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    load_in_4bit: bool = False
    # data and reward
    dataset: str = "auto"
    dataset_path: str | None = None
    reward_model: str = "distilbert-imdb"
    score_norm: bool = False
    score_clip: float | None = None
    # PPO (trl PPOConfig)
    learning_rate: float = 1.41e-5
    batch_size: int = 256
    mini_batch_size: int = 256
    gradient_accumulation_steps: int = 1
    ppo_epochs: int = 4
    init_kl_coef: float = 0.3
    adap_kl_ctrl: bool = True
    target: float = 6.0
    horizon: float = 10000.0
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_penalty: str = "full"
    max_grad_norm: float | None = None
    # memory: the most tokens one forward pass of a PPO step may hold (real tokens when passes are packed,
    # samples x longest sequence when padded); a mini-batch over it runs as several passes whose gradients
    # add up to the one-pass gradient; 0 = no limit
    max_pass_tokens: int = 0
    # generation: one response length per batch, drawn from [min, max] (the paper's LengthSampler(4, 16))
    response_length_min: int = 4
    response_length_max: int = 15
    # False (the paper's regime): an answer runs to its drawn length, EOS cannot end it sooner. GPT-2 practically
    # never emits EOS within 4-15 tokens, but an instruct model does, and PPO then learns to end every answer at
    # once. True lets EOS end an answer early (GSM8K: answers end where the model stops)
    allow_early_eos: bool = False
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.1
    # outputs
    save_every: int = 25
    keep_checkpoints: int = 1
    samples_per_step: int = 4
    report_to: str = "none"
    on_nonfinite: str = "stop"
    resume: str | None = None
    overwrite: bool = False


@dataclass
class CoryArgs(PPOArgs):
    """CORY: two PPO agents, pioneer and observer, exchanging roles."""

    output_dir: str = "runs/cory"
    swap_period: int = 5
    other_reward_coef: float = 1.0
    knowledge_transfer: bool = True
    reset_on_swap: bool = False


TASKS = ("imdb", "gsm8k")
DATASETS = {"imdb": ("auto", "hub", "builtin"), "gsm8k": ("auto", "hub", "local", "generated")}
KL_PENALTIES = ("full", "kl", "abs", "mse")
REPORT_TO = ("none", "wandb")
ON_NONFINITE = ("stop", "skip")
# run-control fields that describe one invocation, not the experiment
INVOCATION_FIELDS = ("resume", "overwrite")


def _field_types(cls) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _allowed(tp) -> tuple[type, bool]:
    """(base type, optional?) of an annotation like ``float | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        base = [a for a in args if a is not type(None)]
        return base[0], type(None) in args
    return tp, False


def _coerce(name: str, value, tp, from_cli: bool):
    base, optional = _allowed(tp)
    if value is None or (from_cli and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{name}: must be a {base.__name__}, got none")
    if from_cli:
        text = value
        try:
            if base is bool:
                low = text.lower()
                if low in ("true", "1", "yes", "on"):
                    return True
                if low in ("false", "0", "no", "off"):
                    return False
                raise ValueError
            if base is int:
                return int(text)
            if base is float:
                return float(text)
            return str(text)
        except ValueError:
            raise ConfigError(f"{name}: expected a {base.__name__}, got {text!r}") from None
    # YAML values are already typed: accept only the declared type (ints where floats go)
    if base is float and isinstance(value, str) and _YAML_11_FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
    if base is bool:
        ok = isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{name}: expected a {base.__name__}, got {value!r}")
    return value


_YAML_11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def load_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config: {path} is not valid YAML{where}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config: {path} is not a text file") from None
    except (ValueError, OverflowError, RecursionError) as e:  # e.g. a date like 2024-02-30, absurd nesting
        raise ConfigError(f"config: {path} is not valid YAML ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise ConfigError(f"config: cannot read {path} ({e.strerror})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must be a mapping of field: value, got {type(data).__name__}")
    return data


def build(cls, overrides: dict | None = None, cli: dict | None = None):
    """An instance of ``cls`` from YAML-typed ``overrides`` and string-typed ``cli`` values."""
    types_ = _field_types(cls)
    values = {}
    for source, from_cli in ((overrides or {}), False), ((cli or {}), True):
        for key, value in source.items():
            if not isinstance(key, str) or key not in types_:
                raise ConfigError(f"unknown field {key!r}; see --help for the allowed fields")
            values[key] = _coerce(key, value, types_[key], from_cli)
    cfg = cls(**values)
    validate(cfg)
    return cfg


def _one_of(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}")


def validate(cfg: PPOArgs) -> None:
    """Range and consistency checks that need no model."""
    from cory.assets import MODEL_SPECS_HELP, SMOLLM2_SPEC, TINY_SPEC, is_valid_model_spec

    def positive(name, integer=True):
        v = getattr(cfg, name)
        if v <= 0 or (not integer and not math.isfinite(v)):
            raise ConfigError(f"{name}: must be > 0, got {v}")

    def finite(name):
        v = getattr(cfg, name)
        if v is not None and not math.isfinite(v):
            raise ConfigError(f"{name}: must be a finite number, got {v}")

    for f in fields(cfg):
        if isinstance(getattr(cfg, f.name), float):
            finite(f.name)
    _one_of("task", cfg.task, TASKS)
    _one_of("dataset", cfg.dataset, DATASETS[cfg.task])
    for name in ("steps", "batch_size", "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs",
                 "response_length_min", "save_every", "keep_checkpoints", "lora_r", "lora_alpha"):
        positive(name)
    for name in ("learning_rate", "target", "horizon", "temperature", "repetition_penalty"):
        positive(name, integer=False)
    if not 0 <= cfg.seed < 2 ** 31:  # numpy seeds below 2**32, and each process adds its rank
        raise ConfigError(f"seed: must be in [0, 2**31), got {cfg.seed}")
    if not cfg.output_dir.strip():
        raise ConfigError("output_dir: must not be empty")
    if cfg.resume is not None and not cfg.resume.strip():
        raise ConfigError("resume: must name a run folder")
    if cfg.max_pass_tokens < 0:
        raise ConfigError(f"max_pass_tokens: must be >= 0 (0 = no limit), got {cfg.max_pass_tokens}")
    if cfg.samples_per_step < 0:
        raise ConfigError(f"samples_per_step: must be >= 0, got {cfg.samples_per_step}")
    if cfg.top_k < 0:
        raise ConfigError(f"top_k: must be >= 0 (0 = off), got {cfg.top_k}")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError(f"top_p: must be in (0, 1], got {cfg.top_p}")
    if cfg.init_kl_coef < 0:
        raise ConfigError(f"init_kl_coef: must be >= 0, got {cfg.init_kl_coef}")
    for name in ("gamma", "lam"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise ConfigError(f"{name}: must be in [0, 1], got {getattr(cfg, name)}")
    for name in ("cliprange", "cliprange_value", "vf_coef"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}: must be >= 0, got {getattr(cfg, name)}")
    if not 0 <= cfg.lora_dropout < 1:
        raise ConfigError(f"lora_dropout: must be in [0, 1), got {cfg.lora_dropout}")
    for name in ("max_grad_norm", "score_clip"):
        v = getattr(cfg, name)
        if v is not None and v <= 0:
            raise ConfigError(f"{name}: must be > 0 or none, got {v}")
    if cfg.response_length_max < cfg.response_length_min:
        raise ConfigError(
            f"response_length_max: must be >= response_length_min ({cfg.response_length_min}), "
            f"got {cfg.response_length_max}")
    backward = cfg.mini_batch_size * cfg.gradient_accumulation_steps
    if cfg.batch_size % backward:
        raise ConfigError(
            f"batch_size: {cfg.batch_size} is not divisible by mini_batch_size * gradient_accumulation_steps "
            f"= {cfg.mini_batch_size} * {cfg.gradient_accumulation_steps}")
    _one_of("kl_penalty", cfg.kl_penalty, KL_PENALTIES)
    _one_of("report_to", cfg.report_to, REPORT_TO)
    _one_of("on_nonfinite", cfg.on_nonfinite, ON_NONFINITE)
    if not is_valid_model_spec(cfg.model_name):
        raise ConfigError(f"model_name: {cfg.model_name!r} is not a model spec; allowed: {MODEL_SPECS_HELP}")
    if cfg.model_name not in (TINY_SPEC, SMOLLM2_SPEC) and Path(cfg.model_name).expanduser().is_dir():
        _model_folder("model_name", Path(cfg.model_name).expanduser())
    if cfg.task == "imdb":
        from cory.tasks.imdb import REWARD_NAMES
        if cfg.reward_model not in REWARD_NAMES and not Path(cfg.reward_model).is_dir():
            raise ConfigError(
                f"reward_model: {cfg.reward_model!r} is not one of {', '.join(REWARD_NAMES)} or a local model folder")
        if cfg.reward_model not in REWARD_NAMES:
            id2label = _model_folder("reward_model", Path(cfg.reward_model)).get("id2label")
            labels = [str(v) for v in id2label.values()] if isinstance(id2label, dict) else []
            if "positive" not in (label.lower() for label in labels):
                raise ConfigError(f"reward_model: {cfg.reward_model} has no POSITIVE label (its labels: {labels})")
    elif cfg.reward_model not in ("correctness",):
        raise ConfigError(f"reward_model: {cfg.reward_model!r} is not allowed for gsm8k; allowed: correctness")
    if cfg.dataset == "local" and not cfg.dataset_path:
        raise ConfigError("dataset_path: required when dataset is local")
    if cfg.dataset_path is not None:
        p = Path(cfg.dataset_path)
        if not p.is_dir():
            raise ConfigError(f"dataset_path: folder not found: {cfg.dataset_path}")
        if cfg.task == "gsm8k":
            for split in ("train", "test"):
                if not (p / f"{split}.jsonl").is_file():
                    raise ConfigError(f"dataset_path: {p / (split + '.jsonl')} not found")
    if cfg.resume is not None and cfg.overwrite:
        raise ConfigError("overwrite: cannot be combined with resume")
    if isinstance(cfg, CoryArgs):
        if cfg.swap_period < 0:
            raise ConfigError(f"swap_period: must be >= 0 (0 = never exchange roles), got {cfg.swap_period}")


def _model_folder(name: str, folder: Path) -> dict:
    """The config.json of a local model folder (a folder without one is a mistake, not a model)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise ConfigError(f"{name}: {folder} is not a model folder (no config.json)") from None
    except (OSError, ValueError):
        raise ConfigError(f"{name}: {folder}/config.json is not readable JSON") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{name}: {folder}/config.json is not a model config")
    return config


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def field_help(cls) -> list[tuple[str, str, object]]:
    """(name, type, default) of every field, for --help."""
    out = []
    for f, tp in zip(fields(cls), _field_types(cls).values()):
        base, optional = _allowed(_field_types(cls)[f.name])
        out.append((f.name, base.__name__ + (" | none" if optional else ""), f.default))
    return out
