"""Loading what a run trains: the tokenizer, the policies (each with trl's value head unless its learner has no
critic: ``PolicyWithoutValueHead``; LoRA optional) and
the one frozen reference model pi0 that every agent's KL penalty is measured against.

Each loader takes a located ``cory.assets.ModelSpec``: the model name resolved once, when the run is prepared
(``cory.assets.locate``, which also builds the offline models and checks a hub id first, so a missing model
fails in seconds), instead of a name each loader would resolve again.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, GPT2Config, LlamaConfig
from trl import AutoModelForCausalLMWithValueHead
from trl.models import PreTrainedModelWrapper

from cory.assets import (GPT2_VOCAB, RANDOM, RANDOM_PREFIX, RANDOM_SHAPES, AssetError, ModelSpec, check_4bit,
                         gpt2_tokenizer, quiet)


def load_tokenizer(spec: ModelSpec, field: str = "model_name"):
    """The tokenizer of ``spec`` with a pad token, padding on the right; a problem names ``field`` (the config's,
    or a command's flag).

    trl's PPO forward passes pad with the tokenizer's side and pass no position ids, so a
    left-padded sequence would be scored at shifted positions (its KL and log-probs drift from
    what was sampled); trl's batched generate switches to left padding on its own.
    """
    if spec.kind == RANDOM:
        tokenizer = gpt2_tokenizer()
    else:
        with quiet(), unloadable(spec, "tokenizer", field):
            tokenizer = AutoTokenizer.from_pretrained(spec.path)
        if len(tokenizer) < 2:  # no tokenizer files: transformers builds an empty one from config.json alone
            raise AssetError(f"{field}: {spec} has no usable tokenizer (its tokenizer.json and "
                             "tokenizer_config.json are missing or incomplete); copy them from the model it came from")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:  # nothing to pad a batch with: generate() would fail at the first rollout
            raise AssetError(f"{field}: the tokenizer of {spec} has no pad token and no end-of-sequence token; a "
                             "run pads its batches with the pad token (else the EOS token) and ends answers with "
                             "EOS: set eos_token (and pad_token, if it has one) in its tokenizer_config.json")
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


def _dtype(torch_dtype):
    if torch_dtype is None:
        # PPO keeps Adam state in the parameters' dtype: a hub checkpoint stored in fp16 would
        # train badly (and slowly on CPU), so default to float32 unless asked otherwise.
        return torch.float32
    if isinstance(torch_dtype, str) and torch_dtype != "auto":
        return getattr(torch, torch_dtype)
    return torch_dtype


def _load_causal_lm(spec: ModelSpec, *, dtype, load_in_4bit: bool = False, field: str = "model_name"):
    if spec.kind == RANDOM:
        return _random_causal_lm(spec, dtype)

    kwargs = {"dtype": dtype}
    if load_in_4bit:
        compute = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        kwargs.update(
            dtype=compute,
            quantization_config=BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
            ),
            device_map={"": torch.cuda.current_device()},
        )
    with unloadable(spec, "model", field):
        model, info = AutoModelForCausalLM.from_pretrained(spec.path, output_loading_info=True, **kwargs)
    check_loaded_whole(spec, info, field)
    return model


def check_weights_fit(spec: ModelSpec, field: str = "model_name") -> None:
    """``check_loaded_whole`` of a model folder before any model loads: a load onto the meta device reads the
    weights' names and shapes, not their values (half a second for SmolLM2)."""
    with quiet(), unloadable(spec, "model", field):
        _, info = AutoModelForCausalLM.from_pretrained(spec.path, device_map="meta", output_loading_info=True)
    check_loaded_whole(spec, info, field)


# weights a checkpoint may hold beside the model's own: trl's value head (read by _restore_value_head) and buffers
# older GPT-2 and Llama checkpoints saved that transformers now computes
_HARMLESS_EXTRA = re.compile(r"(^|\.)v_head\.|rotary_emb\.inv_freq$|\.attn\.(masked_)?bias$")


def check_loaded_whole(spec: ModelSpec, info: dict, field: str = "model_name") -> None:
    """An AssetError unless every weight the config asks for came from the folder: transformers fills a missing one
    with random values and only warns, and a run would then train (or an evaluation score) a half-random model."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(k[0]) if isinstance(k, tuple) else str(k) for k in info.get("mismatched_keys") or [])
    extra = sorted(k for k in info.get("unexpected_keys") or [] if not _HARMLESS_EXTRA.search(k))
    for keys, what in ((missing, "missing from its weights (they would start random)"),
                       (mismatched, "of another shape in its weights"),
                       (extra, "in its weights but not in its config (they would be dropped)")):
        if keys:
            raise AssetError(f"{field}: {spec}'s config.json does not match its weights: {len(keys)} weight(s) "
                             f"{what}, e.g. {keys[0]!r}; put back the config.json saved with these weights")


def load_causal_lm(spec: ModelSpec, dtype=None, field: str = "model_name"):
    """A plain causal LM (no value head, nothing trainable marked) of any model spec, e.g. to evaluate it; a problem
    names ``field``."""
    with quiet():
        return _load_causal_lm(spec, dtype=_dtype(dtype), field=field)


def random_config(spec: ModelSpec):
    """The transformers config of a ``random:NAME`` stand-in (GPT-2 tokenizer's vocabulary and special ids)."""
    kind, shape = RANDOM_SHAPES[spec.name[len(RANDOM_PREFIX):]]
    eos = GPT2_VOCAB - 1
    ids = dict(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if kind == "gpt2":
        return GPT2Config(vocab_size=GPT2_VOCAB, **shape, **ids)
    return LlamaConfig(vocab_size=GPT2_VOCAB, **shape, **ids)


def _random_causal_lm(spec: ModelSpec, dtype):
    """A ``random:NAME`` stand-in, built where it will run (the GPU when there is one) from a fixed seed, so
    the reference and every agent start from the same weights, as copies of one checkpoint would."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
        torch.manual_seed(0)
        with torch.device(device), quiet():
            model = AutoModelForCausalLM.from_config(random_config(spec), dtype=dtype)
    return model.eval()


@contextlib.contextmanager
def unloadable(spec: ModelSpec, what: str, field: str = "model_name"):
    """A model folder that cannot be loaded (damaged weights, a config transformers cannot read) is the user's
    file, not our bug: say which, in one line, naming ``field`` (the config's, or a command's flag)."""
    try:
        yield
    except AssetError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise AssetError(f"{field}: cannot load the {what} of {spec} ({type(e).__name__}: {first})") from None


def _restore_value_head(model, path: str) -> None:
    """Reload a value head saved by trl into a local checkpoint, if there is one.

    We hand trl an already-loaded model (see load_policy), and on that path trl does not
    read v_head weights from the checkpoint files itself.
    """
    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        return
    from safetensors import safe_open  # only for a folder saved with its weights in one safetensors file

    with safe_open(str(weights), framework="pt") as f:
        keys = [k for k in f.keys() if k.startswith("v_head.")]
        if keys:
            state = {k[len("v_head."):]: f.get_tensor(k) for k in keys}
            model.v_head.load_state_dict(state)


class PolicyWithoutValueHead(AutoModelForCausalLMWithValueHead):
    """A policy for a critic-free learner (``advantage_estimator`` rloo or grpo): trl's value-head wrapper, which
    trl's PPOTrainer requires, built without the value head. Its forward returns (logits, loss, None): no values."""

    def __init__(self, pretrained_model, **kwargs):
        PreTrainedModelWrapper.__init__(self, pretrained_model, **kwargs)  # the wrapper without ValueHead(...)

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, return_past_key_values=False,
                **kwargs):
        out = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                                    **kwargs)
        logits = out.logits if out.logits.dtype == torch.float32 else out.logits.float()  # as trl's wrapper upcasts
        return (logits, out.loss, None, out.past_key_values) if return_past_key_values else (logits, out.loss, None)

    def state_dict(self, *args, **kwargs):
        return {} if self.is_peft_model else self.pretrained_model.state_dict(*args, **kwargs)

    def post_init(self, state_dict):
        pass  # trl's loads the value head's weights here


def load_policy(
    spec: ModelSpec,
    *,
    value_head: bool = True,
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
    GSM8K setting) needs CUDA + bitsandbytes and adapters. ``torch_dtype`` None means float32. Without
    ``value_head`` (a critic-free learner) a ``PolicyWithoutValueHead``.
    """
    if load_in_4bit:
        check_4bit()
        if not use_peft:
            raise AssetError("load_in_4bit needs use_peft: true (4-bit weights cannot be trained directly)")
    with quiet():
        # Load the base model ourselves and hand trl the object: given a string, trl 0.11.4
        # first asks the hub for an adapter_config.json, which we avoid offline, and we need
        # the model's architecture to pick the LoRA targets anyway.
        base = _load_causal_lm(spec, dtype=_dtype(torch_dtype), load_in_4bit=load_in_4bit)
        peft_config = None
        if use_peft:
            from peft import LoraConfig  # LoRA runs only: the full-weight runs never need peft

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
        wrapper = AutoModelForCausalLMWithValueHead if value_head else PolicyWithoutValueHead
        model = wrapper.from_pretrained(base, peft_config=peft_config)
    if value_head:
        _restore_value_head(model, spec.path)
    return model


def zero_value_head(policy) -> None:
    """Set the value head's weights and bias to 0 (``value_head_init: zero``): every value starts at 0, and no
    gradient flows through the head into the model until its weights move."""
    with torch.no_grad():
        policy.v_head.summary.weight.zero_()
        policy.v_head.summary.bias.zero_()


def load_policies(spec: ModelSpec, names: list[str], *, use_peft: bool = False, shared_base: bool = True, **kwargs):
    """One policy per agent name. With LoRA (and ``shared_base``) the agents share ONE frozen base
    model, each with its own adapter (named after the agent) and its own value head, instead of one
    base copy each: the agent that uses a policy makes its adapter the active one first (``Agent.use_own_adapter``).
    """
    if not use_peft or len(names) == 1 or not shared_base:
        return {name: load_policy(spec, use_peft=use_peft, **kwargs) for name in names}
    from peft import PeftModel  # LoRA runs only (see above)

    first = load_policy(spec, use_peft=True, **kwargs)
    wrapper = type(first)  # with or without the value head
    peft_model: PeftModel = first.pretrained_model
    lora_config = peft_model.peft_config["default"]
    policies = {names[0]: first}
    first.adapter_name = "default"
    for name in names[1:]:
        peft_model.add_adapter(name, lora_config)
        with quiet():
            policy = wrapper.from_pretrained(peft_model)
        policy.adapter_name = name
        policies[name] = policy
    return policies


def load_reference(spec: ModelSpec, policy=None, *, use_peft: bool = False):
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
    dtype, device = torch.float32, None
    if policy is not None:
        first = next(policy.pretrained_model.parameters())
        dtype, device = first.dtype, first.device
    with quiet():
        base = _load_causal_lm(spec, dtype=dtype)
        reference = AutoModelForCausalLMWithValueHead.from_pretrained(base)
    if device is not None:
        reference.to(device)
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference.eval()


class AdapterView:
    """A LoRA model read by the held-out evaluation as one agent's policy (``adapter``: made active for each call,
    then the one before put back: two agents may share one base) or, with ``adapter`` None, as the base model with
    every adapter off: trl's KL reference for a peft policy (``optional_peft_ctx``). Calls, ``generate`` and the
    train/eval switch reach the model; its parameters are named by what the view reads, so that two views never
    pass for the same weights (``cory.heldout.same_weights``)."""

    def __init__(self, peft_model, adapter: str | None):
        self.model, self.adapter = peft_model, adapter

    @contextlib.contextmanager
    def reading(self):
        if self.adapter is None:
            with self.model.disable_adapter():
                yield
            return
        before = self.model.active_adapter
        self.model.set_adapter(self.adapter)
        try:
            yield
        finally:
            self.model.set_adapter(before)

    def __call__(self, *args, **kwargs):
        with self.reading():
            return self.model(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self.reading():
            return self.model.generate(*args, **kwargs)

    @property
    def training(self) -> bool:
        return self.model.training

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def parameters(self):
        return (p for _, p in self.named_parameters())

    def named_parameters(self):
        mark = f"lora_{self.adapter}" if self.adapter is not None else "base"
        return ((f"{mark}:{name}", p) for name, p in self.model.named_parameters() if self.reads(name))

    def reads(self, name: str) -> bool:
        """Whether the parameter ``name`` is one this view computes with: the base's weights, and this adapter's own
        (peft names them ``...lora_A.<adapter>.weight``), never another adapter's."""
        if "lora_" not in name:
            return True
        return self.adapter is not None and (f".{self.adapter}." in name or name.endswith(f".{self.adapter}"))
