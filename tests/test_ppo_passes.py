"""Our PPO step (response window, rollout reuse, token budget per pass) against trl's stock PPOTrainer.step:
the same statistics and the same weight update, up to float rounding, on the tiny model."""
import numpy as np
import pytest
import torch

from conftest import IMDB_PPO
from cory import models
from cory.assets import locate
from cory.config import build
from cory.agent import Agent
from cory.speedups.passes import pass_plan

STATS = ("objective/kl", "objective/entropy", "ppo/loss/total", "ppo/loss/policy", "ppo/loss/value",
         "ppo/policy/approxkl", "ppo/policy/clipfrac", "ppo/val/vpred", "ppo/returns/mean", "ppo/policy/entropy")


class StockAgent(Agent):
    def trainer_class(self):
        from trl import PPOTrainer
        return PPOTrainer, {}


class PaddedAgent(Agent):
    """Ours with right-padded passes instead of packed ones (models cory.speedups.packing cannot serve)."""

    def trainer_class(self):
        from cory.speedups.windowed import WindowedPPOTrainer

        class Padded(WindowedPPOTrainer):
            pack = False
        return Padded, {"max_pass_tokens": self.cfg.max_pass_tokens}


def kl_agent(where: bool):
    """Ours with the full-vocabulary KL taken in the rollout pass (True) or by trl from the window (False),
    whatever the size rule of ``kl_in_rollout = "auto"`` would choose."""
    class KLAgent(Agent):
        def trainer_class(self):
            from cory.speedups.windowed import WindowedPPOTrainer

            class Trainer(WindowedPPOTrainer):
                kl_in_rollout = where
            return Trainer, {"max_pass_tokens": self.cfg.max_pass_tokens}
    return KLAgent


KLInRolloutAgent, KLByTrlAgent = kl_agent(True), kl_agent(False)


def test_pass_plan_splits_by_tokens_and_covers_every_sample():
    lengths = [5, 40, 12, 33, 7, 21, 40, 3]
    assert pass_plan(lengths, 0) == [list(range(8))]
    assert pass_plan(lengths, 8 * 40) == [list(range(8))]
    for budget in (40, 80, 100, 150, 200):
        plan = pass_plan(lengths, budget)
        assert sorted(i for p in plan for i in p) == list(range(8))
        assert all(len(p) * max(lengths[i] for i in p) <= budget for p in plan)
        assert len(plan) > 1
    # a sequence longer than the budget still gets a pass, alone
    assert sorted(pass_plan([50, 10, 10], 30), key=len)[0] == [0]
    # like lengths share a pass: the two longest first
    assert pass_plan(lengths, 100)[0] == [1, 6]
    # packed passes hold real tokens only: 161 tokens fit in 161, and in two passes of at most 100
    assert pass_plan(lengths, 161, packed=True) == [list(range(8))]
    plan = pass_plan(lengths, 100, packed=True)
    assert len(plan) == 2 and all(sum(lengths[i] for i in p) <= 100 for p in plan)


@pytest.fixture(scope="module")
def setup(ppo_batch):
    return ppo_batch


def run_step(setup, cls, tmp_path, **over):
    import copy

    tok, reference, policy, queries, responses = setup
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 4,
                          "ppo_epochs": 2, "init_kl_coef": 0.2, "learning_rate": 1e-3,
                          "output_dir": str(tmp_path), **over})
    agent = cls("policy", cfg, copy.deepcopy(policy), reference, tok)
    np.random.seed(0)  # trl shuffles mini-batches with numpy
    stats = agent.step(queries, responses, [1.0, -0.5, 0.25, 2.0])
    params = torch.cat([p.detach().flatten() for p in agent.policy.parameters()])
    return stats, params


