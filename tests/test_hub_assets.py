"""The hub assets a run fetches (``cory.preflight.hub_assets``), listed from the config and the disk alone, by each
task's own rules: the model where it is a hub id, IMDB's classifier reward and reviews, GSM8K's openai/gsm8k unless
``dataset_path`` is set. The hub is never asked."""
import json

import pytest
import yaml

from conftest import GSM8K_CORY, GSM8K_PPO, IMDB_CORY, IMDB_PPO
from cory import assets, preflight
from cory.cli import parse


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Listing asks nothing of the hub: a probe fails the test."""
    def asked(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(assets, "_hub_answer", asked)
    monkeypatch.setattr(assets, "_probe_results", {})


def listed(cls, *argv) -> list[tuple]:
    cfg = parse(cls, [str(a) for a in argv], check=False)
    return [(a.field, a.repo_type, a.repo_id, a.fallback) for a in preflight.hub_assets(cfg)]


GPT2_LARGE = ("model_name", "model", "gpt2-large", None)
DISTILBERT = ("reward_model", "model", "lvwerra/distilbert-imdb", None)
LLAMA = ("model_name", "model", "meta-llama/Llama-2-7b-chat-hf", None)
GSM8K_AUTO = ("dataset", "dataset", "openai/gsm8k", "generated stand-in problems, not GSM8K")


@pytest.mark.parametrize("cls,method", [(IMDB_PPO, "ppo"), (IMDB_CORY, "cory")])
def test_the_imdb_presets(cls, method):
    assert listed(cls, "--config", f"configs/imdb/{method}_paper.yaml") == [
        GPT2_LARGE, DISTILBERT, ("dataset", "dataset", "stanfordnlp/imdb", None)]
    for preset in ("gpu", "cpu", "tiny"):  # the embedded model (or tiny), VADER and the built-in openings
        assert listed(cls, "--config", f"configs/imdb/{method}_{preset}.yaml") == [], preset


def test_imdb_follows_its_own_rules(tmp_path):
    paper = ["--config", "configs/imdb/ppo_paper.yaml"]
    # auto takes the hub's reviews where it has them, else the built-in openings
    assert listed(IMDB_PPO, *paper, "--dataset", "auto")[-1] == ("dataset", "dataset", "stanfordnlp/imdb",
                                                                  "the built-in openings")
    assert listed(IMDB_PPO, *paper, "--dataset", "builtin") == [GPT2_LARGE, DISTILBERT]
    assert listed(IMDB_PPO, *paper, "--dataset", "builtin", "--reward_model", "vader") == [GPT2_LARGE]
    classifier = tmp_path / "classifier"  # a local classifier folder: nothing fetched for the reward
    classifier.mkdir()
    (classifier / "config.json").write_text(json.dumps({"id2label": {"0": "NEGATIVE", "1": "POSITIVE"}}))
    assert listed(IMDB_PPO, *paper, "--dataset", "builtin", "--reward_model", classifier) == [GPT2_LARGE]


@pytest.mark.parametrize("model", ["tiny", "embedded:smollm2-135m", "random:gpt2-large"])
def test_models_that_are_no_hub_id_are_not_listed(model, tmp_path):
    assert listed(IMDB_PPO, "--config", "configs/imdb/ppo_paper.yaml", "--model_name", model) == [
        DISTILBERT, ("dataset", "dataset", "stanfordnlp/imdb", None)]
    folder = tmp_path / "model"  # a local model folder
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"n_positions": 1024, "vocab_size": 50257}))
    assert listed(IMDB_PPO, "--config", "configs/imdb/ppo_tiny.yaml", "--model_name", folder) == []


@pytest.mark.parametrize("cls,method", [(GSM8K_PPO, "ppo"), (GSM8K_CORY, "cory")])
def test_the_gsm8k_presets(cls, method, tmp_path):
    paper = ["--config", f"configs/gsm8k/{method}_paper.yaml"]
    assert listed(cls, *paper) == [LLAMA, GSM8K_AUTO]  # auto: the hub's GSM8K, else generated problems
    assert listed(cls, *paper, "--dataset", "hub") == [LLAMA, ("dataset", "dataset", "openai/gsm8k", None)]
    assert listed(cls, *paper, "--dataset", "generated") == [LLAMA]
    data = tmp_path / "gsm8k"  # the release's files: read from the disk, nothing fetched
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(json.dumps({"question": "1 + 2?", "answer": "1 + 2 = 3 #### 3"}) + "\n")
    assert listed(cls, *paper, "--dataset_path", data) == [LLAMA]
    assert listed(cls, "--config", f"configs/gsm8k/{method}_cpu.yaml") == [GSM8K_AUTO]
    assert listed(cls, "--config", f"configs/gsm8k/{method}_tiny.yaml") == []


def test_cached_reads_the_disk_alone(monkeypatch, tmp_path):
    (asset,) = [a for a in preflight.hub_assets(parse(GSM8K_PPO, ["--config", "configs/gsm8k/ppo_cpu.yaml"],
                                                      check=False))]
    assert not asset.cached()
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    (tmp_path / "openai___gsm8k").mkdir()  # the datasets library's prepared tables of it
    assert asset.cached()


# ----------------------------------------------------------------------------- --print_config

def test_print_config_lists_them_after_the_config(capsys):
    from cory.cli import CONFIG_MARKER, main

    main(GSM8K_CORY, ["--config", "configs/gsm8k/cory_paper.yaml", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out.partition(CONFIG_MARKER + "\n")[2])
    assert list(printed) == ["method", "config", "hub_assets"]
    assert printed["hub_assets"] == [
        {"field": "model_name", "repo_id": "meta-llama/Llama-2-7b-chat-hf", "repo_type": "model", "cached": False},
        {"field": "dataset", "repo_id": "openai/gsm8k", "repo_type": "dataset", "cached": False,
         "fallback": "generated stand-in problems, not GSM8K"}]
    main(IMDB_CORY, ["--config", "configs/imdb/cory_gpu.yaml", "--print_config"])
    out = capsys.readouterr().out
    assert "\n# hub_assets: the Hugging Face hub repositories the run fetches (none: it runs offline)" in out
    assert yaml.safe_load(out.partition(CONFIG_MARKER + "\n")[2])["hub_assets"] == []


def test_the_runner_reads_the_config_beside_them():
    """lab.experiment_plan reads a script's config from its --print_config: the list beside it changes nothing."""
    from lab.experiment_plan import script_config

    config = script_config(["imdb_train/cory.py"], ["--config", "configs/imdb/cory_paper.yaml"], "cory script")
    assert config["model_name"] == "gpt2-large" and "hub_assets" not in config
