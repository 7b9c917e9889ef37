"""max_pass_tokens: auto. The budget arithmetic, and a run whose budget comes from a stubbed free-memory figure
(as a GPU would give it): it takes more passes, and the same step."""
import numpy as np
import pytest
import torch

from conftest import IMDB_PPO
from cory import models
from cory.assets import locate
from cory.agent import Agent
from cory.config import build
from cory import passes as budget
import cory.ppo


def test_budget_arithmetic():
    gib = 2 ** 30
    # 40 GiB free, 8 GiB kept for gradients and Adam, 0.7 of the rest at 1 MiB per token
    assert budget.auto_pass_tokens(40 * gib, 2 ** 20, 8 * gib) == int(0.7 * 32 * 1024)
    assert budget.auto_pass_tokens(1 * gib, 2 ** 20, 8 * gib) == budget.BUDGET_FLOOR  # never below the floor
    # a 24 GiB card takes a third of an 80 GiB card's budget, at the same bytes per token
    big, small = (budget.auto_pass_tokens(f * gib, 3e6, 10 * gib) for f in (78, 22))
    assert small < big / 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour: on CUDA auto measures a budget (test_gpu.py)")
def test_auto_means_no_limit_on_a_cpu(tmp_path):
    tok = models.load_tokenizer(locate("tiny"))
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 2, "mini_batch_size": 2,
                          "output_dir": str(tmp_path)})
    agent = Agent("policy", cfg, models.load_policy(locate("tiny")), models.load_reference(locate("tiny")), tok)
    q = [torch.tensor(tok("The film")["input_ids"])] * 2
    r = [torch.tensor(tok(" was good")["input_ids"])] * 2
    agent.step(q, r, [1.0, 0.0])
    assert agent.trainer.max_pass_tokens == 0


def test_a_stubbed_small_card_takes_more_passes_and_the_same_step(tmp_path, monkeypatch):
    """As on a GPU with little free memory: resolve_budget() measures bytes per token and reads the free memory;
    both are stubbed here, so the budget comes out at 24 tokens and the 4-sample batch needs several passes."""
    import copy

    torch.manual_seed(0)
    tok = models.load_tokenizer(locate("tiny"))
    reference, policy = models.load_reference(locate("tiny")), models.load_policy(locate("tiny"))
    texts = [("The film was", " very good indeed and I"), ("I did not", " like it"),
             ("A long and winding opening that goes on", " and on"), ("Bad", " acting, worse plot, but fine")]
    q = [torch.tensor(tok(a)["input_ids"]) for a, _ in texts]
    r = [torch.tensor(tok(b)["input_ids"]) for _, b in texts]
    calls = []

    def fake_resolve(trainer, queries, responses, reserve_bytes):
        calls.append(reserve_bytes)
        return budget.auto_pass_tokens(free_bytes=1000 * 2 ** 20 + reserve_bytes, bytes_per_token=2 ** 20 * 1000 / 24,
                                       reserve_bytes=reserve_bytes, fraction=1.0, floor=1)
    monkeypatch.setattr(cory.ppo, "resolve_budget", fake_resolve)  # the name the PPO step calls

    def step(max_pass_tokens):
        cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 4,
                              "ppo_epochs": 2, "learning_rate": 1e-3, "init_kl_coef": 0.2,
                              "max_pass_tokens": max_pass_tokens, "precision": "fp32", "output_dir": str(tmp_path)})
        agent = Agent("policy", cfg, copy.deepcopy(policy), reference, tok)
        agent.reserve_for_training(123.0)
        np.random.seed(0)
        stats = agent.step(q, r, [1.0, -0.5, 0.25, 2.0])
        return agent, stats, torch.cat([p.detach().flatten() for p in agent.policy.parameters()])

    auto, s_auto, p_auto = step("auto")
    assert calls == [123.0] and auto.trainer.max_pass_tokens == 24
    assert len(auto.trainer._plan(q, r)) > 1
    _, s_one, p_one = step(0)
    for key in ("kl", "total_loss", "value_loss", "approx_kl"):
        assert getattr(s_auto, key) == pytest.approx(getattr(s_one, key), rel=1e-4, abs=1e-6), key
    before = torch.cat([p.detach().flatten() for p in policy.parameters()])
    assert float((p_auto - p_one).norm() / (p_one - before).norm()) < 1e-3
