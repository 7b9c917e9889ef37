"""The learner switch (issue 63, ``advantage_estimator``): RLOO's leave-one-out baseline, GRPO's group normalisation
and the masks of answers of different lengths on hand-computed inputs; GAE's path unchanged; the critic-free learners
load no value head; K answers per prompt in PPO and in CORY's game; the config's one-line errors."""
import math

import pytest
import torch

from conftest import IMDB_PPO, REPO, rejected, trained
from cory.config import PPOArgs, build, metadata
from cory.run.outputs import read_jsonl
from cory.ppo import (CRITIC_FREE, ESTIMATORS, advantages, explained_variance, gae, group_normalised, leave_one_out,
                      per_token_rewards, whiten)


def test_the_config_offers_every_estimator_and_only_those():
    assert metadata(PPOArgs, "advantage_estimator")["choices"] == ESTIMATORS == ("gae", *CRITIC_FREE)


def test_rloo_subtracts_the_mean_of_the_other_answers_to_the_same_prompt():
    # two prompts, K = 3: prompt 0's answers scored 1, 2, 6; prompt 1's 0, 0, 3
    scores = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])
    # 1 - (2 + 6)/2, 2 - (1 + 6)/2, 6 - (1 + 2)/2; 0 - (0 + 3)/2, 0 - (0 + 3)/2, 3 - 0
    assert leave_one_out(scores, 3).tolist() == [-3.0, -1.5, 4.5, -1.5, -1.5, 3.0]
    # K = 2: each answer against the other alone
    assert leave_one_out(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2).tolist() == [1.0, -1.0, 0.0, 0.0]


def test_grpo_normalises_within_each_prompt_and_a_group_scored_alike_gives_zero():
    scores = torch.tensor([1.0, 2.0, 6.0, 5.0, 5.0, 5.0])
    out = group_normalised(scores, 3)
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)  # mean 3, Bessel-corrected: sqrt(7)
    assert out[:3].tolist() == pytest.approx([-2 / (std + 1e-4), -1 / (std + 1e-4), 3 / (std + 1e-4)], rel=1e-6)
    assert out[3:].tolist() == [0.0, 0.0, 0.0]  # zero variance: no signal, and no division by zero


def ragged():
    """Two answers to one prompt (K = 2), of 3 tokens and of 1: the KL past the second answer's end is garbage that
    must reach nothing."""
    masks = torch.tensor([[1, 1, 1], [1, 0, 0]])
    kl = torch.tensor([[0.2, 0.4, 0.6], [0.8, 9.0, 9.0]])
    return masks, kl


def test_critic_free_advantages_by_hand_on_answers_of_different_lengths():
    masks, kl = ragged()
    scores = torch.tensor([1.0, 0.0])
    rewards, non_score, adv, returns = advantages("rloo", scores, None, kl, masks, kl_coef=0.5, k=2, gamma=1.0,
                                                  lam=0.95)
    # RLOO scores: 1 - 0 = 1, 0 - 1 = -1, at each answer's last token; -0.5 * KL at every token
    assert rewards[0].tolist() == pytest.approx([-0.1, -0.2, -0.3 + 1.0])
    assert rewards[1, 0].item() == pytest.approx(-0.4 - 1.0)
    # the advantage is each token's reward-to-go (gamma 1), 0 past the answer's end whatever the KL there
    assert adv[0].tolist() == pytest.approx([0.4, 0.5, 0.7])
    assert adv[1].tolist() == pytest.approx([-1.4, 0.0, 0.0])
    assert torch.equal(adv, returns)
    assert non_score[0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    # discounted: gamma 0.5 on the first answer
    _, _, adv, _ = advantages("rloo", scores, None, kl, masks, kl_coef=0.5, k=2, gamma=0.5, lam=0.95)
    assert adv[0].tolist() == pytest.approx([-0.1 + 0.5 * (-0.2 + 0.5 * 0.7), -0.2 + 0.5 * 0.7, 0.7])
    # GRPO: the two answers' scores become +-0.5 / (std + 1e-4), std of (1, 0) = sqrt(0.5)
    _, _, adv, _ = advantages("grpo", scores, None, kl, masks, kl_coef=0.5, k=2, gamma=1.0, lam=0.95)
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert adv[0].tolist() == pytest.approx([-0.6 + z, -0.5 + z, -0.3 + z])
    assert adv[1].tolist() == pytest.approx([-0.4 - z, 0.0, 0.0])


def test_gae_through_the_switch_is_the_step_as_it_was():
    """``gae`` is today's path to the bit: per-token rewards, GAE on the values, whitened (test_ppo_formulas holds
    those against trl's)."""
    g = torch.Generator().manual_seed(0)
    masks = (torch.arange(5)[None, :] < torch.tensor([5, 2, 4, 1])[:, None]).long()
    values, kl, scores = torch.randn(4, 5, generator=g) * masks, torch.rand(4, 5, generator=g), torch.randn(4, generator=g)
    rewards, non_score, adv, returns = advantages("gae", scores, values, kl, masks, 0.2, 1, 1.0, 0.95)
    want_rewards, want_non_score = per_token_rewards(scores, kl, masks, 0.2)
    want_adv, want_returns = gae(values, want_rewards, masks, 1.0, 0.95)
    assert torch.equal(rewards, want_rewards) and torch.equal(non_score, want_non_score)
    assert torch.equal(adv, whiten(want_adv, masks)) and torch.equal(returns, want_returns)


def test_explained_variance_is_cleanrls_over_the_response_tokens():
    masks = torch.tensor([[1, 1, 1, 0]])
    values, returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]]), torch.tensor([[1.0, 2.0, 5.0, -7.0]])
    # Var(returns) = 26/9, Var(returns - values) = Var(0, 0, 2) = 8/9 (population variances, as numpy's)
    assert explained_variance(values, returns, masks) == pytest.approx(1 - 8 / 26)
    assert explained_variance(returns, returns, masks) == 1.0
    assert math.isnan(explained_variance(values, torch.full_like(values, 2.0), masks))  # returns that do not vary


