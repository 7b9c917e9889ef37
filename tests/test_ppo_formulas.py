"""cory.ppo's formulas, written out, against trl 0.11.4's own: GAE and whitening (``compute_advantages``), the
clipped losses and their statistics (``loss``), on random tensors with ragged response masks."""
from types import SimpleNamespace

import pytest
import torch
from trl import PPOTrainer
from trl.core import entropy_from_logits

from cory.ppo import PPOBatch, clipped_losses, gae, minibatch_stats, whiten


def ragged(batch=5, window=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1, 6][:batch])
    masks = (torch.arange(window)[None, :] < lengths[:, None]).long()
    return g, masks


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 0.0)])
def test_gae_and_whitening_are_trls(gamma, lam):
    g, masks = ragged()
    values, rewards = torch.randn(masks.shape, generator=g), torch.randn(masks.shape, generator=g)
    config = SimpleNamespace(gamma=gamma, lam=lam, whiten_rewards=False)
    trl_values, trl_advantages, trl_returns = PPOTrainer.compute_advantages(SimpleNamespace(config=config),
                                                                            values, rewards, masks)
    advantages, returns = gae(values * masks, rewards, masks, gamma, lam)
    # to the bit: bf16 training turns a last-bit difference into percents within two iterations
    assert torch.equal(values * masks, trl_values)
    assert torch.equal(returns, trl_returns)
    assert torch.equal(whiten(advantages, masks), trl_advantages)


def test_gae_by_hand():
    """One response of 3 tokens, γ = 0.5, λ = 1: A_2 = r_2 − V_2, A_1 = r_1 + γV_2 − V_1 + γA_2, ..."""
    values, rewards, masks = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.0, 0.0, 4.0]]), torch.ones(1, 3)
    advantages, returns = gae(values, rewards, masks, gamma=0.5, lam=1.0)
    a2 = 4.0 - 3.0
    a1 = 0.0 + 0.5 * 3.0 - 2.0 + 0.5 * a2
    a0 = 0.0 + 0.5 * 2.0 - 1.0 + 0.5 * a1
    assert advantages.tolist() == [[a0, a1, a2]]
    assert returns.tolist() == [[a0 + 1.0, a1 + 2.0, a2 + 3.0]]


def test_whiten_has_unit_variance_over_the_masked_tokens():
    g, masks = ragged()
    x = 3.0 + 2.0 * torch.randn(masks.shape, generator=g)
    w = whiten(x, masks)
    kept = w[masks.bool()]
    assert float(kept.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(kept.var()) == pytest.approx(1.0, rel=1e-5)  # Bessel-corrected, as trl's


@pytest.mark.parametrize("ratio_threshold", [10.0, 1.01])  # the second skips the mini-batch: losses logged as 0
def test_losses_and_statistics_are_trls(ratio_threshold):
    g, masks = ragged()
    shape = masks.shape
    old, new = torch.randn(shape, generator=g) - 2, torch.randn(shape, generator=g) * 0.3 - 2
    values, vpreds, returns = (torch.randn(shape, generator=g) for _ in range(3))
    advantages, logits = torch.randn(shape, generator=g), torch.randn(*shape, 11, generator=g)
    config = SimpleNamespace(cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, ratio_threshold=ratio_threshold)
    trainer = SimpleNamespace(config=config)
    trl_policy, trl_value, trl_stats = PPOTrainer.loss(trainer, old, values, logits, vpreds, new, masks, advantages,
                                                       returns)
    mb = PPOBatch([], [], torch.zeros(5), old, values, masks, old, torch.zeros(shape), advantages=advantages,
                  returns=returns)
    policy_loss, value_loss = clipped_losses(mb, new, vpreds, config)
    if ratio_threshold > 2:
        assert float(policy_loss) == pytest.approx(float(trl_policy), rel=1e-6)
        assert float(config.vf_coef * value_loss) == pytest.approx(float(trl_value), rel=1e-6)
    stats = minibatch_stats(mb, new, vpreds, entropy_from_logits(logits), config)
    assert stats.skipped == (ratio_threshold < 2)  # the mean ratio here is about 2.2
    for ours, theirs in [("policy_loss", "loss/policy"), ("value_loss", "loss/value"), ("total_loss", "loss/total"),
                         ("token_entropy", "policy/entropy"), ("approx_kl", "policy/approxkl"),
                         ("policy_kl", "policy/policykl"), ("clip_fraction", "policy/clipfrac"),
                         ("mean_value", "val/vpred"), ("mean_return", "returns/mean")]:
        assert getattr(stats, ours) == pytest.approx(float(trl_stats[theirs]), rel=1e-5, abs=1e-7), ours


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_kl_controller_is_trls(adaptive):
    """cory.ppo.KLController against trl 0.11.4's AdaptiveKLController / FixedKLController on the same KL readings
    (under, at and far over the target, where the clip binds), to the bit."""
    from trl.trainer.utils import AdaptiveKLController, FixedKLController

    from cory.ppo import kl_controller

    config = SimpleNamespace(init_kl_coef=0.3, adap_kl_ctrl=adaptive, target=6.0, horizon=10000.0)
    ours = kl_controller(config)
    theirs = AdaptiveKLController(0.3, 6.0, 10000.0) if adaptive else FixedKLController(0.3)
    for kl in [0.0, 0.5, 5.9, 6.0, 6.1, 7.2, 12.0, 45.0, 3.3, 1e-9, 100.0]:
        for n in (8, 32, 256):
            ours.update(kl, n)
            theirs.update(kl, n)
            assert ours.value == theirs.value
    assert (ours.value != 0.3) == adaptive
    # at most ±0.2 · n / horizon per batch: 45 nats against a target of 6 moves η by the clipped 0.2 · 256 / 10000
    one = kl_controller(config)
    one.update(45.0, 256)
    assert one.value == pytest.approx(0.3 * (1 + (0.2 * 256 / 10000 if adaptive else 0)))


def test_a_metrics_row_carries_the_steps_approx_kl_and_clip_fraction_under_cleanrls_names():
    from cory.game import agent_metrics
    from cory.ppo import StepStats
    from cory.rollout import Answers

    stats = StepStats(kl=1.5, sequence_entropy=10.0, kl_coef=0.01, mean_score=0.5, policy_loss=0.1, value_loss=0.2,
                      total_loss=0.3, token_entropy=2.0, approx_kl=0.0123, clip_fraction=0.25, mean_value=0.0,
                      mean_return=0.4)
    answers = Answers(texts=["a b c", "a b d"], ids=[torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4])])
    row = agent_metrics("policy", [1.0, 0.0], [1.0, 0.0], stats, answers, kl_coef=0.01)
    assert row["policy/approx_kl"] == 0.0123 and row["policy/clip_fraction"] == 0.25
    critic_free = agent_metrics("llm1", [1.0, 0.0], [1.0, 0.0], stats, answers, kl_coef=0.01, critic=False)
    assert critic_free["llm1/clip_fraction"] == 0.25 and "llm1/value_loss" not in critic_free


