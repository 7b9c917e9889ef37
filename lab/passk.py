"""pass@k: the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code".

With ``n`` samples per problem of which ``c`` are correct, pass@k = 1 - C(n-c, k) / C(n, k):
the chance that a random k-subset of the n samples holds at least one correct one. Computed
as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms large binomials.
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence


def _as_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct."""
    n, c, k = _as_int("n", n), _as_int("c", c), _as_int("k", k)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct_counts: Sequence[int], n: int, ks: int | Iterable[int]) -> dict[int, float]:
    """Mean pass@k over problems, each with ``n`` samples and ``correct_counts[j]`` correct."""
    counts = list(correct_counts)
    if not counts:
        raise ValueError("correct_counts is empty")
    k_list = [ks] if isinstance(ks, numbers.Integral) else list(ks)
    if not k_list:
        raise ValueError("ks is empty")
    return {
        _as_int("k", k): sum(pass_at_k(n, c, k) for c in counts) / len(counts)
        for k in sorted(set(k_list))
    }
