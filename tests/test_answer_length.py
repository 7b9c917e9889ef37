"""IMDB answers have the length drawn for their batch (the paper's LengthSampler regime): EOS cannot end
them sooner unless ``allow_early_eos``. Checked with a model that would always end at once."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import IMDB_CORY, IMDB_PPO, REPO, script_hyperparameters
from cory import assets
from cory.config import build, load_yaml
from cory.run.outputs import read_jsonl
from cory.train import train


@pytest.fixture(scope="module")
def always_eos(tmp_path_factory):
    """The tiny GPT-2 made to put all its probability on EOS at every position: the final layer norm
    outputs a fixed unit vector e, and EOS's (tied) embedding is 100 e, so EOS's logit is 100 and every
    other token's is about 0."""
    src = assets.tiny_model_dir()
    model = AutoModelForCausalLM.from_pretrained(src)
    tok = AutoTokenizer.from_pretrained(src)
    with torch.no_grad():
        e = torch.zeros(model.config.n_embd)
        e[0] = 1.0
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(e)
        model.transformer.wte.weight[tok.eos_token_id] = 100 * e
    out = tmp_path_factory.mktemp("always_eos")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    ids = tok("The film", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=True, top_k=0)[0, -1].item() == tok.eos_token_id
    return out


def run(cls, name, tmp_path, model, **over):
    base = load_yaml(REPO / "configs" / "imdb" / f"{name}_tiny.yaml")
    base.update(output_dir=str(tmp_path / name), model_name=str(model), steps=2, save_every=10, **over)
    return read_jsonl(train(build(cls, base)) / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("cls,name", [(IMDB_PPO, "ppo"), (IMDB_CORY, "cory")])
def test_answers_run_to_the_drawn_length(always_eos, tmp_path, cls, name):
    rows = run(cls, name, tmp_path, always_eos)
    agents = ["policy"] if name == "ppo" else ["llm1", "llm2"]
    for r in rows:
        for a in agents:
            length = r[f"{a}/response_length"]
            # one length per batch, so the mean is that length: a whole number in the preset's [4, 8]
            assert length == int(length) and 4 <= length <= 8, (a, length)


@pytest.mark.slow
@pytest.mark.parametrize("cls,name", [(IMDB_PPO, "ppo"), (IMDB_CORY, "cory")])
def test_allow_early_eos_lets_answers_end_at_once(always_eos, tmp_path, cls, name):
    rows = run(cls, name, tmp_path, always_eos, allow_early_eos=True)
    agents = ["policy"] if name == "ppo" else ["llm1", "llm2"]
    assert all(r[f"{a}/response_length"] == 1.0 for r in rows for a in agents)


def test_gsm8k_lets_answers_end_early(repo):
    from cory.cli import parse
    for script in ("ppo", "cory"):
        cpu = parse(script_hyperparameters("gsm8k", script), ["--config", str(repo / f"configs/gsm8k/{script}_cpu.yaml")])
        assert cpu.allow_early_eos is True
    assert parse(IMDB_PPO, ["--config", str(repo / "configs/imdb/ppo_cpu.yaml")]).allow_early_eos is False


@pytest.mark.parametrize("flag,length", [([], 5.0), (["--allow_early_eos", "true"], 1.0)])
def test_evaluation_holds_the_length_too(always_eos, tmp_path, flag, length):
    from lab.evaluate import main
    doc = main(["--task", "imdb", "--model", str(always_eos), "--reference", str(always_eos), "--no_base",
                "--limit", "4", "--max_new_tokens", "5", "--dataset", "builtin", "--reward", "vader",
                "--json", str(tmp_path / "eval.json"), *flag])
    assert doc["results"][0]["response_length"] == length
