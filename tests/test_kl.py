"""The KL we report is the paper's: full-vocabulary KL(pi || pi0) summed over response tokens, batch mean."""
import pytest
import torch

from conftest import IMDB_PPO
from cory import models
from cory.assets import locate
from cory.config import build
from cory.agent import Agent
from cory.game import agent_metrics
from cory.rollout import Answers


def hand_kl(policy, reference, query, response) -> float:
    """sum_t sum_v pi(v|x_<t) (log pi(v|x_<t) - log pi0(v|x_<t)) over the response positions."""
    ids = torch.cat([query, response]).unsqueeze(0)
    with torch.no_grad():
        logp = torch.log_softmax(policy.pretrained_model(ids).logits[0].double(), -1)
        logq = torch.log_softmax(reference.pretrained_model(ids).logits[0].double(), -1)
    # the token at position i is predicted from position i - 1
    rows = range(len(query) - 1, ids.shape[1] - 1)
    return sum(float((logp[i].exp() * (logp[i] - logq[i])).sum()) for i in rows)


def test_reported_kl_is_full_vocabulary_kl(tmp_path):
    torch.manual_seed(0)
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 2, "mini_batch_size": 2,
                          "ppo_epochs": 1, "init_kl_coef": 0.2, "precision": "fp32", "output_dir": str(tmp_path)})
    tok = models.load_tokenizer(locate("tiny"))
    reference = models.load_reference(locate("tiny"))
    policy = models.load_policy(locate("tiny"))
    with torch.no_grad():  # move the policy away from the reference so the KL is not zero
        for p in policy.pretrained_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    agent = Agent("policy", cfg, policy, reference, tok)
    queries = [torch.tensor(tok("The film was")["input_ids"]), torch.tensor(tok("I did not")["input_ids"])]
    responses = [torch.tensor(tok(" very good indeed")["input_ids"]), torch.tensor(tok(" like it")["input_ids"])]
    policy.eval()
    expected = [hand_kl(policy, reference, q, r) for q, r in zip(queries, responses)]
    assert min(expected) > 0.01
    coef = agent.kl_coef
    stats = agent.step(queries, responses, [1.0, -1.0])
    answers = Answers([tok.decode(r) for r in responses], responses)
    row = agent_metrics("policy", [0.5, -0.25], [0.5, -0.25], stats, answers, coef)
    mean_kl = sum(expected) / len(expected)
    assert row["policy/kl"] == pytest.approx(mean_kl, rel=1e-4)
    assert row["policy/kl_coef"] == 0.2
    assert row["policy/task_reward"] == pytest.approx(0.125)
    assert row["policy/combined_reward"] == pytest.approx(0.125 - 0.2 * mean_kl, rel=1e-4)
    assert row["policy/response_length"] == pytest.approx((len(responses[0]) + len(responses[1])) / 2)
