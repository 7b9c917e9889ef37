"""Which samples go into which forward pass when a mini-batch exceeds the token budget of one pass."""
from __future__ import annotations


def pass_plan(lengths: list[int], max_tokens: int, packed: bool = False) -> list[list[int]]:
    """Sample indices grouped into forward passes of at most ``max_tokens`` tokens each: the sum of the
    lengths for ``packed`` passes, else samples x longest (padding counts); 0 = no limit, everything in
    one pass in the given order.

    Over the limit, the fewest passes that fit: for padded passes runs of like-length sequences (longest
    first, so little is padded) of near-equal count, for packed ones near-equal token counts. A sequence
    longer than the limit gets a pass of its own.
    """
    def cost(group):  # groups are sorted longest first
        return sum(lengths[i] for i in group) if packed else len(group) * lengths[group[0]]

    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    if max_tokens <= 0 or cost(order) <= max_tokens:
        return [list(range(n))]
    for k in range(2, n + 1):
        if packed:  # padding costs nothing: balance the token counts (each sequence to the lightest pass)
            groups, load = [[] for _ in range(k)], [0] * k
            for i in order:
                j = load.index(min(load))
                groups[j].append(i)
                load[j] += lengths[i]
        else:  # like lengths together, so little is padded
            sizes = [n // k + (j < n % k) for j in range(k)]
            groups = [order[sum(sizes[:j]): sum(sizes[:j + 1])] for j in range(k)]
        if all(cost(g) <= max_tokens for g in groups):
            return groups
    return [[i] for i in order]
