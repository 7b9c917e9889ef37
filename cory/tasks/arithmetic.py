"""Arithmetic: small sums and products from reasoning-gym, asked in GSM8K's one-shot form and scored with GSM8K's 0/1
reward. NOT GSM8K: the paper's objective-reward regime (a correct answer the observer can copy, a reward no lexicon
can game) at a size a 135M model can solve (results/arithmetic_cpu_pilot).

A setting (the config's ``dataset``) fixes the generator and its difficulty: ``sums_2x1`` is reasoning-gym's
``chain_sum`` with 2 terms of 1 digit ("7 - 9"), ``sums_2x12`` 2 terms of 1 or 2 digits, ``products_2x1`` two one-digit
factors, and so on (``SETTINGS``). Prompts:

    Question: What is 12 + 7?
    Answer: 12 + 7 = 19. The answer is 19.

    Question: What is 4 - 9?
    Answer:

and the observer's the same with "Reference: <pioneer's answer>" on its own line before "Answer:" (GSM8K's form,
``cory.tasks.gsm8k.question_prompt``). The reward is 1 when the answer's final number (GSM8K's extraction: "####",
else "answer is", else the last number) equals the result, else 0; an answer ends at EOS or where the model starts a
new "Question:".

**The answer is its first line** (``first_line``): the reward reads an answer's first line that holds anything, cut
where the model starts a new "Question" (with or without its colon), and the observer's reference is that same line,
so the observer sees exactly the answer the reward scored. This departs from the paper's GSM8K form (the reward reads
the whole answer up to a new "Question:", and the observer sees all of it): a sum's answer is one line, as the worked
example's is, and a pioneer that runs on past it ("...The answer is 176.\n\nWhat is 3 + 4?\n3 + 4 = 7...") handed
the observer a reference it copied correctly 24% of the time, against 69% for a one-line one
(results/arithmetic_cpu_comparison's training samples; docs/arithmetic.md). The tokens PPO trains on are cut to the
same line (``cory.rollout.decode_and_clean``).

Held-out problems: the expressions whose hash falls in the test share (``TEST_PER_MILLE``) never appear in training,
whatever the seed; the held-out set is the first ``EVAL_SIZE`` of them drawn from a fixed stream, repeats kept, so it
holds the problems in the training's own mix. (``sums_2x12`` draws a one-digit sum half the time from only 200 such
expressions, about 30 of them held out: a set of distinct expressions was 86.5% two-digit sums, and its one-digit
reading rested on 27 answers; results/arithmetic_cpu_pilot/DESIGN.md, stage 3. The note printed with an evaluation
says how many are distinct.)
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

from cory.tasks.base import REWARD_METRICS, Evaluation, Example, state_count
from cory.tasks.gsm8k import CorrectnessTask, question_prompt
from cory.tasks.gsm8k_answers import extract_answer, normalize_number
from cory.tasks.registry import register_task


@dataclass(frozen=True)
class Setting:
    """One difficulty: reasoning-gym's generator and its knobs."""

    generator: str  # "chain_sum" (+ and -) or "products"
    terms: int
    min_digits: int
    max_digits: int

    def describe(self) -> str:
        digits = (f"{self.min_digits}" if self.min_digits == self.max_digits
                  else f"{self.min_digits}-{self.max_digits}")
        what = "sums and differences" if self.generator == "chain_sum" else "products"
        return f"{what} of {self.terms} terms of {digits} digit(s) (reasoning-gym {self.generator})"


SETTINGS = {
    "sums_2x1": Setting("chain_sum", 2, 1, 1),
    "sums_2x12": Setting("chain_sum", 2, 1, 2),
    "sums_2x2": Setting("chain_sum", 2, 2, 2),
    "sums_3x1": Setting("chain_sum", 3, 1, 1),
    "products_2x1": Setting("products", 2, 1, 1),
    "products_2x12": Setting("products", 2, 1, 2),
}
DEFAULT_SETTING = "sums_2x12"  # what dataset "auto" stands for: the pilot's choice (results/arithmetic_cpu_pilot)

ONE_SHOT_QUESTION = "What is 12 + 7?"
ONE_SHOT_ANSWER = "12 + 7 = 19. The answer is 19."
_ONE_SHOT_BLOCK = f"Question: {ONE_SHOT_QUESTION}\nAnswer: {ONE_SHOT_ANSWER}\n\n"

EVAL_SIZE = 200
TEST_PER_MILLE = 150  # the share of a setting's expressions kept for the held-out set
# reasoning-gym draws item i of seed s with random.Random(s + i): streams sit far apart so that no two overlap
_STREAM_STRIDE = 10 ** 9
_EVAL_STREAM = 7


_NEW_QUESTION = re.compile(r"\bQuestion\b")


def first_line(text: str) -> str:
    """What the reward reads of an answer, and the observer's reference: the first line that holds anything, cut
    where a new "Question" starts (with or without its colon), without trailing whitespace. Always a prefix of
    ``text`` (leading whitespace kept), so the answer's tokens can be cut to match."""
    line = re.match(r"\s*[^\n]*", text).group(0)  # type: ignore[union-attr]  # matches any string
    new_question = _NEW_QUESTION.search(line)
    if new_question is not None:
        line = line[: new_question.start()]
    return line.rstrip()


