"""What the trainer and the evaluation need from a task: prompts, the observer's prompt, a reward, where an
answer stops, and how its held-out examples are scored."""
from __future__ import annotations

import copy
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, cast


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
    source: str  # where its examples come from (the concrete value a config's dataset "auto" stood for)
    stop: str | None  # a line starting with this string ends an answer (besides EOS); None: EOS alone
    # optional (default False): the reward is 1 for a right answer and 0 for a wrong one, so that the knowledge
    # transfer is also read as copy and correction rates (``cory.metrics.knowledge_transfer``); True or False, and
    # kept by score() (``right_or_wrong``)
    # zero_one_reward: bool

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


# the counters a task's sampler state keeps (how far it has drawn): whole numbers from 0, checked on resume
STATE_COUNTS = ("position", "pos", "epoch", "batches")


def state_count(state: dict, key: str, limit: int | None = None) -> int:
    """``state[key]`` as a count of what a sampler has drawn: a whole number from 0 (to ``limit``); a hand-edited
    -1 or 2.5 is a ValueError naming the key and the value, not a stream resumed at some other place."""
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 or (
            limit is not None and value > limit):
        allowed = f"a whole number from 0 to {limit}" if limit is not None else "a whole number from 0"
        raise ValueError(f"task {key} {value!r} is not {allowed}")
    return int(value)


class TaskBase:
    """The parts of ``Task`` most tasks share: answers end at EOS alone and the reward sees the whole answer.
    Subclass it and write the rest (docs/adding_a_task.md)."""

    source: str = "builtin"  # examples written in the task's own code
    stop: str | None = None
    zero_one_reward: bool = False

    def clean_response(self, text: str) -> str:
        return text

    PEEK = 8  # training examples the default context check looks at (and puts back)

    def check_fits(self, tokenizer, context: int, answer_tokens: int, *, examples=None, prompt=None,
                   model: str = "the model", limit: str = "response_length_max") -> None:
        """Raise ConfigError (one line) if a prompt (``prompt(example)``, default its ``prompt``) and
        ``answer_tokens`` more would not fit ``context`` positions: before training, not as an index error deep
        in the model. ``examples`` default: a peek at the next training batch (the sampler's state is put back,
        as a resume would) and the held-out examples; a task that can list all its prompts checks them all
        (GSM8K)."""
        from cory.errors import ConfigError

        if examples is None:
            examples = []
            task = cast(Task, self)  # a subclass writes the rest of Task
            try:
                state = copy.deepcopy(task.state_dict())
                examples = list(task.sample(self.PEEK))
                task.load_state_dict(state)
                examples += list(task.eval_examples(64))
            except Exception:  # noqa: BLE001 - a task broken elsewhere fails where that is checked, naming it
                pass

        def length(ex) -> int:
            ids = getattr(ex, "prompt_ids", None)
            if prompt is None and isinstance(ids, (list, tuple)):  # the pioneer reads these tokens, not the text
                return len(ids)
            text = prompt(ex) if prompt else ex.prompt
            if not isinstance(text, str):
                return 0
            # verbose off: a prompt too long is said in the one line below, not also in transformers' warning
            return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

        lengths = [length(ex) for ex in examples]
        over = [i for i, n in enumerate(lengths) if n + answer_tokens > context]
        if over:
            worst = max(over, key=lengths.__getitem__)
            raise ConfigError(f"task {getattr(self, 'name', type(self).__name__)}: a prompt of {lengths[worst]} tokens "
                              f"({str(examples[worst].query)[:40]!r}...) with answers of up to {answer_tokens} tokens "
                              f"does not fit {model}'s context of {context} tokens; shorten the task's prompts or "
                              f"lower {limit}")


def zero_one_reward(task) -> bool:
    """Whether ``task`` declares a 0/1 reward (``Task.zero_one_reward``, optional for a plug-in task: default False).
    A declaration that is not True or False (``"yes"``, ``1.0``) is a ConfigError of one line naming it: it would
    otherwise read as no declaration, and the copy and correction rates as null, without a word."""
    from cory.errors import ConfigError

    value = getattr(task, "zero_one_reward", False)
    if not isinstance(value, bool):
        raise ConfigError(f"task {getattr(task, 'name', type(task).__name__)}: zero_one_reward is {value!r}; it must "
                          "be True or False")
    return value


def zero_one_broken(task, rewards: Sequence[float]) -> str | None:
    """A line saying that ``task`` declares a 0/1 reward that ``rewards`` (its score()'s) do not keep, naming the first
    that is neither 0 nor 1; None where they keep it or nothing was declared."""
    bad = next((r for r in rewards if r not in (0, 1)), None) if zero_one_reward(task) else None
    if bad is None:
        return None
    return (f"task {getattr(task, 'name', type(task).__name__)}: declares zero_one_reward, but its score() returned "
            f"{float(bad)!r}, neither 0 nor 1, so copy and correction rates cannot be read from it; return 0 or 1, "
            "or set zero_one_reward = False")


_WARNED: set[str] = set()  # the tasks whose broken 0/1 declaration was warned of (once per task and process)


