"""Config files, flags and validation: one clear line, before any model loads."""
import dataclasses

import pytest

from conftest import script_hyperparameters
from cory.cli import parse
from cory.config import CoryArgs, PPOArgs, build
from cory.errors import ConfigError

# the fields' checks, run on a real script's values (cory.config itself states no paper value)
IMDB_PPO = script_hyperparameters("imdb", "ppo")
IMDB_CORY = script_hyperparameters("imdb", "cory")


def errors(argv, cls=IMDB_PPO):
    with pytest.raises(ConfigError) as e:
        parse(cls, argv)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_defaults_are_the_paper_table1():
    cfg = build(IMDB_PPO)
    assert (cfg.learning_rate, cfg.batch_size, cfg.mini_batch_size, cfg.ppo_epochs) == (1.41e-5, 256, 256, 4)
    assert (cfg.init_kl_coef, cfg.target, cfg.horizon, cfg.kl_penalty) == (0.3, 6.0, 10000.0, "full")
    assert (cfg.gamma, cfg.lam, cfg.cliprange, cfg.cliprange_value, cfg.vf_coef) == (1.0, 0.95, 0.2, 0.2, 0.1)
    assert (cfg.response_length_min, cfg.response_length_max) == (4, 15)
    cory = build(IMDB_CORY)
    assert (cory.swap_period, cory.other_reward_coef, cory.knowledge_transfer) == (5, 1.0, True)


def test_the_paper_values_live_in_the_scripts_alone():
    """cory.config states no paper value: a config built without a script names the first field it lacks."""
    for cls in (PPOArgs, CoryArgs):
        with pytest.raises(ConfigError, match=r"^task: no value"):
            build(cls)
    for name in ("init_kl_coef", "learning_rate", "batch_size", "response_length_max", "model_name"):
        assert PPOArgs.__dataclass_fields__[name].default is dataclasses.MISSING, name
    for name in ("swap_period", "other_reward_coef", "knowledge_transfer"):
        assert CoryArgs.__dataclass_fields__[name].default is dataclasses.MISSING, name
    # each CORY script restates none of its PPO script's values: it only adds or changes
    for task in ("imdb", "gsm8k"):
        cory, ppo = script_hyperparameters(task, "cory"), script_hyperparameters(task, "ppo")
        assert issubclass(cory, ppo)
        restated = [n for n in cory.__annotations__ if n in ppo.__dataclass_fields__ and
                    getattr(cory, n) == getattr(ppo, n)]
        assert not restated, (task, restated)


