"""End to end on the tiny preset: real trl PPO, real (tiny) models, real VADER reward."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import GSM8K_CORY, IMDB_CORY, IMDB_PPO, REPO, run_script, trained
from cory.config import build, load_yaml
from cory.run.outputs import read_jsonl
from cory.train import prepare_run

TIME_KEYS = ("time/", "memory/")  # measurements of the machine, not of the run


def tiny(cls, name, tmp_path, **over):
    base = load_yaml(REPO / "configs" / "imdb" / f"{name}_tiny.yaml")
    base.update(output_dir=str(tmp_path / "run"), **over)
    return build(cls, base)


def comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


def test_ppo_script_end_to_end(tmp_path):
    out = tmp_path / "ppo"
    rows = trained("imdb_train/ppo.py", out, "--config", "configs/imdb/ppo_tiny.yaml", "--steps", "3")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("policy/task_reward", "policy/kl", "policy/kl_coef", "policy/combined_reward",
                "policy/response_length", "time/iteration_s"):
        assert all(isinstance(r[key], float) for r in rows), key
    for r in rows:
        assert 4 <= r["policy/response_length"] <= 8
    assert load_yaml(out / "config.yaml")["steps"] == 3
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 3 * 2 and {"query", "response", "reward"} <= set(samples[0])
    model = AutoModelForCausalLM.from_pretrained(out / "final" / "policy")
    tok = AutoTokenizer.from_pretrained(out / "final" / "policy")
    ids = tok("This movie was", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3


def test_cory_script_roles_and_outputs(tmp_path):
    out = tmp_path / "cory"
    p = run_script("imdb_train/cory.py", "--config", "configs/imdb/cory_tiny.yaml", "--steps", "6",
                   "--swap_period", "2", "--output_dir", out)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["pioneer"] for r in rows] == ["llm1", "llm1", "llm2", "llm2", "llm1", "llm1"]
    for r in rows:
        for agent in ("llm1", "llm2"):
            for key in ("task_reward", "collective_reward", "kl", "kl_coef", "combined_reward", "response_length"):
                assert isinstance(r[f"{agent}/{key}"], float), (agent, key)
            assert r[f"{agent}/combined_reward"] == pytest.approx(
                r[f"{agent}/task_reward"] - r[f"{agent}/kl_coef"] * r[f"{agent}/kl"])
        # coefficient 1: both agents train on r1 + r2
        total = r["llm1/task_reward"] + r["llm2/task_reward"]
        assert r["llm1/collective_reward"] == pytest.approx(total)
        assert r["llm2/collective_reward"] == pytest.approx(total)
    samples = read_jsonl(out / "samples.jsonl")
    s = samples[0]
    assert s["observer_prompt"] == f'I can make this sentence "{s["query"]}{s["pioneer_response"]}" more positive: {s["query"]}'
    for agent in ("llm1", "llm2"):
        model = AutoModelForCausalLM.from_pretrained(out / "final" / agent)
        tok = AutoTokenizer.from_pretrained(out / "final" / agent)
        ids = tok("The plot", return_tensors="pt").input_ids
        assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2
    # a finished run is not overwritten by accident; nothing in it changes
    before = (out / "metrics.jsonl").read_bytes()
    p = run_script("imdb_train/cory.py", "--config", "configs/imdb/cory_tiny.yaml", "--output_dir", out)
    assert p.returncode == 2 and "--resume" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert (out / "metrics.jsonl").read_bytes() == before


def test_bad_input_exits_2_before_loading(tmp_path):
    out = tmp_path / "never"
    p = run_script("imdb_train/ppo.py", "--config", "configs/imdb/ppo_tiny.yaml", "--batch_size", "3",
                   "--output_dir", out, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("error: batch_size") and "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.slow
def test_agents_keep_their_own_state_across_exchanges(tmp_path):
    cfg = tiny(IMDB_CORY, "cory", tmp_path, steps=4, swap_period=1)
    run = prepare_run(cfg)
    ref_before = {n: p.clone() for n, p in run.reference.named_parameters()}
    run.fit()
    # every iteration each agent takes ppo_epochs * batch/mini_batch optimizer steps, whatever its role
    per_iter = cfg.ppo_epochs * cfg.batch_size // cfg.mini_batch_size
    for agent in run.agents.values():
        steps = {int(s["step"]) for s in agent.trainer.optimizer.state_dict()["state"].values()}
        assert steps == {4 * per_iter}
    w1 = dict(run.agents["llm1"].policy.named_parameters())
    w2 = dict(run.agents["llm2"].policy.named_parameters())
    assert any(not torch.equal(w1[n], w2[n]) for n in w1)  # two models, not one
    assert run.agents["llm1"].policy is not run.agents["llm2"].policy
    for n, p in run.reference.named_parameters():  # the shared reference never moves
        assert torch.equal(p, ref_before[n]) and not p.requires_grad
    assert run.agents["llm1"].trainer.ref_model is run.agents["llm2"].trainer.ref_model


@pytest.mark.slow
def test_reset_on_swap_restarts_optimizer_state(tmp_path):
    cfg = tiny(IMDB_CORY, "cory", tmp_path, steps=3, swap_period=2, reset_on_swap=True)
    run = prepare_run(cfg)
    run.fit()
    per_iter = cfg.ppo_epochs * cfg.batch_size // cfg.mini_batch_size
    for agent in run.agents.values():
        steps = {int(s["step"]) for s in agent.trainer.optimizer.state_dict()["state"].values()}
        assert steps == {1 * per_iter}  # Adam restarted at the exchange before iteration 2
        assert agent.normalizer.count == pytest.approx(cfg.batch_size)


@pytest.mark.slow
@pytest.mark.parametrize("method,cls,over", [("cory", IMDB_CORY, {}), ("ppo", IMDB_PPO, {}),
                                             ("ppo", IMDB_PPO, {"value_head_init": "zero"})])
def test_resume_equals_uninterrupted(tmp_path, method, cls, over):
    # value_head_init zero: the resumed run must carry on from the saved head, not start from zeros again
    straight = tiny(cls, method, tmp_path / "a", steps=4, save_every=2, **over)
    prepare_run(straight).fit()
    first = tiny(cls, method, tmp_path / "b", steps=2, keep_resume_checkpoint=True, **over)  # the tiny presets' too
    prepare_run(first).fit()
    out = tmp_path / "b" / "run"
    # the resumed process starts from the saved config with a longer horizon
    p = run_script(f"imdb_train/{method}.py", "--resume", out, "--steps", "4")
    assert p.returncode == 0, p.stderr[-2000:]
    a = comparable(read_jsonl(tmp_path / "a" / "run" / "metrics.jsonl"))
    b = comparable(read_jsonl(out / "metrics.jsonl"))
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float):
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), (ra["step"], k)
            else:
                assert ra[k] == rb[k], (ra["step"], k)
    assert read_jsonl(tmp_path / "a" / "run" / "samples.jsonl") == read_jsonl(out / "samples.jsonl")


def test_lora_agents_share_one_frozen_base(tmp_path):
    base = load_yaml(REPO / "configs" / "gsm8k" / "cory_tiny.yaml")
    base.update(output_dir=str(tmp_path / "run"), steps=2, swap_period=1, dataset="generated")
    cfg = build(GSM8K_CORY, base)
    run = prepare_run(cfg)
    a1, a2 = run.agents["llm1"], run.agents["llm2"]
    shared = a1.policy.pretrained_model
    assert shared is a2.policy.pretrained_model and run.reference is None  # no copy, no separate reference
    frozen = {n: p.clone() for n, p in shared.named_parameters() if "lora_" not in n}
    own = [{id(p) for g in a.trainer.optimizer.param_groups for p in g["params"]} for a in (a1, a2)]
    assert own[0] and own[1] and not own[0] & own[1]
    run.fit()
    for n, p in shared.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, frozen[n]), n  # the base (the KL reference) never moves
    lora_b = {a: {n: p for n, p in shared.named_parameters() if f"lora_B.{a}." in n} for a in ("default", "llm2")}
    assert any(p.abs().sum() > 0 for p in lora_b["default"].values())  # both adapters trained
    assert any(p.abs().sum() > 0 for p in lora_b["llm2"].values())
    m1 = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "llm1")
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "llm2")
    w1, w2 = dict(m1.named_parameters()), dict(m2.named_parameters())
    assert not any("lora" in n for n in w1)  # merged: plain models
    assert any(not torch.equal(w1[n], w2[n]) for n in w1)


def test_every_row_reports_its_peak_memory(tmp_path):
    rows = read_jsonl(prepare_run(tiny(IMDB_PPO, "ppo", tmp_path, steps=2)).fit() / "metrics.jsonl")
    if torch.cuda.is_available():  # the allocator's peak: the tiny model's tensors, a few MiB
        assert all(0 < r["memory/peak_gib"] < 80 for r in rows)
    else:  # the process's peak resident memory during the iteration (models, trl and torch: well over 100 MiB)
        assert all(0.1 < r["memory/peak_gib"] < 64 for r in rows)


def test_a_zero_value_head_starts_at_zero_and_sends_no_gradient_into_the_model(tmp_path):
    cfg = tiny(IMDB_CORY, "cory", tmp_path, value_head_init="zero")
    run = prepare_run(cfg)
    ids = torch.tensor([[5, 6, 7, 8]])
    for agent in run.agents.values():  # every agent's head, each its own
        policy = agent.policy
        assert not policy.v_head.summary.weight.any() and not policy.v_head.summary.bias.any()
        _, _, values = policy(input_ids=ids)
        assert not values.any()
        policy.zero_grad(set_to_none=True)
        ((values - 1.0) ** 2).mean().backward()  # a value loss alone
        body = [p.grad for p in policy.pretrained_model.parameters() if p.requires_grad]
        assert all(g is None or not g.any() for g in body)
        assert policy.v_head.summary.bias.grad.abs().item() > 0  # the head itself learns
        policy.zero_grad(set_to_none=True)
    assert run.agents["llm1"].policy.v_head is not run.agents["llm2"].policy.v_head


def test_the_default_value_head_is_trls_random_layer(tmp_path):
    run = prepare_run(tiny(IMDB_PPO, "ppo", tmp_path))
    assert run.cfg.value_head_init == "trl"
    assert next(iter(run.agents.values())).policy.v_head.summary.weight.any()