def right_or_wrong(task, *rewards: Sequence[float]) -> bool:
    """Whether ``rewards`` read as right (1) or wrong (0), as copy and correction rates read them
    (``cory.metrics.knowledge_transfer``'s ``zero_one``): the task declares a 0/1 reward and they keep it. Where they
    do not, the rates are left out (null) rather than read at 0.5, with a warning once per task."""
    broken = zero_one_broken(task, [r for batch in rewards for r in batch])
    name = getattr(task, "name", type(task).__name__)
    if broken is not None and name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(f"{broken} (the rates are left out: null)", stacklevel=2)
    return broken is None and zero_one_reward(task)


def check_examples(examples, *, task: str, what: str, vocab_size: int | None = None) -> list[Example]:
    """``examples`` as a task returned them (``what``: "eval_examples()", "sample(32)"), checked where they enter:
    a non-empty list of ``Example``, each ``prompt_ids`` (when given) a non-empty list of token ids inside the
    tokenizer's ``vocab_size``; else ConfigError, one line naming the task and what was wrong."""
    from cory.errors import ConfigError

    if not isinstance(examples, (list, tuple)):
        raise ConfigError(f"task {task}: {what} returned a {type(examples).__name__}, not a list of Example")
    if not examples:
        raise ConfigError(f"task {task}: {what} returned no examples; it must return at least one")
    for i, ex in enumerate(examples):
        if not isinstance(ex, Example):
            raise ConfigError(f"task {task}: {what} returned a {type(ex).__name__} at position {i}, not an Example")
        ids = ex.prompt_ids
        if ids is None:
            continue
        if len(ids) == 0:
            raise ConfigError(f"task {task}: {what}: example {i}'s prompt_ids is empty; give at least one token id, "
                              "or None to tokenize its prompt")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0
               or (vocab_size is not None and t >= vocab_size)]
        if bad:
            allowed = f"0..{vocab_size - 1}" if vocab_size is not None else "non-negative integers"
            raise ConfigError(f"task {task}: {what}: example {i}'s prompt_ids holds {bad[0]!r}, outside the "
                              f"tokenizer's vocabulary ({allowed})")
    return list(examples)


@dataclass(frozen=True)
class SamplingProtocol:
    """How an evaluation samples and reads answers (``lab.evaluate --protocol NAME``).

    ``sampling``: top_k, top_p, temperature and repetition_penalty; ``stop_early``: an answer may end at EOS or
    the task's stop string (False: every answer runs to the token limit); ``prompt``: ``(example) -> str``, the
    prompt to answer (None: ``example.prompt``); ``score``: ``(examples, answers) -> list[float]`` on the whole
    decoded answers (None: the task's own ``clean_response`` and ``score``, as training); ``reading``: how the
    answers are read, in words, for the printed table; ``description``: a sentence for the report's evaluation
    table."""

    sampling: dict
    stop_early: bool = True
    prompt: Callable | None = None
    score: Callable | None = None
    reading: str = "ending at EOS or the task's stop string; scored by the task's reward, as in training"
    description: str = ""


# sampling as in training (top_k 0, top_p 1, no repetition penalty): the answers are draws from the policy itself
TRAINING_SAMPLING = {"top_k": 0, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0}
TRAINING_PROTOCOL = SamplingProtocol(TRAINING_SAMPLING)


REWARD_METRICS = "reward"  # subjective tasks: mean reward, KL to the base model, distinct-1/2, length
PASS_AT_K = "pass@k"       # objective tasks (a 0/1 reward): pass@k from n samples per question, accuracy


@dataclass(frozen=True)
class Evaluation:
    """How ``python -m lab.evaluate`` scores a task's held-out examples, declared where the task is registered.

    ``metrics``: ``REWARD_METRICS`` or ``PASS_AT_K``; ``answer_tokens``: the default ``--max_new_tokens``;
    ``limit``: the default number of held-out examples (None: all); ``reward``: the reward to score with when
    neither ``--reward`` nor the run's config names one (default: the task's only allowed reward); ``make``: ``(cfg, tokenizer) -> Task`` for
    the held-out examples (default: the training ``make`` with seed 0); ``check``: ``(cfg) -> None``, what
    evaluation needs that can be checked before a model loads (default: the training ``check``); ``note``:
    ``(task) -> str | None``, a line printed under the results (e.g. that the data are a stand-in);
    ``protocols``: the ways ``--protocol`` may sample and read answers, "training" (the default) first;
    ``scored_as``: a training reward that shapes another for learning -> the reward it shapes, which evaluations
    score its runs with (so every run of the task is measured on one scale); ``greedy``: reward tasks also score
    greedy answers (``greedy_reward``: a 0/1 task's accuracy without sampling's noise)."""

    metrics: str = REWARD_METRICS
    answer_tokens: int = 15
    limit: int | None = None
    reward: str | None = None
    make: Callable | None = None
    check: Callable | None = None
    note: Callable | None = None
    protocols: dict = field(default_factory=lambda: {"training": TRAINING_PROTOCOL})
    scored_as: dict = field(default_factory=dict)
    greedy: bool = False

    def __post_init__(self):
        if self.metrics not in (REWARD_METRICS, PASS_AT_K):
            raise ValueError(f"Evaluation.metrics: {self.metrics!r} is not one of {REWARD_METRICS}, {PASS_AT_K}")

    def scored_reward(self, training_reward: str | None) -> str | None:
        """The reward an evaluation scores a run trained on ``training_reward`` with: a shaped reward is scored
        as the reward it shapes, so every run of the task is measured on one scale."""
        return self.scored_as.get(training_reward, training_reward)