def test_yaml_then_flags(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 7\nlearning_rate: 1\nmodel_name: tiny\nreward_model: vader\n")
    cfg = parse(IMDB_PPO, ["--config", str(p), "--steps", "9", "--seed=3", "--score_norm"])
    assert cfg.steps == 9 and cfg.seed == 3 and cfg.learning_rate == 1.0 and cfg.score_norm is True
    cfg = parse(IMDB_CORY, ["--config", str(p), "--other_reward_coef", "-1", "--knowledge_transfer", "false"])
    assert cfg.other_reward_coef == -1.0 and cfg.knowledge_transfer is False


def test_every_preset_is_valid(repo):
    presets = sorted(p for p in (repo / "configs").glob("*/*.yaml") if p.parent.name != "accelerate")
    assert len(presets) >= 12
    for p in presets:
        cls = script_hyperparameters(p.parent.name, p.stem.split("_")[0])
        assert parse(cls, ["--config", str(p)]).task == p.parent.name


def test_the_scripts_defaults_are_the_papers_tables():
    """Paper Table 1 (IMDB, trl's defaults) and Table 2 (GSM8K); the paper presets add nothing to these."""
    table = {
        "imdb": dict(model_name="gpt2-large", reward_model="distilbert-imdb", learning_rate=1.41e-5, batch_size=256,
                     mini_batch_size=256, gradient_accumulation_steps=1, ppo_epochs=4, init_kl_coef=0.3,
                     adap_kl_ctrl=True, target=6.0, horizon=10000.0, gamma=1.0, lam=0.95, cliprange=0.2,
                     cliprange_value=0.2, vf_coef=0.1, kl_penalty="full", response_length_min=4,
                     response_length_max=15, top_k=0, top_p=1.0, repetition_penalty=1.1, steps=100,
                     allow_early_eos=False),
        "gsm8k": dict(model_name="meta-llama/Llama-2-7b-chat-hf", load_in_4bit=True, use_peft=True, lora_r=16,
                      lora_alpha=16, reward_model="correctness", batch_size=32, mini_batch_size=2,
                      gradient_accumulation_steps=16, ppo_epochs=4, init_kl_coef=0.01, gamma=1.0, lam=0.95,
                      cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, kl_penalty="full", steps=100,
                      response_length_max=256, allow_early_eos=True),
    }
    rates = {("gsm8k", "ppo"): 1e-5, ("gsm8k", "cory"): 1e-4}
    for task, values in table.items():
        for method in ("ppo", "cory"):
            cfg = script_hyperparameters(task, method)()
            for name, want in {**values, **({"learning_rate": rates[task, method]} if task == "gsm8k" else {})}.items():
                assert getattr(cfg, name) == want, (task, method, name)
            if method == "cory":
                assert (cfg.swap_period, cfg.other_reward_coef, cfg.knowledge_transfer) == (5, 1.0, True)


@pytest.mark.parametrize("argv,needle", [
    (["--steps", "0"], "steps"),
    (["--steps", "-3"], "steps"),
    (["--steps", "ten"], "steps"),
    (["--batch_size", "10", "--mini_batch_size", "4"], "batch_size"),
    (["--batch_size", "8", "--mini_batch_size", "4", "--gradient_accumulation_steps", "4"], "batch_size"),
    (["--learning_rate", "0"], "learning_rate"),
    (["--learning_rate", "nan"], "learning_rate"),
    (["--top_p", "1.5"], "top_p"),
    (["--lam", "2"], "lam"),
    (["--kl_penalty", "forward"], "kl_penalty"),
    (["--reward_model", "sentiment-xl"], "reward_model"),
    (["--model_name", "embedded:nope"], "model_name"),
    (["--task", "chess"], "task"),
    (["--dataset", "local"], "dataset"),
    (["--response_length_min", "9", "--response_length_max", "4"], "response_length_max"),
    (["--no_such_field", "1"], "no_such_field"),
    (["--score_norm", "maybe"], "score_norm"),
    (["--report_to", "mlflow"], "report_to"),
    (["--value_head_init", "normal"], "value_head_init"),
    (["--config", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--steps"], "steps"),
    (["stray"], "stray"),
    (["--resume", "/nonexistent_run"], "resume"),
])
def test_bad_flags_name_the_field(argv, needle):
    assert needle in errors(argv)


def test_cory_only_fields():
    assert "swap_period" in errors(["--swap_period", "-1"], IMDB_CORY)
    assert "swap_period" in errors(["--swap_period", "2"], IMDB_PPO)  # not a PPO field


@pytest.mark.parametrize("text,needle", [
    ("steps: [1, 2]\n", "steps"),
    ("learning_rate: fast\n", "learning_rate"),
    ("use_peft: 1\n", "use_peft"),
    ("colour: red\n", "colour"),
    ("- steps\n", "mapping"),
    ("steps: : :\n", "YAML"),
])
def test_bad_yaml(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    assert needle in errors(["--config", str(p)])


def test_gsm8k_rules(tmp_path):
    gsm8k = script_hyperparameters("gsm8k", "ppo")
    base = ["--task", "gsm8k", "--reward_model", "correctness"]
    assert parse(gsm8k, base).task == "gsm8k"
    assert "reward_model" in errors(["--reward_model", "distilbert-imdb"], gsm8k)  # an IMDB reward
    assert "dataset_path" in errors(base + ["--dataset", "local"], gsm8k)
    assert "dataset_path" in errors(base + ["--dataset_path", str(tmp_path)], gsm8k)  # no train/test.jsonl
    assert "dataset" in errors(base + ["--dataset", "builtin"], gsm8k)
    # the IMDB script refuses a GSM8K config by its task, naming the script that trains it
    assert "gsm8k_train/ppo.py" in errors(base)


def test_max_pass_tokens_is_auto_a_budget_or_zero(tmp_path):
    assert build(IMDB_PPO).max_pass_tokens == "auto"  # measured on a GPU, no limit on a CPU
    assert parse(IMDB_PPO, ["--max_pass_tokens", "512"]).max_pass_tokens == 512
    assert parse(IMDB_PPO, ["--max_pass_tokens", "0"]).max_pass_tokens == 0
    (tmp_path / "c.yaml").write_text("max_pass_tokens: auto\n")
    assert parse(IMDB_PPO, ["--config", str(tmp_path / "c.yaml")]).max_pass_tokens == "auto"
    assert "max_pass_tokens" in errors(["--max_pass_tokens", "lots"])
    assert "fast_ppo" in errors(["--max_pass_tokens", "64", "--fast_ppo", "false"])
    msg = errors(["--max_pass_tokens", "-1"])
    assert msg.startswith("max_pass_tokens:") and "-1" in msg