# ----------------------------------------------------------------------------- the policy and the step

def test_a_critic_free_learner_loads_no_value_head_and_takes_no_value_loss(ppo_batch, tmp_path):
    from cory.agent import make_agents
    from cory.assets import locate

    tok, _, _, queries, responses = ppo_batch
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 2,
                           "ppo_epochs": 2, "init_kl_coef": 0.2, "learning_rate": 1e-3, "precision": "fp32",
                           "advantage_estimator": "rloo", "num_generations": 2, "value_head_init": "zero",
                           "output_dir": str(tmp_path)})
    agents, _ = make_agents(cfg, locate("tiny"), ["policy"], tok, precision="fp32")
    agent = agents["policy"]
    assert not hasattr(agent.policy, "v_head")
    assert not [n for n, _ in agent.policy.named_parameters() if "v_head" in n]
    assert not [n for n in agent.policy.state_dict() if "v_head" in n]
    before = torch.cat([p.detach().flatten().clone() for p in agent.policy.parameters()])
    stats = agent.step(queries, responses, [1.0, -0.5, 0.25, 2.0])
    after = torch.cat([p.detach().flatten() for p in agent.policy.parameters()])
    assert stats.value_loss == 0.0 and stats.total_loss == stats.policy_loss
    assert math.isnan(stats.mean_value) and math.isnan(stats.explained_variance)
    assert math.isfinite(stats.policy_loss) and (after - before).abs().max() > 0
    assert stats.frac_reward_zero_std == 0.0  # K = 2: (1, -0.5) and (0.25, 2) both differ
    assert stats.frac_minibatches_skipped == 0.0
    again = agent.step(queries, responses, [1.0, 1.0, 0.25, 2.0])
    assert again.frac_reward_zero_std == 0.5


def test_gae_steps_log_the_value_heads_explained_variance(ppo_step, tmp_path):
    _, stats, _ = ppo_step(tmp_path)
    assert math.isfinite(stats.explained_variance) and stats.explained_variance <= 1.0


# ----------------------------------------------------------------------------- K answers per prompt, the game

