"""pass@k against brute-force enumeration of all k-subsets, plus edge cases."""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from lab.passk import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> Fraction:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(samples[i] for i in s) for s in subsets)
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            exact = brute_force(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)
            # and the closed form
            assert exact == 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_edge_cases():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 8) == 1.0  # n - c < k
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(100, 37, 1) == pytest.approx(0.37)
    assert isinstance(pass_at_k(5, 2, 2), float)


def test_large_n_is_stable():
    n, c, k = 2000, 7, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(10**6, 1, 1) == pytest.approx(1e-6, rel=1e-9)
    # monotone in k and in c
    vals = [pass_at_k(200, 5, k) for k in range(1, 201)]
    assert all(a <= b + 1e-15 for a, b in zip(vals, vals[1:]))
    vals = [pass_at_k(50, c, 5) for c in range(51)]
    assert all(a <= b + 1e-15 for a, b in zip(vals, vals[1:]))


@pytest.mark.parametrize(
    "n, c, k",
    [(5, 0, 6), (5, 0, 0), (5, 0, -1), (5, 6, 1), (5, -1, 1), (0, 0, 1), (-1, 0, 1),
     (5.0, 1, 1), (5, 1.5, 1), (5, 1, True), (5, 1, "1")],
)
def test_bad_values(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    counts = [0, 1, 4, 10]
    out = mean_pass_at_k(counts, 10, [1, 5, 10])
    assert list(out) == [1, 5, 10]
    for k, v in out.items():
        assert v == pytest.approx(sum(pass_at_k(10, c, k) for c in counts) / 4)
    assert out[1] == pytest.approx((0 + 0.1 + 0.4 + 1.0) / 4)
    assert out[10] == pytest.approx(0.75)
    assert mean_pass_at_k(counts, 10, 1) == {1: out[1]}
    assert mean_pass_at_k(counts, 10, (5, 1, 5)) == {1: out[1], 5: out[5]}
    with pytest.raises(ValueError):
        mean_pass_at_k([], 10, [1])
    with pytest.raises(ValueError):
        mean_pass_at_k(counts, 10, [11])
    with pytest.raises(ValueError):
        mean_pass_at_k([11], 10, [1])
    with pytest.raises(ValueError):
        mean_pass_at_k(counts, 10, [])
