"""The arithmetic of CORY: role sequence, reward combination, combined reward, score normalisation."""

import numpy as np
import pytest

from cory.ppo import ScoreNormalizer
from cory.game import Roles, collective_rewards, combined_reward, is_swap_step, roles_at, swap_roles


@pytest.mark.parametrize("period,expected", [
    (1, ["llm1", "llm2", "llm1", "llm2", "llm1", "llm2"]),
    (2, ["llm1", "llm1", "llm2", "llm2", "llm1", "llm1"]),
    (5, ["llm1"] * 5 + ["llm2"] * 5 + ["llm1"]),
    (0, ["llm1"] * 7),
])
def test_role_sequence(period, expected):
    roles = [roles_at(s, period) for s in range(len(expected))]
    assert [r.pioneer for r in roles] == expected
    assert all({r.pioneer, r.observer} == {"llm1", "llm2"} for r in roles)  # the other agent observes
    swaps = [s for s in range(len(expected)) if is_swap_step(s, period)]
    assert swaps == [s for s in range(1, len(expected)) if expected[s] != expected[s - 1]]
    assert all(roles[s] == swap_roles(roles[s - 1]) for s in swaps)


def test_swap_roles_exchanges_pioneer_and_observer():
    assert swap_roles(Roles(pioneer="llm1", observer="llm2")) == Roles(pioneer="llm2", observer="llm1")
    assert swap_roles(swap_roles(Roles("llm1", "llm2"))) == Roles("llm1", "llm2")


def test_reward_combination():
    own, partner = [1.0, 0.0, -2.0], [0.5, 1.0, 3.0]
    assert collective_rewards(own, partner, 1.0) == [1.5, 1.0, 1.0]   # paper: r1 + r2
    assert collective_rewards(own, partner, 0.0) == own                # independent learners
    assert collective_rewards(own, partner, -1.0) == [0.5, -1.0, -5.0]  # competitive
    # GSM8K: 0/1 correctness sums to {0, 1, 2}
    assert sorted(set(collective_rewards([0, 1, 0, 1], [0, 0, 1, 1], 1.0))) == [0, 1, 2]


def test_combined_reward():
    assert combined_reward(2.0, 3.0, 0.1) == pytest.approx(1.7)
    assert combined_reward(-1.0, 0.0, 0.3) == -1.0


def test_score_normalizer_matches_running_moments():
    rng = np.random.default_rng(0)
    norm = ScoreNormalizer()
    seen = []
    for _ in range(4):
        batch = list(rng.normal(3.0, 2.0, size=16))
        seen += batch
        out = norm(batch)
        mean, std = np.mean(seen), np.std(seen, ddof=1)
        assert norm.mean == pytest.approx(mean)
        assert norm.std == pytest.approx(std)
        assert out == pytest.approx([(x - mean) / (std + np.finfo(np.float32).eps) for x in batch])
    state = norm.state_dict()
    other = ScoreNormalizer()
    other.load_state_dict(state)
    assert other([1.0, 2.0]) == norm([1.0, 2.0])