def build_prompt(question: str) -> str:
    """The pioneer's (and single-agent PPO's) prompt: the worked example, then the question."""
    return question_prompt(_ONE_SHOT_BLOCK, question)


def build_observer_prompt(question: str, pioneer_response: str) -> str:
    """The observer's prompt: as ``build_prompt`` with the pioneer's answer as a reference."""
    return question_prompt(_ONE_SHOT_BLOCK, question, reference=pioneer_response)


def is_held_out(expression: str) -> bool:
    """Whether an expression belongs to the held-out share (a hash of its text, so it never depends on a seed)."""
    key = " ".join(expression.split()).encode("utf-8")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 1000 < TEST_PER_MILLE


def _dataset(setting: Setting, stream: int, size: int):
    import reasoning_gym

    return reasoning_gym.create_dataset(setting.generator, size=size, seed=stream * _STREAM_STRIDE,
                                        min_terms=setting.terms, max_terms=setting.terms,
                                        min_digits=setting.min_digits, max_digits=setting.max_digits)


def _example(item: dict, split: str, index: int) -> Example:
    expression = item["metadata"]["expression"]
    question = f"What is {expression}?"
    return Example(query=question, prompt=build_prompt(question), reference=normalize_number(str(item["answer"])),
                   meta={"split": split, "index": index, "expression": expression})


@lru_cache(maxsize=8)
def held_out(name: str, size: int = EVAL_SIZE) -> tuple[Example, ...]:
    """The first ``size`` held-out problems drawn from ``name``'s fixed evaluation stream, repeats kept: the
    training's mix of problems, none of them ever drawn in training."""
    ds = _dataset(SETTINGS[name], _EVAL_STREAM, 2 ** 31 - 1)
    out, i = [], 0
    while len(out) < size:
        item = ds[i]
        i += 1
        if is_held_out(item["metadata"]["expression"]):
            out.append(_example(item, "test", len(out)))
    return tuple(out)


class ArithmeticTask(CorrectnessTask):
    """Arithmetic problems as a ``cory.tasks.base.Task``: an endless seeded stream of training problems outside the
    held-out share, and the held-out problems of ``held_out``; answers end and are scored as GSM8K's."""

    name = "arithmetic"

    def __init__(self, setting: str = DEFAULT_SETTING, seed: int = 0) -> None:
        if setting not in SETTINGS:
            raise ValueError(f"arithmetic setting must be one of {', '.join(SETTINGS)}, got {setting!r}")
        self.setting_name = setting
        self.setting = SETTINGS[setting]
        self.source = setting
        self.seed = int(seed)
        self._position = 0
        self._stream = self._make_stream()

    def _make_stream(self):
        # stream 0 is the evaluation's neighbour only in name: seeds map to streams 100 + seed
        return _dataset(self.setting, 100 + self.seed, 2 ** 31 - 1)

    def sample(self, batch_size: int) -> list[Example]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        batch = []
        while len(batch) < batch_size:
            item = self._stream[self._position]
            self._position += 1
            if not is_held_out(item["metadata"]["expression"]):
                batch.append(_example(item, "train", self._position - 1))
        return batch

    def eval_examples(self, limit: int | None = None) -> list[Example]:
        examples = list(held_out(self.setting_name))
        return examples if limit is None else examples[: max(0, int(limit))]

    def clean_response(self, text: str) -> str:
        return first_line(text)

    def observer_prompt(self, example: Example, pioneer_response: str) -> str:
        # the pioneer's answer as the reward read it (``clean_response``: its first line), whatever a caller passes
        return build_observer_prompt(example.query, first_line(pioneer_response))

    @staticmethod
    def parseable(response: str) -> bool:
        """Whether an answer holds a number the reward can read (a collapsed policy's token salad does not)."""
        return extract_answer(response) is not None

    def state_dict(self) -> dict:
        return {"seed": self.seed, "position": self._position, "setting": self.setting_name}

    def load_state_dict(self, state: dict) -> None:
        if state.get("setting", self.setting_name) != self.setting_name:
            raise ValueError(f"arithmetic task state is for setting {state['setting']!r}, this task draws "
                             f"{self.setting_name!r}")
        self.seed = int(state.get("seed", self.seed))
        self._position = state_count(state, "position")
        self._stream = self._make_stream()


# --------------------------------------------------------------------------- registration


def _setting(cfg) -> str:
    return DEFAULT_SETTING if cfg.dataset == "auto" else cfg.dataset


def _make(cfg, tokenizer, seed):
    return ArithmeticTask(_setting(cfg), seed=seed)


def _make_eval(cfg, tokenizer):
    return ArithmeticTask(_setting(cfg), seed=0)


def _note(task) -> str | None:
    examples = task.eval_examples()
    distinct = len({ex.meta["expression"] for ex in examples})
    return (f"{task.setting.describe()}: {len(examples)} held-out problems drawn as training draws them "
            f"({distinct} distinct), never drawn in training; not GSM8K")


# evaluation: accuracy of 20-token answers as sampled in training and greedy, KL to the base model, distinct-n and
# the share of answers with a number the reward can read, on the held-out problems
register_task("arithmetic", _make, datasets=("auto", *SETTINGS), rewards=("correctness",), prompt_tokens=64,
              evaluation=Evaluation(REWARD_METRICS, answer_tokens=20, make=_make_eval, note=_note, greedy=True))