def test_cory_pairs_each_pioneer_answer_with_one_observer_answer_and_sums_their_rewards():
    """A hand-written CORY batch with K = 2: two queries, each twice side by side; observer answer k read pioneer
    answer k; the pair's collective reward is r1_k + r2_k; and each agent's RLOO baseline is over its own two
    answers to the same query."""
    from cory.game import answers_per_prompt, collective_rewards
    from cory.tasks.base import Example

    q1, q2 = Example(query="2+2", prompt="2+2="), Example(query="3+4", prompt="3+4=")
    batch = answers_per_prompt([q1, q2], 2)
    assert batch == [q1, q1, q2, q2]
    pioneer_answers = ["4", "5", "7", "1"]
    observer_prompts = [f"{ex.prompt} (pioneer: {a})" for ex, a in zip(batch, pioneer_answers)]
    assert observer_prompts[1] == "2+2= (pioneer: 5)"  # the pair: pioneer answer 1 and the observer's answer to it
    r1, r2 = [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]  # task rewards of the pioneer's and the observer's answers
    pioneer_reward = collective_rewards(r1, r2, 1.0)
    observer_reward = collective_rewards(r2, r1, 1.0)
    assert pioneer_reward == observer_reward == [2.0, 1.0, 1.0, 0.0]
    # query 1's pairs scored 2 and 1, query 2's 1 and 0: each agent's baseline is its other answer to the same query
    assert leave_one_out(torch.tensor(pioneer_reward), 2).tolist() == [1.0, -1.0, 1.0, -1.0]
    # independent agents (coef 0): the observer's own rewards, its own baseline
    assert leave_one_out(torch.tensor(collective_rewards(r2, r1, 0.0)), 2).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_the_batch_counts_answers_k_per_prompt(tmp_path):
    """batch_size 4 with K = 2 draws 2 prompts and puts each twice, side by side, in the iteration's batch."""
    from cory.config import load_yaml
    from cory.train import prepare_run

    values = load_yaml(REPO / "configs/imdb/ppo_tiny.yaml")
    values.update(output_dir=str(tmp_path / "run"), advantage_estimator="grpo", num_generations=2)
    run = prepare_run(build(IMDB_PPO, values))
    drawn, seen = [], []
    sample = run.task.sample
    run.task.sample = lambda n: drawn.append(n) or sample(n)
    run.iteration = lambda step, batch, *rest: seen.append(batch) or (None, [])
    try:
        run.play(0)
    finally:
        run.lock.release()
    (batch,) = seen
    assert drawn == [2] and len(batch) == 4
    assert batch[0] is batch[1] and batch[2] is batch[3] and batch[0] is not batch[2]


@pytest.mark.parametrize("script,preset", [  # make test keeps the arithmetic CORY run (the game with K answers,
    pytest.param("imdb_train/ppo.py", "configs/imdb/ppo_tiny.yaml", marks=pytest.mark.slow),  # and that script's
    pytest.param("imdb_train/cory.py", "configs/imdb/cory_tiny.yaml", marks=pytest.mark.slow),  # one end-to-end run)
    ("arithmetic_train/cory.py", "configs/arithmetic/cory_tiny.yaml")])
def test_rloo_runs_end_to_end_on_the_tiny_presets(tmp_path, script, preset):
    rows = trained(script, tmp_path / "run", "--config", preset, "--steps", "3", "--advantage_estimator", "rloo",
                   "--num_generations", "2")
    assert [r["step"] for r in rows] == [0, 1, 2]
    agents = {k.split("/")[0] for k in rows[0] if k.endswith("/task_reward")}
    for r in rows:
        for agent in agents:
            assert f"{agent}/value_loss" not in r and f"{agent}/explained_variance" not in r
            assert math.isfinite(r[f"{agent}/policy_loss"])
            assert 0.0 <= r[f"{agent}/frac_reward_zero_std"] <= 1.0  # the share of prompts the baseline left silent
            assert 0.0 <= r[f"{agent}/frac_minibatches_skipped"] <= 1.0
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert samples[0]["query"] == samples[1]["query"]  # K = 2: the first prompt's two answers side by side


@pytest.mark.slow
def test_gae_runs_log_explained_variance_per_agent(tmp_path):
    rows = trained("imdb_train/cory.py", tmp_path / "run", "--config", "configs/imdb/cory_tiny.yaml", "--steps", "1")
    for agent in ("llm1", "llm2"):
        assert rows[0][f"{agent}/explained_variance"] <= 1.0 and f"{agent}/value_loss" in rows[0]


# ----------------------------------------------------------------------------- the config's one-line errors

@pytest.mark.parametrize("argv,says", [
    (["--batch_size", "6", "--mini_batch_size", "2", "--num_generations", "4"],
     "batch_size: 6 is not divisible by num_generations 4"),
    (["--advantage_estimator", "rloo"], "num_generations: rloo needs at least 2 answers per prompt"),
    (["--advantage_estimator", "grpo", "--num_generations", "1"], "num_generations: grpo needs at least 2"),
    (["--advantage_estimator", "ppo"], "advantage_estimator: 'ppo' is not one of gae, rloo, grpo"),
    (["--num_generations", "0"], "num_generations: must be > 0, got 0"),
    (["--advantage_estimator", "rloo", "--num_generations", "2", "--fast_ppo", "false"],
     "advantage_estimator: rloo needs fast_ppo: true"),
])
@pytest.mark.parametrize("method", ["ppo", "cory"])
def test_learner_mistakes_are_one_line_before_any_model_loads(argv, says, method):
    line = rejected("imdb", method, ["--config", f"configs/imdb/{method}_tiny.yaml", *argv])
    assert says in line, line
