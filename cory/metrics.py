"""Measures of a batch of answers that show a policy degenerating: few distinct words, tokens repeated in a row.

The paper's sign of distribution collapse is text like "marvelous marvelous splendid ..."; these numbers show it
without reading samples. Every metrics row (``cory.game``) and every held-out evaluation (``cory.heldout``)
carries them.
"""
from __future__ import annotations

from typing import Sequence

REPEAT_RUN = 4  # a token this many times in a row marks an answer as repeating itself


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Unique n-grams / total n-grams over all ``texts`` (whitespace words; n-grams never span two texts), so over
    the answers of ``n`` words or more: a shorter answer holds no n-gram. None (null in JSON, "n/a" in a table)
    when no answer does: distinct-2 of one-word answers is undefined, not 0, and says nothing of collapse. A
    collapsed policy repeating itself scores low."""
    grams: list[tuple[str, ...]] = []
    for text in texts:
        words = text.split()
        grams.extend(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return len(set(grams)) / len(grams) if grams else None


def longest_run(ids: Sequence[int]) -> int:
    """The most times one token follows itself in a row in ``ids`` (0 for no tokens)."""
    best = run = 0
    previous = None
    for token in ids:
        run = run + 1 if token == previous else 1
        previous = token
        best = max(best, run)
    return best


def repeat_share(answers: Sequence[Sequence[int]], run: int = REPEAT_RUN) -> float:
    """The share of answers (token ids) holding one token ``run`` or more times in a row; 0.0 for no answers."""
    answers = [[int(t) for t in a] for a in answers]
    return sum(longest_run(a) >= run for a in answers) / len(answers) if answers else 0.0


def degeneration(texts: Sequence[str], ids: Sequence[Sequence[int]]) -> dict[str, float | None]:
    """distinct-1 and distinct-2 of the answers' words (None where no answer has 1 or 2 words), and the share of
    answers repeating a token 4+ times."""
    return {"distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
            f"repeat{REPEAT_RUN}_share": repeat_share(ids)}


# ----------------------------------------------------------------------------- knowledge transfer
# CORY's mechanism is that the observer, reading the pioneer's answer, copies or corrects it, and the collective
# reward then pays both. These say whether it does, on the same queries: the observer's reward minus the pioneer's,
# and for a 0/1 reward P(observer right | pioneer right) and P(observer right | pioneer wrong). Undefined (NaN,
# written as null) where no pioneer answer was right (or wrong), and the rates where the reward is not 0/1.
TRANSFER_KEYS = ("transfer/observer_minus_pioneer", "transfer/copy_rate", "transfer/correction_rate")
# The control for copying (0/1 rewards, held-out evaluations only): each question shown the pioneer's answer to the next
# question instead, an answer that belongs elsewhere. The copy rate under it (P(observer right | the pioneer's answer
# to this question was right), though it was not shown) says how much of the copy rate is easy questions; the echo
# rate (P(the observer's answer is right for the shown answer's question | that answer was right)) how often the
# observer writes down what it is shown whatever the question.
UNRELATED_KEYS = ("transfer/unrelated_copy_rate", "transfer/echo_rate")


def _rate(hits: list[bool]) -> float:
    return sum(hits) / len(hits) if hits else float("nan")


def copy_hits(pioneer: Sequence[float], observer: Sequence[float]) -> list[bool]:
    """A copy rate's sample: for each question the pioneer got right, whether the observer got it right too."""
    return [o > 0.5 for p, o in zip(pioneer, observer) if p > 0.5]


def knowledge_transfer(pioneer: Sequence[float], observer: Sequence[float], zero_one: bool) -> dict[str, float]:
    """The three ``TRANSFER_KEYS`` of paired task rewards (``pioneer[i]`` and ``observer[i]`` answer query i);
    ``zero_one``: the task's reward is 1 for a right answer and 0 for a wrong one."""
    if len(pioneer) != len(observer):
        raise ValueError(f"{len(pioneer)} pioneer rewards but {len(observer)} observer rewards")
    if not pioneer:
        return dict.fromkeys(TRANSFER_KEYS, float("nan"))
    gap = sum(observer) / len(observer) - sum(pioneer) / len(pioneer)
    copy = correction = float("nan")
    if zero_one:
        copy = _rate(copy_hits(pioneer, observer))
        correction = _rate([o > 0.5 for p, o in zip(pioneer, observer) if p <= 0.5])
    return dict(zip(TRANSFER_KEYS, (float(gap), copy, correction)))


def echo_hits(shown: Sequence[float], right_for_shown: Sequence[float]) -> list[bool]:
    """The echo rate's sample: for each shown answer that was right on its own question, whether the observer's
    answer is right there too (``right_for_shown``); a wrong one written down would score as any wrong guess does."""
    return [r > 0.5 for s, r in zip(shown, right_for_shown) if s > 0.5]


def unrelated_reference(pioneer: Sequence[float], observer: Sequence[float], shown: Sequence[float],
                        right_for_shown: Sequence[float]) -> dict[str, float]:
    """The two ``UNRELATED_KEYS`` of 0/1 rewards: ``pioneer[i]``, the pioneer's reward on question i (its answer not
    shown); ``observer[i]``, the observer's there when shown the answer ``shown[i]`` scored on its own question;
    ``right_for_shown[i]``, the observer's answer scored on that other question (``cory.heldout.unrelated_control``
    gives the last three)."""
    if not len(pioneer) == len(observer) == len(shown) == len(right_for_shown):
        raise ValueError("unrelated_reference: the four reward lists differ in length")
    return {UNRELATED_KEYS[0]: _rate(copy_hits(pioneer, observer)),
            UNRELATED_KEYS[1]: _rate(echo_hits(shown, right_for_shown))}
