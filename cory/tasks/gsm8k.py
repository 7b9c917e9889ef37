"""GSM8K: one-shot prompts, data and the Task (answer extraction and the 0/1 reward: ``cory.tasks.gsm8k_answers``).

Prompt format (paper): one worked example in "Question: ... / Answer: ..." form, a blank line,
then the query. The observer's prompt is the same with "Reference: <pioneer response>" on its
own line before "Answer:". The reward is 1 when the final number of the response equals the
number after ``####`` in the reference solution, else 0.

Data sources (``load_gsm8k``):

- ``local``: ``<dataset_path>/{train,test}.jsonl`` in the original release format
  (openai/grade-school-math: one ``{"question", "answer"}`` object per line).
- ``hub``: ``datasets.load_dataset("openai/gsm8k", "main")`` (7,473 / 1,319).
- ``generated``: GSM8K-template problems from reasoning-gym's ``gsm_symbolic`` generator
  (offline). A stand-in for smoke runs, NOT GSM8K: numbers from it are not comparable with
  the paper's.
- ``auto``: local if ``dataset_path`` is given, else the hub if reachable, else generated.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from cory.assets import HubAsset, check_hub_asset, quiet
from cory.errors import ConfigError
from cory.tasks.gsm8k_answers import (authors_correct, correctness_reward, normalize_number, reference_answer,
                                      trim_at_stop)
from cory.tasks.base import (PASS_AT_K, TRAINING_PROTOCOL, Evaluation, Example, SamplingProtocol,
                             TaskBase, state_count)
from cory.tasks.registry import register_task

logger = logging.getLogger(__name__)

HUB_REPO_ID = "openai/gsm8k"
HUB_CONFIG = "main"
SPLITS = ("train", "test")
GSM8K_SIZES = {"train": 7473, "test": 1319}
SOURCES = ("auto", "hub", "local", "generated")

# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

ONE_SHOT_QUESTION = (
    "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. "
    "How many toys does he have now?"
)
ONE_SHOT_ANSWER = (
    "Shawn started with 5 toys. He got 2 toys each from his mom and dad, "
    "so he got 2 * 2 = 4 more toys. 5 + 4 = 9. #### 9"
)
_ONE_SHOT_BLOCK = f"Question: {ONE_SHOT_QUESTION}\nAnswer: {ONE_SHOT_ANSWER}\n\n"


def question_prompt(one_shot_block: str, question: str, reference: str | None = None) -> str:
    """The paper's GSM8K form: a worked example, then "Question: <q>", then (the observer's prompt) "Reference:
    <the pioneer's answer>" on its own line, then "Answer:"."""
    seen = f"Reference: {reference.strip()}\n" if reference is not None else ""
    return f"{one_shot_block}Question: {question.strip()}\n{seen}Answer:"


def build_prompt(question: str) -> str:
    """The pioneer's (and single-agent PPO's) prompt: the worked example, then the question."""
    return question_prompt(_ONE_SHOT_BLOCK, question)


def build_observer_prompt(question: str, pioneer_response: str) -> str:
    """The observer's prompt: as ``build_prompt`` with the pioneer's answer as a reference."""
    return question_prompt(_ONE_SHOT_BLOCK, question, reference=pioneer_response)


# The authors' evaluation prompt (their team's gsm8k_utils/gsm8k_eval.py, for CORY's reported pass@1 of 18%,
# arXiv 2410.06101): the same one-shot example, but no blank line before the question, a space before the last
# "Answer:", the example's question joining "from" and "his", and the worked answer ending at "5 + 4 = 9." with no
# "####". Only these features of their text are known here; the rest of the example's wording is ours.
AUTHORS_ONE_SHOT_QUESTION = ONE_SHOT_QUESTION.replace("from his", "fromhis")
AUTHORS_ONE_SHOT_ANSWER = ONE_SHOT_ANSWER.rpartition(" ####")[0]


def build_authors_prompt(question: str) -> str:
    """The one-shot prompt of the authors' GSM8K evaluation (see ``AUTHORS_ONE_SHOT_QUESTION``)."""
    return (f"Question: {AUTHORS_ONE_SHOT_QUESTION}\nAnswer: {AUTHORS_ONE_SHOT_ANSWER}\n"
            f"Question: {question.strip()}\n Answer:")


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"GSM8K split must be one of {SPLITS}, got {split!r}")


