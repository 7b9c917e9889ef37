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
from cory.errors import ConfigError
from cory.device import budget
from cory.passes import pass_plan
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


def test_runs_sharing_a_gpu_budget_within_their_share(monkeypatch):
    """Six runs on one 80 GiB card: each budgets within its share, not within what the whole card has free (on an
    H100 the sixth of six runs that each took 0.7 of the free memory ran out of it)."""
    gib = 2 ** 30
    # alone: the card's free memory plus the allocator's unused cache, as before
    assert budget.usable_cuda_bytes(60 * gib, 80 * gib, 6 * gib, 4 * gib) == 62 * gib
    # a 0.15 share (12 GiB) with 6 GiB reserved: 6 GiB more at most, though the card has 60 free; plus the cache
    assert budget.usable_cuda_bytes(60 * gib, 80 * gib, 6 * gib, 4 * gib, share=0.15) == pytest.approx(8 * gib)
    # the card has less free than the share allows: the card's figure; over its share: only the cache
    assert budget.usable_cuda_bytes(3 * gib, 80 * gib, 6 * gib, 4 * gib, share=0.15) == 5 * gib
    assert budget.usable_cuda_bytes(60 * gib, 80 * gib, 14 * gib, 4 * gib, share=0.15) == 10 * gib
    monkeypatch.delenv(budget.SHARE_ENV, raising=False)
    assert budget.cuda_share() == 1.0
    monkeypatch.setenv(budget.SHARE_ENV, "0.15")
    assert budget.cuda_share() == 0.15
    for bad in ("0", "1.5", "half", "nan", "-0.2"):
        monkeypatch.setenv(budget.SHARE_ENV, bad)
        with pytest.raises(ConfigError, match=rf"CORY_CUDA_SHARE: must be a number in \(0, 1\].*got '{bad}'"):
            budget.cuda_share()


def test_the_runner_gives_parallel_runs_their_share_of_the_cores_and_the_gpu():
    from lab.experiments import GPU_SHARE_ENV, child_env

    assert GPU_SHARE_ENV == budget.SHARE_ENV
    alone = child_env({"PATH": "/bin"}, 1)
    assert budget.SHARE_ENV not in alone and "OMP_NUM_THREADS" not in alone
    six = child_env({"PATH": "/bin"}, 6)
    assert float(six[budget.SHARE_ENV]) == pytest.approx(0.15) and int(six["OMP_NUM_THREADS"]) >= 1
    assert child_env({budget.SHARE_ENV: "0.5", "OMP_NUM_THREADS": "3"}, 6)[budget.SHARE_ENV] == "0.5"  # the user's


def test_a_relative_cory_cache_is_the_one_where_the_runner_started(tmp_path, monkeypatch):
    """The runs start in the repository: a relative CORY_CACHE given to the runner must not build a cache there."""
    from lab.experiments import child_env

    monkeypatch.chdir(tmp_path)
    assert child_env({"CORY_CACHE": "my_cache"}, 1)["CORY_CACHE"] == str(tmp_path / "my_cache")
    assert child_env({"CORY_CACHE": "/abs/cache"}, 2)["CORY_CACHE"] == "/abs/cache"
    assert "CORY_CACHE" not in child_env({"PATH": "/bin"}, 1)


def test_auto_uses_an_h100_for_the_paper_batch_of_gpt2_large():
    """The CPU stand-in for the paper preset on an H100 (issue 46): the card's free memory as an H100 reports it
    (~79 GiB, less the policies and the reference already loaded) and GPT2-Large's bytes per token, scaled from the
    2.65 MiB per token that `max_pass_tokens: auto` measured for SmolLM2-135M on an H100 (results/imdb_gpu/logs) by
    layers x width, as benchmarks/README.md scales it. `auto` must give a budget that uses the card: a batch of 256
    IMDB openings (2-7 tokens) with answers (4-15) in one or two passes, where the cpu preset's 384-token cap takes
    fifteen, and the passes plus the agents' gradients and Adam moments within the free memory."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gib, mib = 2 ** 30, 2 ** 20
    with torch.device("meta"):  # GPT2-Large's shapes, no memory
        large = GPT2LMHeadModel(GPT2Config(n_layer=36, n_embd=1280, n_head=20))
    weights = sum(p.numel() * p.element_size() for p in large.parameters())
    per_token = 2.65 * mib * (36 * 1280) / (30 * 576)  # SmolLM2-135M: 30 layers of width 576
    rng = np.random.default_rng(0)
    lengths = list(rng.integers(2, 8, 256) + rng.integers(4, 16, 256))  # the paper's query and answer lengths
    for agents in (1, 2):  # PPO, CORY: each agent's policy, and one shared reference
        free = 79 * gib - (agents + 1) * weights
        reserve = agents * budget.trainable_state_bytes(large)
        tokens = budget.auto_pass_tokens(free, per_token, reserve)
        assert tokens >= 10 * 384, (agents, tokens)
        assert len(pass_plan(lengths, tokens)) <= 2 < len(pass_plan(lengths, 384))
        used = reserve + tokens * per_token
        assert 0.5 * free < used <= free, (agents, used / gib, free / gib)
