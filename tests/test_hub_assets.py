"""The hub assets a run fetches (``cory.run.preflight.hub_assets``), listed from the config and the disk alone, by each
task's own rules: the model where it is a hub id, IMDB's classifier reward and reviews, GSM8K's openai/gsm8k unless
``dataset_path`` is set. The hub is never asked."""
import json

import pytest
import yaml

from conftest import GSM8K_CORY, GSM8K_PPO, IMDB_CORY, IMDB_PPO, rejected
from cory import assets
from cory.run import preflight
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


# ----------------------------------------------------------------------------- offline: all of them in one line

@pytest.fixture
def empty_cache(monkeypatch):
    """Nothing in the local Hugging Face cache, whatever this machine holds."""
    monkeypatch.setattr(assets, "local_snapshot", lambda repo_id, repo_type="model": None)
    monkeypatch.setattr(assets, "_in_datasets_cache", lambda repo_id: False)


@pytest.fixture
def unreachable(monkeypatch, empty_cache):
    """No offline flag set, and a hub that does not answer: asked once, for the first asset."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    asked = []
    monkeypatch.setattr(assets, "_hub_answer", lambda repo_id, repo_type, timeout: asked.append(repo_id)
                        or "unreachable")
    return asked


IMDB_OFFLINE = ("to run offline use --config configs/imdb/{method}_cpu.yaml (the embedded model) instead, or set in "
                "their place --model_name a local model folder (or embedded:smollm2-135m), --reward_model vader (or a "
                "local classifier folder), --dataset builtin (docs/gpu.md)")


@pytest.mark.parametrize("method", ["ppo", "cory"])
def test_the_imdb_paper_preset_offline_names_all_three_at_once(method, empty_cache, tmp_path):
    run = tmp_path / "run"
    line = rejected("imdb", method, ["--config", f"configs/imdb/{method}_paper.yaml", "--output_dir", run])
    assert line == ("error: model 'gpt2-large' (model_name), model 'lvwerra/distilbert-imdb' (reward_model) and "
                    "dataset 'stanfordnlp/imdb' (dataset hub) are not in the local Hugging Face cache and "
                    f"HF_HUB_OFFLINE=1 is set; {IMDB_OFFLINE.format(method=method)}")
    assert not run.exists()


def test_the_imdb_paper_preset_with_the_hub_unreachable(unreachable, tmp_path):
    line = rejected("imdb", "cory", ["--config", "configs/imdb/cory_paper.yaml", "--output_dir", tmp_path / "run"])
    assert line == ("error: model 'gpt2-large' (model_name), model 'lvwerra/distilbert-imdb' (reward_model) and "
                    "dataset 'stanfordnlp/imdb' (dataset hub) are not in the local Hugging Face cache and the hub is "
                    f"unreachable; {IMDB_OFFLINE.format(method='cory')}")
    assert unreachable == ["gpt2-large"]  # one unanswered probe is enough: not one wait per asset


@pytest.mark.parametrize("method", ["ppo", "cory"])
def test_the_gsm8k_paper_preset_offline_names_the_model_and_the_data(method, unreachable, tmp_path):
    # before the 4-bit check: on this CPU machine the offline preset it names is the way on, too
    run = tmp_path / "run"
    line = rejected("gsm8k", method, ["--config", f"configs/gsm8k/{method}_paper.yaml", "--output_dir", run])
    assert line == ("error: model 'meta-llama/Llama-2-7b-chat-hf' (model_name) and dataset 'openai/gsm8k' (dataset "
                    "auto: else generated stand-in problems, not GSM8K) are not in the local Hugging Face cache and "
                    f"the hub is unreachable; to run offline use --config configs/gsm8k/{method}_cpu.yaml (the "
                    "embedded model) instead, or set in their place --model_name a local model folder (or "
                    "embedded:smollm2-135m), --dataset_path DIR (GSM8K's train.jsonl and test.jsonl) (docs/gpu.md)")
    assert not run.exists()


def test_only_what_is_missing_is_named(empty_cache, monkeypatch, tmp_path):
    monkeypatch.setattr(assets, "local_snapshot", lambda repo_id, repo_type="model":
                        tmp_path if repo_id == "gpt2-large" else None)  # the model cached, nothing else
    line = rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_paper.yaml", "--output_dir", tmp_path / "run"])
    assert line.startswith("error: model 'lvwerra/distilbert-imdb' (reward_model) and dataset 'stanfordnlp/imdb' "
                           "(dataset hub) are not in the local Hugging Face cache and HF_HUB_OFFLINE=1 is set; to run "
                           "offline use --config configs/imdb/ppo_cpu.yaml (the embedded model) instead, or set in "
                           "their place --reward_model vader")
    # one asset: its place; a task with no cpu preset of that method: the embedded model by name
    line = rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_tiny.yaml", "--model_name", "some-org/model",
                                    "--output_dir", tmp_path / "run"])
    assert line.endswith("is set; to run offline use --config configs/imdb/ppo_cpu.yaml (the embedded model) "
                         "instead, or set in its place --model_name a local model folder (or embedded:smollm2-135m) "
                         "(docs/gpu.md)")


def test_what_the_task_replaces_by_its_own_rule_is_no_error(empty_cache):
    # the GSM8K cpu preset offline: generated problems instead of openai/gsm8k, as the task says when it does
    preflight.check_hub(parse(GSM8K_PPO, ["--config", "configs/gsm8k/ppo_cpu.yaml"], check=False))
    preflight.check_hub(parse(IMDB_PPO, ["--config", "configs/imdb/ppo_gpu.yaml", "--dataset", "auto"], check=False))


def test_a_task_s_broken_hub_assets_is_one_line(monkeypatch):
    import dataclasses

    from cory.errors import ConfigError
    from cory.tasks import registry

    cfg = parse(IMDB_PPO, ["--config", "configs/imdb/ppo_tiny.yaml"], check=False)
    spec = registry.task_spec("imdb")
    for broken, message in [(lambda cfg: 1 / 0, "hub_assets() raised ZeroDivisionError: division by zero"),
                            (lambda cfg: ["gpt2"], "hub_assets() must return cory.assets.HubAsset values")]:
        monkeypatch.setitem(registry._REGISTRY, "imdb", dataclasses.replace(spec, hub_assets=broken))
        with pytest.raises(ConfigError) as e:
            preflight.hub_assets(cfg)
        assert str(e.value) == f"task imdb: {message} (registered at {spec.where})"
        main_line = rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_tiny.yaml", "--print_config"])
        assert main_line == f"error: task imdb: {message} (registered at {spec.where})"