_RECORD = "one JSON object per line with a 'question' string and an 'answer' string ending in '#### <number>'"


def _load_local(split: str, dataset_path: str | Path) -> list[dict]:
    """The records of ``<dataset_path>/<split>.jsonl``, each checked: a bad one is a ConfigError naming the file,
    the line and what was expected."""
    path = Path(dataset_path) / f"{split}.jsonl"
    if not path.is_file():
        raise ConfigError(f"dataset_path: {path} not found (expected the original release's {split}.jsonl, "
                          f"{_RECORD})")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"dataset_path: cannot read {path} ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"dataset_path: {path} line {bad} is not UTF-8 text; expected {_RECORD}") from None
    rows = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            rows.append(_record(line, f"dataset_path: {path} line {lineno}"))
    if not rows:
        raise ConfigError(f"dataset_path: {path} holds no records; expected {_RECORD}")
    return rows


def _record(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        raise ConfigError(f"{where}: not valid JSON; expected {_RECORD}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: a JSON {type(obj).__name__}, not an object; expected {_RECORD}")
    for key in ("question", "answer"):
        if key not in obj:
            raise ConfigError(f"{where}: no {key!r}; expected {_RECORD}")
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise ConfigError(f"{where}: {key!r} is {type(obj[key]).__name__} {str(obj[key])[:30]!r}, not a "
                              f"non-empty string; expected {_RECORD}")
    if "####" not in obj["answer"]:
        raise ConfigError(f"{where}: 'answer' does not end in '#### <number>'; expected {_RECORD}")
    try:
        reference_answer(obj["answer"])
    except ValueError as e:
        raise ConfigError(f"{where}: {str(e).replace('GSM8K solution', repr('answer'))}") from None
    return {"question": obj["question"], "answer": obj["answer"]}


def check_local_files(dataset_path: str | Path, splits=SPLITS) -> None:
    """Read and check every record of the local files now, before any model loads."""
    if not Path(dataset_path).is_dir():
        raise ConfigError(f"dataset_path: folder not found: {dataset_path}")
    for split in splits:
        _load_local(split, dataset_path)


def _load_hub(split: str) -> list[dict]:
    check_hub_asset(HUB_REPO_ID, repo_type="dataset")
    import datasets

    ds = datasets.load_dataset(HUB_REPO_ID, HUB_CONFIG, split=split)
    return [{"question": r["question"], "answer": r["answer"]} for r in ds]


# reasoning-gym's gsm_symbolic item ``idx`` of dataset seed ``s`` is drawn with
# ``random.Random(s + idx)``: nearby seeds share streams (seed 1's item i reuses seed 0's item
# i+1 RNG state). Split streams therefore sit far apart.
_GEN_STREAM_STRIDE = 10**9
_GEN_SUFFIX = " Give the result as your final answer. Do not include units."
_GEN_TEST_PER_MILLE = 150  # share of the question space reserved for the test split


def _question_bucket(question: str) -> str:
    """Which split a generated question may belong to (a hash of its text): exact duplicates
    can never land in both splits, whatever the seeds and sizes."""
    key = " ".join(question.split()).encode("utf-8")
    h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 1000
    return "test" if h < _GEN_TEST_PER_MILLE else "train"


def _generated_record(item: dict) -> dict:
    question = item["question"]
    if question.endswith(_GEN_SUFFIX):
        question = question[: -len(_GEN_SUFFIX)]
    answer = normalize_number(str(item["answer"]))
    if answer is None:  # pragma: no cover - reasoning-gym answers are numbers
        raise ValueError(f"reasoning-gym answer is not a number: {item['answer']!r}")
    cot = str(item.get("metadata", {}).get("answer_cot") or "").rstrip()
    body = cot.rpartition("####")[0].rstrip() if "####" in cot else cot
    solution = f"{body}\n#### {answer}" if body else f"#### {answer}"
    return {"question": question.strip(), "answer": solution}


@lru_cache(maxsize=16)
def _generate(split: str, seed: int, size: int) -> tuple[tuple[str, str], ...]:
    import reasoning_gym

    stream_seed = (2 * seed + (0 if split == "train" else 1)) * _GEN_STREAM_STRIDE
    # Expected draws per kept item: 1/0.85 (train) or 1/0.15 (test), plus duplicates.
    per_item = 1.3 if split == "train" else 7.5
    capacity = max(64, int(size * per_item) + 64)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    idx = 0
    while len(out) < size:
        if idx >= capacity:
            capacity *= 2
        if capacity > 200 * size + 10_000:
            raise RuntimeError(
                f"reasoning-gym gsm_symbolic yielded only {len(out)} distinct {split} problems"
            )
        # Item i of a ProceduralDataset does not depend on its size (task_indices are drawn with
        # Random(seed).choices, prefix-stable), so a bigger dataset extends the same stream.
        ds = reasoning_gym.create_dataset("gsm_symbolic", size=capacity, seed=stream_seed)
        while idx < capacity and len(out) < size:
            rec = _generated_record(ds[idx])
            idx += 1
            key = " ".join(rec["question"].split())
            if key in seen or _question_bucket(rec["question"]) != split:
                continue
            seen.add(key)
            out.append((rec["question"], rec["answer"]))
    return tuple(out)


def _load_generated(split: str, seed: int, size: int | None) -> list[dict]:
    n = GSM8K_SIZES[split] if size is None else int(size)
    if n <= 0:
        raise ValueError(f"generated_size must be positive, got {size}")
    return [{"question": q, "answer": a} for q, a in _generate(split, int(seed), n)]


def _warn_generated(what: str, exc: BaseException) -> None:
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    logger.warning(
        "GSM8K data: %s (%s); using reasoning-gym gsm_symbolic generated problems, "
        "a GSM8K-style stand-in, NOT GSM8K", what, reason,
    )


def resolve_source(source: str = "auto", dataset_path: str | Path | None = None) -> str:
    """The concrete source ("local", "hub" or "generated") that ``source`` stands for.

    ``auto`` probes the hub in seconds (``cory.assets.check_hub_asset``); it logs one line
    naming the choice.
    """
    if source not in SOURCES:
        raise ValueError(f"GSM8K source must be one of {SOURCES}, got {source!r}")
    if source == "local" and dataset_path is None:
        raise ValueError("GSM8K source 'local' needs dataset_path (folder with train/test.jsonl)")
    if source != "auto":
        return source
    if dataset_path is not None:
        logger.info("GSM8K data: local files in %s", dataset_path)
        return "local"
    try:
        check_hub_asset(HUB_REPO_ID, repo_type="dataset")
    except Exception as exc:  # AssetError, or anything else that makes the hub unusable
        _warn_generated(f"{HUB_REPO_ID} unavailable", exc)
        return "generated"
    logger.info("GSM8K data: hub dataset %s (%s)", HUB_REPO_ID, HUB_CONFIG)
    return "hub"


def load_gsm8k(
    split: str,
    *,
    source: str = "auto",
    dataset_path: str | Path | None = None,
    seed: int = 0,
    generated_size: int | None = None,
) -> list[dict]:
    """GSM8K problems of ``split`` ("train"/"test") as ``[{"question", "answer"}]``.

    ``seed`` and ``generated_size`` (default: GSM8K's 7,473 / 1,319) only matter for
    ``generated``: train and test come from far-apart reasoning-gym seeds and from disjoint
    parts of the question space (a hash of the text: ~85% train, ~15% test), de-duplicated,
    so no question is in both.
    """
    _check_split(split)
    concrete = resolve_source(source, dataset_path)
    if concrete == "local":
        return _load_local(split, dataset_path)
    if concrete == "hub":
        if source == "auto":
            try:
                return _load_hub(split)
            except Exception as exc:
                _warn_generated(f"loading {HUB_REPO_ID} failed", exc)
                return _load_generated(split, seed, generated_size)
        return _load_hub(split)
    return _load_generated(split, seed, generated_size)


# ---------------------------------------------------------------------------------------------
# Task
# ---------------------------------------------------------------------------------------------


class CorrectnessTask(TaskBase):
    """A task in GSM8K's answer form: an answer ends where the model starts a new "Question:", and scores 1 when its
    final number equals the example's reference (``correctness_reward``), else 0. GSM8K's and the arithmetic task's."""

    stop: str | None = "Question:"
    zero_one_reward = True

    def clean_response(self, text: str) -> str:
        return trim_at_stop(text, self.stop)

    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        if len(examples) != len(responses):
            raise ValueError(f"{len(examples)} examples but {len(responses)} responses")
        return [correctness_reward(r, ex.reference) for ex, r in zip(examples, responses)]


class Gsm8kTask(CorrectnessTask):
    """GSM8K as a ``cory.tasks.base.Task``.

    ``seed`` orders the training stream (a fresh seeded permutation of train per epoch);
    ``data_seed`` only picks the generated stand-in problems, so runs with different seeds
    share the same data, as with the real dataset. Data are loaded at construction.
    """

    name = "gsm8k"

    def __init__(
        self,
        *,
        source: str = "auto",
        dataset_path: str | Path | None = None,
        seed: int = 0,
        stop: str = "Question:",
        data_seed: int = 0,
        generated_size: int | None = None,
        with_train: bool = True,
    ) -> None:
        self.seed = int(seed)
        self.stop = stop
        self.source = resolve_source(source, dataset_path)
        self._dataset_path = dataset_path
        kw = dict(dataset_path=dataset_path, seed=data_seed, generated_size=generated_size)
        train = test = None
        if self.source == "hub":
            try:
                train, test = (_load_hub("train") if with_train else []), _load_hub("test")
            except Exception as exc:
                if source != "auto":
                    raise
                _warn_generated(f"loading {HUB_REPO_ID} failed", exc)
                self.source = "generated"
        if train is None:  # evaluation (with_train false) reads the test split alone
            train = load_gsm8k("train", source=self.source, **kw) if with_train else []
            test = load_gsm8k("test", source=self.source, **kw)
        self._train = [self._example(r, "train", i) for i, r in enumerate(train)]
        self._test = [self._example(r, "test", i) for i, r in enumerate(test)]
        self._epoch = 0
        self._pos = 0
        self._perm = self._permutation(0)

    @staticmethod
    def _example(record: dict, split: str, index: int) -> Example:
        question = record["question"].strip()
        return Example(
            query=question,
            prompt=build_prompt(question),
            reference=reference_answer(record["answer"]),
            meta={"split": split, "index": index, "solution": record["answer"]},
        )

    def _permutation(self, epoch: int) -> list[int]:
        perm = list(range(len(self._train)))
        random.Random(f"gsm8k:{self.seed}:{epoch}").shuffle(perm)
        return perm

    def __len__(self) -> int:
        return len(self._train)

    def sample(self, batch_size: int) -> list[Example]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        batch = []
        while len(batch) < batch_size:
            if self._pos >= len(self._perm):
                self._epoch += 1
                self._pos = 0
                self._perm = self._permutation(self._epoch)
            batch.append(self._train[self._perm[self._pos]])
            self._pos += 1
        return batch

    def eval_examples(self, limit: int | None = None) -> list[Example]:
        return list(self._test if limit is None else self._test[: max(0, int(limit))])

    def observer_prompt(self, example: Example, pioneer_response: str) -> str:
        return build_observer_prompt(example.query, pioneer_response)

    def check_fits(self, tokenizer, context: int, answer_tokens: int, *, examples: list[Example] | None = None,
                   prompt=None, model: str = "the model", limit: str = "response_length_max") -> None:
        """Every prompt of ``examples`` (default: the training questions; ``prompt(example)`` the text, default its
        prompt) and ``answer_tokens`` more fit ``context`` positions (else generation fails mid-run, past the
        model's positions): a ConfigError naming the longest question that does not."""
        examples = self._train if examples is None else examples
        prompts = [prompt(ex) if prompt else ex.prompt for ex in examples]
        with quiet():  # transformers' own notice of a prompt over the model's length: said better below
            lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        over = [i for i, n in enumerate(lengths) if n + answer_tokens > context]
        if not over:
            return
        worst = max(over, key=lengths.__getitem__)
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        raise ConfigError(f"{self._where(examples[worst])}: its prompt is {lengths[worst]} tokens; with answers of up "
                          f"to {answer_tokens} tokens it does not fit {model}'s context of {context} tokens{more}; "
                          f"drop or shorten such questions, or lower {limit}")

    def _where(self, example: Example) -> str:
        split, index = example.meta["split"], example.meta["index"]
        if self.source == "local":
            path = Path(self._dataset_path) / f"{split}.jsonl"
            with path.open(encoding="utf-8") as fh:
                records = (n for n, line in enumerate(fh, 1) if line.strip())
                for _ in range(index + 1):
                    line = next(records)
            return f"dataset_path: {path} line {line}"
        return f"dataset: {self.source} {split} question {index + 1}"

    def state_dict(self) -> dict:
        return {
            "seed": self.seed,
            "epoch": self._epoch,
            "position": self._pos,
            "n_train": len(self._train),
            "source": self.source,
        }

    def load_state_dict(self, state: dict) -> None:
        n = state.get("n_train", len(self._train))
        if n != len(self._train):
            raise ValueError(
                f"GSM8K task state is for {n} training problems, this task has "
                f"{len(self._train)} (different data source?)"
            )
        self.seed = int(state.get("seed", self.seed))
        self._epoch = state_count(state, "epoch")
        self._pos = state_count(state, "position", len(self._train))
        self._perm = self._permutation(self._epoch)


# --------------------------------------------------------------------------- registration


def _make(cfg, tokenizer, seed):
    return Gsm8kTask(source=cfg.dataset, dataset_path=cfg.dataset_path, seed=seed)


def _check(cfg, splits=("train", "test")) -> None:
    if cfg.dataset_path is not None:
        if cfg.dataset not in ("local", "auto"):
            raise ConfigError(f"dataset_path: dataset {cfg.dataset} does not read it; use --dataset local "
                              "(or auto) to read the files in it")
        if splits == ("test",) and not (Path(cfg.dataset_path) / "test.jsonl").is_file():
            raise ConfigError(f"dataset_path: {cfg.dataset_path}: no test.jsonl there (expected GSM8K's release "
                              "files)")
        check_local_files(cfg.dataset_path, splits)


def _hub_assets(cfg) -> list[HubAsset]:
    """What a run fetches from the hub (resolve_source's rules): openai/gsm8k for dataset hub, or auto without
    dataset_path (generated stand-in problems where the hub does not have it)."""
    if cfg.dataset == "hub" or (cfg.dataset == "auto" and cfg.dataset_path is None):
        return [HubAsset("dataset", HUB_REPO_ID, "dataset", "generated stand-in problems, not GSM8K" if
                         cfg.dataset == "auto" else None, offline="--dataset_path DIR (GSM8K's train.jsonl and "
                                                                  "test.jsonl)")]
    return []


def _make_eval(cfg, tokenizer):
    return Gsm8kTask(source=cfg.dataset, dataset_path=cfg.dataset_path, with_train=False)


def _note(task) -> str | None:
    if task.source == "generated":
        return "generated GSM8K-style stand-in problems, NOT GSM8K (pass --dataset_path for the real test set)"
    return None


# GSM8K's two ways to evaluate: as training samples and reads answers, or as the authors' GSM8K evaluation behind
# the paper's pass@1 of 18% (arXiv 2410.06101; their team's gsm8k_utils/gsm8k_eval.py): top_k 10, top_p 0.7,
# temperature 1, repetition penalty 1.1, never stopping early (they pass eos_token_id=-1; masking EOS until the
# limit is the nearest transformers setting), their prompt variant and their answer extraction
GSM8K_PROTOCOLS = {
    "training": SamplingProtocol(TRAINING_PROTOCOL.sampling, reading="ending at EOS or a new 'Question:'; '####', "
                                 "else 'answer is', else the last number",
                                 description="Protocol _training_: answers sampled as in training (top_k 0, top_p 1, "
                                             "no repetition penalty), ended at EOS or a new \"Question:\", read by "
                                             "the training reward's extraction."),
    "authors": SamplingProtocol({"top_k": 10, "top_p": 0.7, "temperature": 1.0, "repetition_penalty": 1.1},
                                stop_early=False, prompt=lambda ex: build_authors_prompt(ex.query),
                                score=lambda examples, answers: [authors_correct(a, ex.meta["solution"])
                                                                 for a, ex in zip(answers, examples)],
                                reading="never stopping early; the authors' prompt; 'the answer is' else the last "
                                        "number, as strings",
                                description="Protocol _authors_: the authors' GSM8K evaluation (top_k 10, top_p 0.7, "
                                            "repetition penalty 1.1, no early stop, their prompt, \"the answer is\" "
                                            "else the last number, compared as strings), the one behind the paper's "
                                            "pass@1 of 18%."),
}


# evaluation: pass@k of 256-token answers to all 1,319 test questions, whose one-shot prompt needs the longer budget
register_task("gsm8k", _make, datasets=("auto", "hub", "local", "generated"), rewards=("correctness",),
              check=_check, prompt_tokens=384, hub_assets=_hub_assets,
              evaluation=Evaluation(PASS_AT_K, answer_tokens=256, make=_make_eval,
                                    check=lambda cfg: _check(cfg, ("test",)), note=_note,
                                    protocols=GSM8K_PROTOCOLS))