CASES = [
    {},                                                                # one pass, rollout reused as epoch 0
    {"max_pass_tokens": 30},                                           # several passes per mini-batch
    {"mini_batch_size": 2, "gradient_accumulation_steps": 2},          # trl's own accumulation
    {"mini_batch_size": 2, "gradient_accumulation_steps": 2, "max_pass_tokens": 16},
    {"max_grad_norm": 0.01, "max_pass_tokens": 30},                    # clipping sees the summed gradient
]


@pytest.mark.parametrize("cls,over", [(Agent, o) for o in CASES] + [(PaddedAgent, o) for o in CASES[:2]]
                         + [(KLInRolloutAgent, o) for o in CASES] + [(KLByTrlAgent, o) for o in CASES],
                         ids=[f"packed{i}" for i in range(len(CASES))] + ["padded0", "padded1"]
                         + [f"kl_in_rollout{i}" for i in range(len(CASES))]
                         + [f"kl_by_trl{i}" for i in range(len(CASES))])
def test_our_step_matches_trl(setup, tmp_path, cls, over):
    before = torch.cat([p.detach().flatten() for p in setup[2].parameters()])
    stock_stats, stock_params = run_step(setup, StockAgent, tmp_path / "stock", **over)
    stats, params = run_step(setup, cls, tmp_path / "ours", **over)
    for key in STATS:
        assert float(stats[key]) == pytest.approx(float(stock_stats[key]), rel=2e-4, abs=1e-5), key
    update = (stock_params - before).norm()
    assert update > 0
    assert float((params - stock_params).norm() / update) < 1e-3


def test_auto_takes_the_kl_in_the_rollout_pass_where_trls_tensors_are_large(setup, tmp_path, monkeypatch):
    from cory.speedups import windowed

    tok, reference, policy, queries, responses = setup
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 4,
                          "max_pass_tokens": 0, "output_dir": str(tmp_path)})
    trainer = Agent("policy", cfg, policy, reference, tok).trainer
    assert trainer.kl_in_rollout == "auto"
    assert not trainer._takes_kl_in_rollout(queries, responses)  # a few KB: left to trl
    monkeypatch.setattr(windowed, "KL_TENSORS_LIMIT", 0)
    assert trainer._takes_kl_in_rollout(queries, responses)
    monkeypatch.setattr(windowed, "KL_TENSORS_LIMIT", 2 ** 40)
    trainer.max_pass_tokens = 16  # the batch in several passes: memory is what limits it
    assert trainer._takes_kl_in_rollout(queries, responses)


def test_packed_attention_is_plain_sdpa_outside_a_packed_pass():
    from cory.speedups import packing

    tok = models.load_tokenizer(locate("tiny"))
    model = models.load_policy(locate("tiny")).pretrained_model.eval()
    ids = torch.tensor([tok("The film was very good")["input_ids"], tok("I did not like it")["input_ids"]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        packing.register()
        model.config._attn_implementation = packing.NAME
        try:
            dispatched = model(input_ids=ids).logits
        finally:
            model.config._attn_implementation = "sdpa"
        with packing.packed(model.config, [ids.shape[1], ids.shape[1]], ids.device) as layout:
            packed = model(input_ids=ids.reshape(1, -1), position_ids=layout.position_ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.allclose(dispatched, plain, atol=1e-5)
    assert torch.allclose(packed.reshape(plain.shape), plain, atol=1e-4)


def test_budget_does_not_change_the_step(setup, tmp_path):
    before = torch.cat([p.detach().flatten() for p in setup[2].parameters()])
    one_stats, one_params = run_step(setup, Agent, tmp_path / "one")
    for budget in (12, 30, 45):
        stats, params = run_step(setup, Agent, tmp_path / f"b{budget}", max_pass_tokens=budget)
        for key in STATS:
            assert float(stats[key]) == pytest.approx(float(one_stats[key]), rel=1e-4, abs=1e-6), (budget, key)
        # Adam divides by the gradient's running scale: compare updates, not single weights
        assert float((params - one_params).norm() / (one_params - before).norm()) < 1e-3
