"""IMDB positive-sentiment continuation (the paper's subjective-reward task).

Prompts are the first 2-7 tokens of a movie review, drawn exactly like trl's
``LengthSampler(2, 8)`` in the authors' code: one length per example, uniform over
``range(min_query_tokens, max_query_tokens)``, ``prompt_ids = ids(review)[:length]`` and
``query = prompt = tokenizer.decode(prompt_ids)`` (no template). The reward sees
``query + response``.

Prompt sources:

- ``"hub"``: ``stanfordnlp/imdb`` train split, reviews longer than 200 characters (the
  authors' filter); evaluation uses the test split with the same filter.
- ``"builtin"``: ``data/imdb_openings.txt``, review openings written for this project
  (no real IMDB text); evaluation uses the disjoint ``data/imdb_openings_eval.txt``.
- ``"auto"``: the hub if ``cory.assets.check_hub_asset`` finds the dataset, else builtin.

Rewards share one interface, ``reward(queries, responses) -> list[float]``:
``VaderReward`` (offline, compound score in [-1, 1], and two shaped forms for training on a CPU:
``vader-scaled``, ``vader-gain``) and ``DistilbertImdbReward`` (the paper's: raw POSITIVE logit of
``lvwerra/distilbert-imdb``). ``make_reward`` builds any of them by name.
"""
from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from cory.assets import HubAsset, check_hub_asset, model_config
from cory.errors import AssetError, ConfigError
from cory.tasks.base import REWARD_METRICS, Evaluation, Example, TaskBase, state_count
from cory.tasks.registry import register_task

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"
BUILTIN_TRAIN_FILE = DATA_DIR / "imdb_openings.txt"
BUILTIN_EVAL_FILE = DATA_DIR / "imdb_openings_eval.txt"

HUB_DATASET = "stanfordnlp/imdb"
MIN_REVIEW_CHARS = 200  # the authors keep reviews with len(review) > 200

DISTILBERT_IMDB = "lvwerra/distilbert-imdb"
# vader-scaled and vader-gain shape VADER for training (see VaderReward); the paper presets use neither
REWARD_NAMES: tuple[str, ...] = ("vader", "vader-scaled", "vader-gain", "distilbert-imdb")
SOURCES: tuple[str, ...] = ("auto", "hub", "builtin")

Reward = Callable[[Sequence[str], Sequence[str]], list[float]]

_STATE_VERSION = 1


# --------------------------------------------------------------------------- prompts


def build_observer_prompt(query: str, pioneer_response: str) -> str:
    """The authors' observer template, verbatim.

    ``I can make this sentence "<query><pioneer_response>" more positive: <query>``: the
    pioneer's text is appended to the query with no separator, and the prompt ends with the
    query again so the observer continues the same opening.
    """
    return f'I can make this sentence "{query}{pioneer_response}" more positive: {query}'


