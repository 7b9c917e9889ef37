"""Hyperparameters: the fields, their meaning, defaults and the checks that need nothing else.

Values come from a training script's ``Hyperparameters`` subclass (its task's paper values: this module
gives none), then a YAML preset (``--config``), then ``--field value`` flags. Every user mistake (unknown
field, wrong type, out-of-range value, unreadable file) raises ``ConfigError`` with one line naming the field,
before any model is loaded.

This module is the bottom of the package: it imports nothing of ``cory`` but its errors. Checks that need to know the
models, rewards or data live with them (``cory.run.preflight`` gathers them, still before any model loads).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from cory.errors import ConfigError

REQUIRED = dataclasses.MISSING  # a field without a default: the training script states its value


def arg(default, help: str, *, trl: bool = False, on_resume: bool = False, choices: tuple = (), auto: bool = False):
    """A documented field. ``default`` REQUIRED: the script sets it (a paper value has its one home there);
    ``trl``: passed on to trl's PPOConfig under the same name; ``on_resume``: may change when a run is resumed
    (it does not change what the run learns); ``choices``: the allowed values; ``auto``: the word "auto" is
    allowed besides the field's type."""
    meta = {"help": help, "trl": trl, "on_resume": on_resume, "choices": choices, "auto": auto}
    if default is REQUIRED:
        # keyword-only, so a required field may follow fields with defaults
        return field(kw_only=True, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class PPOArgs:
    """Single-agent PPO (the paper's baseline); the CORY arguments extend these.

    Only the fields; their values are the training scripts'. A field whose value the paper gives (a
    hyperparameter of its Tables 1 and 2, the model, the reward) has no default here: each task's ``ppo.py``
    states it, and ``cory.py`` states only what CORY adds or changes, so no second copy can disagree with
    the script a user edits. The defaults below are switches that are off (no LoRA, no top-k, no clipping)
    or the project's own engineering choices (precision, checkpoints, logging)."""

    method = "ppo"  # the method these fields configure (cory.method.METHODS); a class attribute, not a field

    # ---- the run
    task: str = arg(REQUIRED, "the task: prompts, reward and data (a name registered with "
                    "cory.tasks.register_task)")
    output_dir: str = arg(REQUIRED, "the run's folder (config, metrics, samples, checkpoints, final models); a "
                          "leading ~ is your home folder", on_resume=True)
    seed: int = arg(0, "seeds data order, sampling and initialisation", trl=True)
    steps: int = arg(REQUIRED, "PPO iterations (one batch each); raise it with --resume RUN to extend a run (a "
                     "finished one needs keep_resume_checkpoint: true)", on_resume=True)
    # ---- the model
    model_name: str = arg(REQUIRED, "'tiny', 'embedded:smollm2-135m', a model folder or a hub id", trl=True)
    use_peft: bool = arg(False, "train LoRA adapters (and the value head) instead of every weight")
    lora_r: int | None = arg(None, "LoRA rank (needed with use_peft)")
    lora_alpha: int | None = arg(None, "LoRA scaling alpha (needed with use_peft)")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    load_in_4bit: bool = arg(False, "the frozen base in 4 bit (bitsandbytes, CUDA only; needs use_peft)")
    # ---- data and reward: the values a task allows are its own (--help of its script lists them)
    dataset: str = arg("auto", "where prompts come from (auto: the task's best source available here)")
    dataset_path: str | None = arg(None, "a folder of data files, for a task that reads them (selects dataset "
                                   "local)")
    reward_model: str = arg(REQUIRED, "the task's reward (a value the task allows)")
    score_norm: bool = arg(False, "normalise training scores by their running mean and std (the authors' "
                           "use_score_scaling + use_score_norm; trl 0.11.4's own option crashes)")
    score_clip: float | None = arg(None, "clip training scores to [-score_clip, score_clip]", trl=True)
    # ---- PPO (trl's PPOConfig)
    learning_rate: float = arg(REQUIRED, "Adam learning rate", trl=True)
    batch_size: int = arg(REQUIRED, "answers per iteration, num_generations per prompt (per process in data-parallel "
                          "runs)", trl=True)
    mini_batch_size: int = arg(REQUIRED, "answers per optimizer step", trl=True)
    gradient_accumulation_steps: int = arg(1, "mini-batches whose gradients add up to one optimizer step "
                                           "(1 = none)", trl=True)
    ppo_epochs: int = arg(REQUIRED, "passes over each batch", trl=True)
    init_kl_coef: float = arg(REQUIRED, "eta, the KL penalty's starting coefficient", trl=True)
    adap_kl_ctrl: bool = arg(REQUIRED, "adapt eta towards the target KL (Ziegler et al.)", trl=True)
    target: float = arg(REQUIRED, "the adaptive controller's target KL", trl=True)
    horizon: float = arg(REQUIRED, "the adaptive controller's horizon", trl=True)
    gamma: float = arg(REQUIRED, "discount", trl=True)
    lam: float = arg(REQUIRED, "GAE lambda", trl=True)
    cliprange: float = arg(REQUIRED, "policy ratio clip", trl=True)
    cliprange_value: float = arg(REQUIRED, "value clip", trl=True)
    vf_coef: float = arg(REQUIRED, "value loss weight", trl=True)
    kl_penalty: str = arg(REQUIRED, "per-token KL estimate: full = the full-vocabulary KL(pi || pi0)", trl=True,
                          choices=("full", "kl", "abs", "mse"))
    max_grad_norm: float | None = arg(None, "clip the gradient norm (none = no clipping)", trl=True)
    ratio_threshold: float = arg(10.0, "a mini-batch whose mean probability ratio passes this takes no update "
                                 "(trl's rule and default)", trl=True)
    # ---- the learner switch (cory.ppo.advantages): the methods differ only in the advantage; the clipped policy
    # loss and the KL penalty in the reward (eta and its controller) are the same for all
    advantage_estimator: str = arg("gae", "gae = PPO's critic: a value head and GAE; rloo = no value head, each "
                                   "answer's score less the mean score of the other answers to its prompt; grpo = no "
                                   "value head, scores normalised within each prompt's answers (mean 0, std 1)",
                                   choices=("gae", "rloo", "grpo"))
    num_generations: int = arg(1, "answers per prompt, K (rloo and grpo need 2 or more); batch_size counts answers, "
                               "so batch_size 32 with K 4 is 8 prompts")
    # a random head gives SmolLM2-135M values of -1.2 +- 0.7 from token to token against a 0/1 reward, so the first
    # advantages are mostly its noise (results/arithmetic_cpu_pilot/DESIGN.md, stage 6)
    value_head_init: str = arg("trl", "the value head's starting weights: trl = trl's random linear layer; zero = "
                               "weights and bias 0, so the first advantages come from the returns alone and the "
                               "value loss sends no gradient into the model until the head has moved",
                               choices=("trl", "zero"))
    # ---- precision: tf32 measured 2.3x faster than fp32 for PPO at the paper's IMDB shapes on an H100; on a CPU, bf16
    # paid only on AVX-512 BF16 without AMX (emulated it is slower, on AMX not reliably faster): benchmarks/README.md
    precision: str = arg("auto", "auto: tf32 on CUDA, bf16 on a CPU with AVX-512 BF16 and no AMX (where it was "
                         "measured faster), fp32 on other CPUs; fp32: exact float32; tf32: float32 weights, TF32 matmuls on CUDA (a no-op on "
                         "a CPU); bf16: bfloat16 compute (generation and PPO passes) with float32 weights, Adam "
                         "state, log-probabilities and KL", choices=("auto", "fp32", "tf32", "bf16"))
    # ---- speed and memory (results do not change, up to float rounding)
    fast_ppo: bool = arg(True, "cory.passes: PPO passes on the response window, packed, within max_pass_tokens, "
                         "fused Adam; false = trl's stock PPOTrainer and Adam", on_resume=True)
    max_pass_tokens: int | str = arg("auto", "the most tokens one forward pass of a PPO step may hold (packed: "
                                     "real tokens; padded: samples x longest); a mini-batch over it runs as several "
                                     "passes whose gradients add up to the one-pass gradient; 0 = no limit; auto = "
                                     "measured from the GPU's free memory at the first step (no limit on a CPU)",
                                     on_resume=True, auto=True)
    # ---- generation: one response length per batch, uniform in [min, max] (the paper's LengthSampler)
    response_length_min: int = arg(REQUIRED, "shortest answer, in tokens")
    response_length_max: int = arg(REQUIRED, "longest answer, in tokens")
    # GPT-2 practically never emits EOS within 4-15 tokens, so the paper's IMDB answers have the drawn length; an
    # instruct model does emit it, and PPO then learns to end every answer at once
    allow_early_eos: bool = arg(REQUIRED, "false: every answer runs to its drawn length (EOS masked until then); "
                                "true: EOS (or the task's stop string) may end it sooner")
    top_k: int = arg(0, "sampling top-k (0 = off)")
    top_p: float = arg(1.0, "sampling nucleus (1 = off)")
    temperature: float = arg(1.0, "sampling temperature (1 = the policy's own distribution)")
    repetition_penalty: float = arg(1.0, "sampling repetition penalty (1 = off)")
    # ---- outputs and faults
    save_every: int = arg(25, "iterations between checkpoints", on_resume=True)
    # HF Trainer's names and meanings (TrainingArguments); its save_total_limit defaults to none, every one kept
    save_total_limit: int | None = arg(1, "checkpoints kept, the newest (none = every one, HF Trainer's default); "
                                       "keep_checkpoints, its name before, is still read", on_resume=True)
    # a finished run's last checkpoint is what --resume RUN --steps N extends it from; a 135M CORY run's is 3.2 GB
    keep_resume_checkpoint: bool = arg(False, "keep the run's checkpoint once its final models are written, so that "
                                       "--resume RUN --steps N can extend it exactly; false = delete the run's "
                                       "checkpoint files then (a stopped run keeps its checkpoint either way)",
                                       on_resume=True)
    final_dtype: str = arg("training", "the final models' weights (final/): training = in the dtype they trained in "
                           "(float32); bf16 = bfloat16, half the size", choices=("training", "bf16"))
    save_only_model: bool = arg(False, "checkpoints without the optimizer state (Adam's moments, two thirds of a full "
                                "one): a --resume from one starts Adam afresh, so it is not exact (it warns)",
                                on_resume=True)
    samples_per_step: int = arg(4, "queries and answers written to samples.jsonl per iteration", on_resume=True)
    eval_every: int = arg(0, "every N iterations (and before the first and after the last) score each agent on the "
                          "task's held-out prompts: reward, KL to the base model, distinct-n, repeats, to eval.jsonl "
                          "(reward tasks; its sampling leaves training's random streams alone); 0 = never",
                          on_resume=True)
    report_to: str = arg("none", "also log metrics to wandb (in OUT/wandb) or tensorboard (in OUT/tensorboard)",
                         on_resume=True, choices=("none", "wandb", "tensorboard"))
    on_nonfinite: str = arg("stop", "a non-finite reward: stop (after saving) or skip the batch", on_resume=True,
                            choices=("stop", "skip"))
    resume: str | None = arg(None, "continue the run in this folder from its newest checkpoint", on_resume=True)
    overwrite: bool = arg(False, "replace the run already in output_dir (only ever a run folder)", on_resume=True)


# the fields that trl's PPOConfig takes under the same name and meaning (all of them PPOArgs')
TRL_FIELDS = tuple(f.name for f in fields(PPOArgs) if f.metadata.get("trl"))


@dataclass
class CoryArgs(PPOArgs):
    """CORY: two PPO agents, pioneer and observer, exchanging roles (arXiv 2410.06101)."""

    method = "cory"

    swap_period: int = arg(REQUIRED, "iterations between role exchanges (the paper's T_REx); 0 = never (ablation)")
    other_reward_coef: float = arg(REQUIRED, "reward = own + coef * partner's: 1 collective (the paper), "
                                   "0 independent, -1 competitive")
    knowledge_transfer: bool = arg(REQUIRED, "the observer reads the pioneer's answer; false = only the query "
                                   "(ablation)")
    reset_on_swap: bool = arg(False, "fresh Adam moments, KL coefficient and score statistics at each exchange "
                              "(the authors' code reloads its trainers at each exchange: Harry67Hu/CORY "
                              "imdb_train/cory.py)")


# run-control fields that describe one invocation, not the experiment
INVOCATION_FIELDS = ("resume", "overwrite")
# a field's name before it was renamed -> its name now: read in config files, flags and saved runs' config.yaml
RENAMED = {"keep_checkpoints": "save_total_limit"}
# folders, where a leading ~ is the home folder
PATH_FIELDS = ("output_dir", "dataset_path", "resume")
SEED_LIMIT = 2 ** 31  # numpy seeds below 2**32, and each process adds its rank


def on_resume_fields(cls) -> tuple[str, ...]:
    """The fields that do not change what a run learns: a resume may change them, and the experiment runner
    counts a finished run made with other values as done."""
    return tuple(f.name for f in fields(cls) if metadata(cls, f.name)["on_resume"])


def field_types(cls) -> dict[str, typing.Any]:
    """Each field of the config class ``cls`` with its annotation, resolved."""
    return typing.get_type_hints(cls)


def allowed_type(tp) -> tuple[type, bool]:
    """(base type, optional?) of an annotation like ``float | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        base = [a for a in args if a is not type(None)]
        return base[0], type(None) in args
    return tp, False


def metadata(cls, name: str) -> dict:
    """A field's documentation; a script's subclass that only changes a default keeps its base's."""
    for klass in cls.__mro__:
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and f.metadata.get("help"):
            return dict(f.metadata)
    return {"help": "", "trl": False, "on_resume": False, "choices": (), "auto": False}


def _coerce(name: str, value, tp, from_cli: bool):
    base, optional = allowed_type(tp)
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
            raise ConfigError(f"{name}: expected a {base.__name__}, got {short(text)}") from None
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
        raise ConfigError(f"{name}: expected a {base.__name__}, got {short(value)}")
    return value


_YAML_11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


# a config is a few dozen short fields: anything far bigger is a mistake, or an alias bomb (a few lines of
# nested aliases that expand to billions of values)
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000


class _Loader(yaml.SafeLoader):
    """safe_load that refuses a key given twice (YAML keeps the later one, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        # a merge key (<<: *anchor) brings another mapping's keys, which the mapping's own keys may override: only
        # its own keys are checked for repeats, and the merge is then resolved as YAML defines it
        own = [(k, v) for k, v in node.value if k.tag != "tag:yaml.org,2002:merge"]
        if len(own) != len(node.value):
            self.flatten_mapping(node)
        for key_node, _ in own:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise ConfigError(f"config: {self.name}: {short(key)} is given twice (lines {seen[key]} and {line})")
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep)


def _count_values(node, limit: int) -> int:
    """The values ``node`` stands for once its aliases are expanded, counting up to ``limit`` only (an alias
    is the same node object met again, so the walk stops long before a bomb would be built)."""
    count, stack = 0, [node]
    while stack and count <= limit:
        n = stack.pop()
        count += 1
        if isinstance(n, yaml.MappingNode):
            stack.extend(v for pair in n.value for v in pair)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return count


def load_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config: file not found: {path}")
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config: {path} is {size / 2**20:.1f} MiB; a config file is a few dozen field: value "
                              f"lines (at most {MAX_CONFIG_BYTES >> 20} MiB)")
        loader = _Loader(p.read_text(encoding="utf-8"))
        loader.name = str(path)
        try:
            node = loader.get_single_node()
            if node is not None and _count_values(node, MAX_CONFIG_VALUES) > MAX_CONFIG_VALUES:
                raise ConfigError(f"config: {path} expands to more than {MAX_CONFIG_VALUES:,} values (aliases nested "
                                  "in aliases?); a config file is a few dozen field: value lines")
            data = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config: {path} is not valid YAML{where}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                          "save it as UTF-8") from None
    except (ValueError, OverflowError, RecursionError) as e:  # e.g. a date like 2024-02-30, absurd nesting
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config: {path} is not valid YAML ({type(e).__name__}: {short(str(e))})") from None
    except OSError as e:
        raise ConfigError(f"config: cannot read {path} ({e.strerror})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must be a mapping of field: value, got {type(data).__name__}")
    return renamed(data, str(path))


def renamed(values: dict, source: str) -> dict:
    """``values`` with each field given under its old name (``RENAMED``) under its name now; both names at once is
    a mistake (``source``: where they came from, for the error)."""
    out = dict(values)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise ConfigError(f"{old}: {source} gives it and {new}, its name now; give {new} only")
            out[new] = out.pop(old)
    return out


def short(value, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters: an error names the value without repeating all of it."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."


def build(cls, overrides: dict | None = None, cli: dict | None = None):
    """An instance of ``cls`` from YAML-typed ``overrides`` and string-typed ``cli`` values."""
    types_ = field_types(cls)
    values = {}
    for source, from_cli in (renamed(overrides or {}, "the config"), False), (renamed(cli or {}, "the flags"), True):
        for key, value in source.items():
            if not isinstance(key, str) or key not in types_:
                raise ConfigError(f"unknown field {short(key)}; see --help for the allowed fields")
            if metadata(cls, key).get("auto") and isinstance(value, str) and value.strip().lower() == "auto":
                values[key] = "auto"
            else:
                values[key] = _coerce(key, value, types_[key], from_cli)
    for key in PATH_FIELDS:  # a shell expands ~ in a flag, but not in a YAML file or after --field=
        if isinstance(values.get(key), str):
            values[key] = os.path.expanduser(values[key])
    missing = [f.name for f in fields(cls) if f.name not in values and _is_required(f)]
    if missing:
        raise ConfigError(f"{missing[0]}: no value; {cls.__name__} leaves it to the training script, which states "
                          f"its task's value (or give it in --config or as --{missing[0]})")
    cfg = cls(**values)
    validate(cfg)
    return cfg


def _is_required(f) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _one_of(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name}: {short(value)} is not one of {', '.join(map(str, allowed))}")


def _check_ppo_ranges(cfg: PPOArgs) -> None:
    """The PPO coefficients' ranges: the KL controller, GAE, the clipped losses, LoRA's dropout."""
    # trl's adaptive controller multiplies eta by 1 + clip(KL / target - 1, -0.2, 0.2) x batch / horizon after each
    # step: with horizon <= 0.2 x batch the factor can reach 0 or below and the KL penalty turn into a bonus
    if cfg.adap_kl_ctrl and cfg.horizon <= 0.2 * cfg.batch_size:
        raise ConfigError(f"horizon: {cfg.horizon:g} with batch_size {cfg.batch_size} lets the adaptive KL "
                          f"controller make eta zero or negative (it needs horizon > 0.2 x batch_size = "
                          f"{0.2 * cfg.batch_size:g}; the paper's is 10000), or set adap_kl_ctrl: false")
    for name in ("gamma", "lam"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise ConfigError(f"{name}: must be in [0, 1], got {getattr(cfg, name)}")
    for name in ("cliprange", "cliprange_value", "vf_coef"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}: must be >= 0, got {getattr(cfg, name)}")
    if not 0 <= cfg.lora_dropout < 1:
        raise ConfigError(f"lora_dropout: must be in [0, 1), got {cfg.lora_dropout}")


def has_critic(cfg: PPOArgs) -> bool:
    """Whether the agents learn with a value head (``advantage_estimator: gae``); the critic-free learners load
    none and skip the value loss."""
    return cfg.advantage_estimator == "gae"


def _check_learner(cfg: PPOArgs) -> None:
    """The learner switch: K answers per prompt fill the batch, and a critic-free baseline needs two or more."""
    k = cfg.num_generations
    if cfg.batch_size % k:
        raise ConfigError(f"batch_size: {cfg.batch_size} is not divisible by num_generations {k} (the batch counts "
                          f"answers, {k} per prompt)")
    if not has_critic(cfg) and k < 2:
        raise ConfigError(f"num_generations: {cfg.advantage_estimator} needs at least 2 answers per prompt (its "
                          f"baseline is taken over a prompt's other answers), got {k}")
    if not has_critic(cfg) and not cfg.fast_ppo:
        raise ConfigError(f"advantage_estimator: {cfg.advantage_estimator} needs fast_ppo: true (trl's stock "
                          "PPOTrainer step has GAE only)")


def _check_outputs(cfg: PPOArgs) -> None:
    """What a run keeps on disk."""
    if cfg.save_total_limit is not None and cfg.save_total_limit < 1:
        raise ConfigError(f"save_total_limit: must be >= 1 or none (none = keep every checkpoint), got "
                          f"{cfg.save_total_limit}")


def validate(cfg: PPOArgs) -> None:
    """Range and consistency checks that need nothing but the values."""
    def positive(name, integer=True):
        v = getattr(cfg, name)
        if v <= 0 or (not integer and not math.isfinite(v)):
            raise ConfigError(f"{name}: must be > 0, got {v}")

    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{f.name}: must be a finite number, got {v}")
        choices = metadata(type(cfg), f.name)["choices"]
        if choices:
            _one_of(f.name, v, choices)
    for name in ("steps", "batch_size", "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs",
                 "response_length_min", "save_every", "num_generations"):
        positive(name)
    _check_outputs(cfg)
    _check_learner(cfg)
    for name in ("lora_r", "lora_alpha"):
        if getattr(cfg, name) is None:
            if cfg.use_peft:
                raise ConfigError(f"{name}: needed with use_peft: true")
        elif getattr(cfg, name) <= 0:
            raise ConfigError(f"{name}: must be > 0, got {getattr(cfg, name)}")
    for name in ("learning_rate", "target", "horizon", "temperature", "repetition_penalty", "ratio_threshold"):
        positive(name, integer=False)
    if not 0 <= cfg.seed < SEED_LIMIT:
        raise ConfigError(f"seed: must be in [0, 2**31), got {cfg.seed}")
    if not cfg.task.strip():
        raise ConfigError("task: must not be empty")
    if not cfg.output_dir.strip():
        raise ConfigError("output_dir: must not be empty")
    if not isinstance(cfg.model_name, str) or not cfg.model_name.strip():
        raise ConfigError("model_name: must not be empty")
    if cfg.resume is not None and not cfg.resume.strip():
        raise ConfigError("resume: must name a run folder")
    if cfg.max_pass_tokens != "auto" and (not isinstance(cfg.max_pass_tokens, int) or cfg.max_pass_tokens < 0):
        raise ConfigError(f"max_pass_tokens: must be auto or an integer >= 0 (0 = no limit), got {cfg.max_pass_tokens!r}")
    if cfg.max_pass_tokens not in (0, "auto") and not cfg.fast_ppo:
        raise ConfigError("max_pass_tokens: needs fast_ppo: true (trl's stock PPOTrainer runs a mini-batch in one pass)")
    if cfg.eval_every < 0:
        raise ConfigError(f"eval_every: must be >= 0 (0 = never), got {cfg.eval_every}")
    if cfg.samples_per_step < 0:
        raise ConfigError(f"samples_per_step: must be >= 0, got {cfg.samples_per_step}")
    if cfg.top_k < 0:
        raise ConfigError(f"top_k: must be >= 0 (0 = off), got {cfg.top_k}")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError(f"top_p: must be in (0, 1], got {cfg.top_p}")
    if cfg.init_kl_coef < 0:
        raise ConfigError(f"init_kl_coef: must be >= 0, got {cfg.init_kl_coef}")
    _check_ppo_ranges(cfg)
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
    if cfg.dataset == "local" and not cfg.dataset_path:
        raise ConfigError("dataset_path: required when dataset is local")
    if cfg.resume is not None and cfg.overwrite:
        raise ConfigError("overwrite: cannot be combined with resume")
    if isinstance(cfg, CoryArgs) and cfg.swap_period < 0:
        raise ConfigError(f"swap_period: must be >= 0 (0 = never exchange roles), got {cfg.swap_period}")


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def field_help(cls) -> list[tuple[str, str, object, dict]]:
    """(name, type, default, metadata) of every field, for --help; the default of a field the script must
    state is REQUIRED."""
    out = []
    for f in fields(cls):
        base, optional = allowed_type(field_types(cls)[f.name])
        out.append((f.name, base.__name__ + (" | none" if optional else ""), f.default, metadata(cls, f.name)))
    return out