def test_the_step_logs_the_share_of_minibatches_skipped_and_of_prompts_whose_k_scores_are_alike():
    from cory.game import agent_metrics
    from cory.ppo import StepStats, frac_reward_zero_std
    from cory.rollout import Answers

    # K = 3: prompt 0 all right, prompt 1 mixed, prompt 2 all wrong, prompt 3 mixed: 2 of 4 give no group signal
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    assert frac_reward_zero_std(scores, 3) == 0.5
    assert frac_reward_zero_std(torch.tensor([0.3, 0.3, 0.7, 0.3]), 2) == 0.5
    stats = StepStats(kl=1.5, sequence_entropy=10.0, kl_coef=0.01, mean_score=0.5, policy_loss=0.1, value_loss=0.2,
                      total_loss=0.3, token_entropy=2.0, approx_kl=0.0123, clip_fraction=0.25, mean_value=0.0,
                      mean_return=0.4, frac_minibatches_skipped=0.25, frac_reward_zero_std=0.5)
    answers = Answers(texts=["a b c", "a b d"], ids=[torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4])])
    gae = agent_metrics("policy", [1.0, 0.0], [1.0, 0.0], stats, answers, kl_coef=0.01)
    assert gae["policy/frac_minibatches_skipped"] == 0.25 and "policy/frac_reward_zero_std" not in gae
    critic_free = agent_metrics("llm1", [1.0, 0.0], [1.0, 0.0], stats, answers, kl_coef=0.01, critic=False)
    assert critic_free["llm1/frac_reward_zero_std"] == 0.5


def test_a_minibatch_past_the_ratio_threshold_counts_as_skipped():
    from types import SimpleNamespace

    from cory.ppo import PPOBatch, minibatch_stats

    masks = torch.ones(2, 3)
    old = torch.zeros(2, 3)
    mb = PPOBatch(None, None, None, old, None, masks, None, None)
    mb.advantages, mb.returns = torch.ones(2, 3), torch.ones(2, 3)
    config = SimpleNamespace(cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, ratio_threshold=10.0)
    assert not minibatch_stats(mb, old, None, torch.zeros(2, 3), config).skipped
    assert minibatch_stats(mb, old + 3.0, None, torch.zeros(2, 3), config).skipped  # ratio e^3 ≈ 20 > 10