def read_openings(path: str | os.PathLike) -> list[str]:
    """Non-empty, stripped lines of an openings file."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


# --------------------------------------------------------------------------- rewards


def _joined(queries: Sequence[str], responses: Sequence[str]) -> list[str]:
    if len(queries) != len(responses):
        raise ValueError(f"{len(queries)} queries but {len(responses)} responses")
    return [q + r for q, r in zip(queries, responses)]


# The paper's classifier logit spans about [-3, 3] against the same 0.3 x KL penalty; VADER's compound score
# spans [-1, 1], so at equal eta VADER's reward weighs a third as much against the KL
VADER_SCALE = 3.0


class VaderReward:
    """VADER compound sentiment of ``query + response``, in [-1, 1]. Fully offline.

    Two shaped forms, for training only (an evaluation scores every form with plain ``vader``):
    ``scale`` multiplies the score (``vader-scaled``: x3, the paper's logit range); ``gain`` subtracts the
    query's own score (``vader-gain``: compound(query + response) - compound(query)), the part of the reward the
    answer can change, as trl's guide suggests for rewards the query dominates."""

    def __init__(self, scale: float = 1.0, gain: bool = False) -> None:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        self._analyzer = SentimentIntensityAnalyzer()
        self.scale, self.gain = float(scale), bool(gain)
        self.name = "vader-gain" if gain else ("vader" if scale == 1.0 else "vader-scaled")

    def compound(self, text: str) -> float:
        return float(self._analyzer.polarity_scores(text)["compound"])

    def __call__(self, queries: Sequence[str], responses: Sequence[str]) -> list[float]:
        scores = [self.compound(t) for t in _joined(queries, responses)]
        if self.gain:
            scores = [s - self.compound(q) for s, q in zip(scores, queries)]
        return [self.scale * s for s in scores]

    def __repr__(self) -> str:
        return f"VaderReward(scale={self.scale}, gain={self.gain})"


class DistilbertImdbReward:
    """The paper's reward: raw logit of the POSITIVE class of a sentiment classifier.

    Runs ``pipeline("sentiment-analysis", model=model, device=device)`` on
    ``query + response`` with ``top_k=None, function_to_apply="none"`` (the authors'
    ``sent_kwargs``) and picks the score whose label is ``positive_label`` by name: with
    ``top_k=None`` the pipeline sorts each item's labels by score, so position means nothing.

    ``model`` is a hub id (checked with ``cory.assets.check_hub_asset`` before loading, so a
    missing model fails in seconds) or a local directory (no hub check).
    """

    def __init__(
        self,
        model: str = DISTILBERT_IMDB,
        device: Any = None,
        batch_size: int = 64,
        *,
        positive_label: str = "POSITIVE",
    ) -> None:
        model = os.fspath(model)
        if not os.path.isdir(model):
            check_hub_asset(
                model,
                repo_type="model",
                hint="use the 'vader' reward offline, or pass a local classifier directory",
            )
        from transformers import pipeline

        self.model_name = model
        self.batch_size = int(batch_size)
        self.pipe = pipeline("sentiment-analysis", model=model, device=device)
        labels = [str(v) for v in self.pipe.model.config.id2label.values()]
        matches = [lab for lab in labels if lab.lower() == positive_label.lower()]
        if not matches:
            raise ValueError(
                f"reward model {model!r} has no label {positive_label!r} (its labels: {labels})"
            )
        self.positive_label = matches[0]
        self.name = "distilbert-imdb" if model == DISTILBERT_IMDB else model

    def __call__(self, queries: Sequence[str], responses: Sequence[str]) -> list[float]:
        texts = _joined(queries, responses)
        if not texts:
            return []
        outputs = self.pipe(
            texts,
            top_k=None,
            function_to_apply="none",
            batch_size=self.batch_size,
            truncation=True,
        )
        scores = []
        for per_text in outputs:  # list input -> one list of {label, score} per text
            by_label = {d["label"]: float(d["score"]) for d in per_text}
            scores.append(by_label[self.positive_label])
        return scores

    def __repr__(self) -> str:
        return f"DistilbertImdbReward(model={self.model_name!r})"


def check_reward_model(name: str, flag: str = "reward_model") -> None:
    """``name`` is a known reward or a local classifier folder with a POSITIVE label (config.json only: no
    model is loaded); else a ConfigError naming ``flag``."""
    if name in REWARD_NAMES:
        return
    if not Path(name).is_dir():
        raise ConfigError(f"{flag}: {name!r} is not one of {', '.join(REWARD_NAMES)} or a local model folder")
    try:
        config = model_config(flag, Path(name))
    except AssetError as e:
        raise ConfigError(str(e)) from None
    id2label = config.get("id2label")
    labels = [str(v) for v in id2label.values()] if isinstance(id2label, dict) else []
    if "positive" not in (label.lower() for label in labels):
        raise ConfigError(f"{flag}: {name} is not a sentiment classifier with a POSITIVE label (its labels: "
                          f"{labels or 'none'})")


def make_reward(name: str, device: Any = None, *, batch_size: int = 64) -> Reward:
    """``"vader"`` | ``"vader-scaled"`` | ``"vader-gain"`` | ``"distilbert-imdb"`` (= ``lvwerra/distilbert-imdb``) | a local directory
    holding a sequence-classification model with a POSITIVE label."""
    key = str(name).strip()
    if key == "vader":
        return VaderReward()
    if key == "vader-scaled":
        return VaderReward(scale=VADER_SCALE)
    if key == "vader-gain":
        return VaderReward(gain=True)
    if key in ("distilbert-imdb", DISTILBERT_IMDB):
        return DistilbertImdbReward(DISTILBERT_IMDB, device=device, batch_size=batch_size)
    if key and os.path.isdir(key):
        return DistilbertImdbReward(key, device=device, batch_size=batch_size)
    raise ValueError(
        f"unknown IMDB reward {name!r}: expected one of {', '.join(map(repr, REWARD_NAMES))} "
        "or a local directory of a sequence-classification model"
    )


# --------------------------------------------------------------------------- task


class ImdbTask(TaskBase):
    """IMDB review openings -> positive continuations (implements ``cory.tasks.base.Task``).

    ``sample`` walks a seeded permutation of the training pool (a new permutation at each
    epoch end) and draws each example's query length from a seeded generator at sampling
    time, so a review gets a fresh 2-7 token prefix when it comes round again. Evaluation
    examples come from held-out text (the eval openings file, or the hub test split) with
    lengths from ``eval_seed`` (default 0, independent of ``seed`` so runs with different
    training seeds are evaluated on the same prompts).
    """

    name = "imdb"

    def __init__(
        self,
        tokenizer: Any,
        *,
        source: str = "auto",
        seed: int = 0,
        min_query_tokens: int = 2,
        max_query_tokens: int = 8,
        reward: Reward | str = "vader",
        eval_seed: int = 0,
        dataset: str = HUB_DATASET,
        device: Any = None,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"unknown IMDB source {source!r}: expected one of {SOURCES}")
        if not (1 <= int(min_query_tokens) < int(max_query_tokens)):
            raise ValueError(
                "need 1 <= min_query_tokens < max_query_tokens (the upper bound is exclusive, "
                f"like trl's LengthSampler); got {min_query_tokens}, {max_query_tokens}"
            )
        self.tokenizer = tokenizer
        self.seed = int(seed)
        self.eval_seed = int(eval_seed)
        self.min_query_tokens = int(min_query_tokens)
        self.max_query_tokens = int(max_query_tokens)
        self.dataset = dataset
        self.reward: Reward = make_reward(reward, device=device) if isinstance(reward, str) else reward

        self.source, self._pool = self._load_train_pool(source)
        if not self._pool:
            raise ValueError(f"IMDB {self.source} prompt pool is empty")
        self._eval_pool: list[str] | None = None

        # Two independent streams: the order of reviews and the query lengths.
        perm_seq, len_seq = np.random.SeedSequence([self.seed, 0x1DB]).spawn(2)
        self._perm_rng = np.random.Generator(np.random.PCG64(perm_seq))
        self._len_rng = np.random.Generator(np.random.PCG64(len_seq))
        self._perm = self._perm_rng.permutation(len(self._pool))
        self._pos = 0
        self._epoch = 0
        self._batches = 0

    # ------------------------------------------------------------------ data loading

    def _load_train_pool(self, source: str) -> tuple[str, list[str]]:
        if source == "builtin":
            return "builtin", read_openings(BUILTIN_TRAIN_FILE)
        if source == "hub":
            check_hub_asset(
                self.dataset,
                repo_type="dataset",
                hint="use the built-in openings (source 'builtin' or 'auto') offline",
            )
            return "hub", self._load_hub_split("train")
        # auto
        try:
            check_hub_asset(self.dataset, repo_type="dataset")
        except AssetError as exc:
            logger.warning("IMDB prompts: built-in openings (hub dataset unavailable: %s)", exc)
            return "builtin", read_openings(BUILTIN_TRAIN_FILE)
        try:
            pool = self._load_hub_split("train")
        except Exception as exc:  # noqa: BLE001 - any load failure falls back in auto mode
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            logger.warning("IMDB prompts: built-in openings (loading %s failed: %s)", self.dataset, first)
            return "builtin", read_openings(BUILTIN_TRAIN_FILE)
        logger.info("IMDB prompts: hub dataset %s (%d reviews)", self.dataset, len(pool))
        return "hub", pool

    def _load_hub_split(self, split: str) -> list[str]:
        import datasets

        ds = datasets.load_dataset(self.dataset, split=split)
        return [t for t in ds["text"] if len(t) > MIN_REVIEW_CHARS]

    def _eval_texts(self) -> list[str]:
        if self._eval_pool is None:
            if self.source == "hub":
                texts = self._load_hub_split("test")
                order = np.random.default_rng([self.eval_seed, 0xE7A1]).permutation(len(texts))
                self._eval_pool = [texts[i] for i in order]
            else:
                self._eval_pool = read_openings(BUILTIN_EVAL_FILE)
        return self._eval_pool

    # ------------------------------------------------------------------ examples

    def _make_examples(self, texts: Sequence[str], lengths: Sequence[int], indices: Sequence[int], split: str) -> list[Example]:
        if not texts:
            return []
        encoded = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        out = []
        for text, ids, length, idx in zip(texts, encoded, lengths, indices):
            prompt_ids = [int(t) for t in ids[: int(length)]]
            query = self.tokenizer.decode(prompt_ids)
            out.append(
                Example(
                    query=query,
                    prompt=query,
                    prompt_ids=prompt_ids,
                    meta={"source": self.source, "split": split, "index": int(idx), "query_tokens": len(prompt_ids)},
                )
            )
        return out

    def sample(self, batch_size: int) -> list[Example]:
        batch_size = int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(self._pool)
        indices: list[int] = []
        while len(indices) < batch_size:
            if self._pos >= n:
                self._perm = self._perm_rng.permutation(n)
                self._pos = 0
                self._epoch += 1
            take = min(batch_size - len(indices), n - self._pos)
            indices.extend(int(i) for i in self._perm[self._pos : self._pos + take])
            self._pos += take
        lengths = self._len_rng.integers(self.min_query_tokens, self.max_query_tokens, size=batch_size)
        self._batches += 1
        return self._make_examples([self._pool[i] for i in indices], lengths.tolist(), indices, "train")

    def eval_examples(self, limit: int | None = None) -> list[Example]:
        texts = self._eval_texts()
        # Lengths for the whole pool, so a smaller limit gives a prefix of a larger one.
        lengths = np.random.default_rng([self.eval_seed, 0xE7A2]).integers(
            self.min_query_tokens, self.max_query_tokens, size=len(texts)
        )
        n = len(texts) if limit is None else max(0, min(int(limit), len(texts)))
        return self._make_examples(texts[:n], lengths[:n].tolist(), range(n), "eval")

    # ------------------------------------------------------------------ task protocol

    def observer_prompt(self, example: Example, pioneer_response: str) -> str:
        return build_observer_prompt(example.query, pioneer_response)

    def clean_response(self, text: str) -> str:
        return text

    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        return [float(s) for s in self.reward([e.query for e in examples], list(responses))]

    # ------------------------------------------------------------------ resume

    @property
    def epoch(self) -> int:
        return self._epoch

    def state_dict(self) -> dict:
        return {
            "version": _STATE_VERSION,
            "source": self.source,
            "pool_size": len(self._pool),
            "seed": self.seed,
            "epoch": self._epoch,
            "pos": self._pos,
            "batches": self._batches,
            "perm": [int(i) for i in self._perm],
            "perm_rng": copy.deepcopy(self._perm_rng.bit_generator.state),
            "len_rng": copy.deepcopy(self._len_rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported IMDB sampler state version {state.get('version')!r}")
        if state["source"] != self.source or int(state["pool_size"]) != len(self._pool):
            raise ValueError(
                f"IMDB sampler state is for source {state['source']!r} with {state['pool_size']} "
                f"prompts, but this task uses {self.source!r} with {len(self._pool)}"
            )
        perm = np.asarray(state["perm"], dtype=np.int64)
        if perm.shape != (len(self._pool),):
            raise ValueError("IMDB sampler state has a permutation of the wrong size")
        self._perm = perm
        self._pos = state_count(state, "pos", len(self._pool))
        self._epoch = state_count(state, "epoch")
        self._batches = state_count({"batches": 0, **state}, "batches")
        self._perm_rng.bit_generator.state = copy.deepcopy(state["perm_rng"])
        self._len_rng.bit_generator.state = copy.deepcopy(state["len_rng"])


# --------------------------------------------------------------------------- registration


def _make(cfg, tokenizer, seed):
    return ImdbTask(tokenizer, source=cfg.dataset, seed=seed, reward=make_reward(cfg.reward_model))


def _check(cfg) -> None:
    check_reward_model(cfg.reward_model)
    if cfg.dataset_path is not None:
        raise ConfigError("dataset_path: imdb reads no data files (its prompts come from the hub or the built-in "
                          "openings); drop --dataset_path")


def _hub_assets(cfg) -> list[HubAsset]:
    """What a run fetches from the hub (make_reward's and _load_train_pool's rules): the paper's classifier reward,
    and the reviews for dataset hub, or auto (the built-in openings where the hub does not have them)."""
    found = []
    if cfg.reward_model == "distilbert-imdb":
        found.append(HubAsset("reward_model", DISTILBERT_IMDB, offline="--reward_model vader (or a local classifier "
                                                                       "folder)"))
    if cfg.dataset in ("hub", "auto"):
        found.append(HubAsset("dataset", HUB_DATASET, "dataset", "the built-in openings" if cfg.dataset == "auto"
                              else None, offline="--dataset builtin"))
    return found


# evaluation: reward, KL and diversity of 15-token answers to the paper's batch of 256 held-out openings (the
# built-in eval openings are fewer, 110), scored with plain VADER when training used a shaped form of it
register_task("imdb", _make, datasets=SOURCES, check=_check, prompt_tokens=64, hub_assets=_hub_assets,
              evaluation=Evaluation(REWARD_METRICS, answer_tokens=15, limit=256, reward="vader",
                                    scored_as={"vader-scaled": "vader", "vader-gain": "vader"}))
