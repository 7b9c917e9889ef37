"""What the trainer needs from a task: prompts, the observer's prompt, and a reward."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass
class Example:
    """One query of a task.

    ``query`` is the task input as the reward and the observer template see it (IMDB: the
    review opening; GSM8K: the question). ``prompt`` is what the pioneer (or the single PPO
    policy) reads. ``prompt_ids`` pins the exact prompt tokens where the task samples at the
    token level (IMDB's 2-7 token openings); otherwise the trainer tokenizes ``prompt``.
    ``reference`` is the gold answer for objective tasks (GSM8K), else None.
    """

    query: str
    prompt: str
    prompt_ids: list[int] | None = None
    reference: str | None = None
    meta: dict = field(default_factory=dict)


class Task(Protocol):
    name: str

    def sample(self, batch_size: int) -> list[Example]:
        """The next training batch (deterministic given the task's seed)."""

    def eval_examples(self, limit: int | None = None) -> list[Example]:
        """Held-out examples, never drawn by ``sample``."""

    def observer_prompt(self, example: Example, pioneer_response: str) -> str:
        """The observer's knowledge-transfer prompt."""

    def clean_response(self, text: str) -> str:
        """The part of a decoded response the reward sees (e.g. GSM8K trims a new 'Question:')."""

    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        """Task reward of each (example, cleaned response) pair, one batched call."""

    def state_dict(self) -> dict:
        """Sampler position, so a resumed run draws the same batches."""

    def load_state_dict(self, state: dict) -> None: ...
