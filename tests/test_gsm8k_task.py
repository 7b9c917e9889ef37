"""GSM8K task: prompts, answer extraction, reward, data loading and the Task sampler.

Uses the real GSM8K release kept beside the repository (``<repo>/../shared/data/gsm8k`` or
``$CORY_GSM8K_DIR``); those tests are skipped when it is absent. Nothing touches the network.
"""
from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from cory.tasks.base import Example
from cory.tasks.gsm8k import (
    ONE_SHOT_ANSWER,
    ONE_SHOT_QUESTION,
    Gsm8kTask,
    build_observer_prompt,
    build_prompt,
    load_gsm8k,
    resolve_source,
)
from cory.tasks.gsm8k_answers import authors_correct, correctness_reward, extract_answer, normalize_number, reference_answer, trim_at_stop

GSM8K_DIR = Path(
    os.environ.get("CORY_GSM8K_DIR")
    or Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
)
needs_gsm8k = pytest.mark.skipif(
    not (GSM8K_DIR / "train.jsonl").is_file() or not (GSM8K_DIR / "test.jsonl").is_file(),
    reason=f"real GSM8K release not found at {GSM8K_DIR}",
)


def _read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    return rows


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No hub and an empty cache, so nothing can be found or fetched."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def test_one_shot_example():
    assert ONE_SHOT_QUESTION == (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. "
        "How many toys does he have now?"
    )
    assert "5 + 4 = 9" in ONE_SHOT_ANSWER
    assert ONE_SHOT_ANSWER.rstrip().endswith("#### 9")
    assert reference_answer(ONE_SHOT_ANSWER) == "9"
    assert "\n" not in ONE_SHOT_ANSWER  # one line: a new line starting "Question:" is a stop


def test_build_prompt_exact():
    q = "Tom has 3 apples and buys 2 more. How many apples does he have?"
    expected = (
        f"Question: {ONE_SHOT_QUESTION}\nAnswer: {ONE_SHOT_ANSWER}\n\n"
        f"Question: {q}\nAnswer:"
    )
    assert build_prompt(q) == expected
    assert build_prompt("  " + q + "\n") == expected


def test_build_observer_prompt_exact():
    q = "Tom has 3 apples and buys 2 more. How many apples does he have?"
    resp = " Tom has 3 + 2 = 5 apples. #### 5 \n"
    expected = (
        f"Question: {ONE_SHOT_QUESTION}\nAnswer: {ONE_SHOT_ANSWER}\n\n"
        f"Question: {q}\nReference: Tom has 3 + 2 = 5 apples. #### 5\nAnswer:"
    )
    assert build_observer_prompt(q, resp) == expected
    assert build_observer_prompt(q, resp).startswith(build_prompt(q)[: -len("Answer:")])


# ---------------------------------------------------------------------------------------------
# Numbers and answers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,000", "1000"), ("$1000", "1000"), ("1000.", "1000"), ("1000.00", "1000"),
        ("1000", "1000"), ("-3", "-3"), ("0.50", "0.5"), ("1.25", "1.25"), ("45%", "45"),
        ("18 dollars", "18"), ("5 apples.", "5"), (" 12 ", "12"), ("$-5", "-5"), ("-$5", "-5"),
        ("0", "0"), ("-0", "0"), ("007", "7"), ("109,200,000", "109200000"), (".5", "0.5"),
        ("**12**", "12"), ("2.500", "2.5"),
        ("abc", None), ("", None), (None, None), ("dollars 5", None), ("-", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        # "####" wins, and the LAST "####" at that.
        ("#### 1,000", "1000"),
        ("He has 5 + 4 = 9 toys. #### 9", "9"),
        ("Step 1: 3 * 4 = 12.\nStep 2: 12 + 6 = 18.\n#### 18", "18"),
        ("#### 5 and then 7 more numbers 8", "5"),
        ("First #### 3, no wait: #### 4", "4"),
        ("She pays 2 * $3 = $6.\n#### $6", "6"),
        ("#### -7", "-7"),
        ("#### **42**", "42"),
        ("The total is 12. ####", "12"),  # nothing after "####": fall back
        # "answer is"
        ("The answer is $1,234.", "1234"),
        ("The answer is: $1,234.", "1234"),
        ("So the answer is **12**", "12"),
        ("The final answer is 7. I checked 3 times in 2 ways.", "7"),
        ("THE ANSWER IS 30 apples.", "30"),
        ("Therefore the answer is -3.5 degrees.", "-3.5"),
        ("The answer is that he has 12 apples, 3 more than Bob.", "12"),
        ("The answer is 5. Wait, recount: the answer is 6.", "6"),
        ("answer is \\boxed{42}", "42"),
        # last number
        ("He had 3, then 5, then 8.", "8"),
        ("It costs 18 dollars", "18"),
        ("She has 5 apples.", "5"),
        ("The discount is 45%", "45"),
        ("The temperature is -7", "-7"),
        ("It dropped to -7 degrees.", "-7"),
        ("He ran 3-4 miles", "4"),
        ("He has 10 - 4 = 6 left", "6"),
        ("Each costs 2.5", "2.5"),
        ("That is 0.50 per cup.", "0.5"),
        ("Total: 1,000,000 people.", "1000000"),
        ("He earns $1000.00.", "1000"),
        ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.", "9"),
        ("So the result is 48/2 = 24.", "24"),
        ("The numbers are 1,2,3", "3"),
        ("COVID-19", "19"),
        # no number
        ("I don't know.", None),
        ("", None),
        ("The answer is unknown.", None),
        ("####", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@needs_gsm8k
def test_reference_solutions_extract_to_their_reference():
    rows = _read_jsonl(GSM8K_DIR / "train.jsonl", limit=200)
    assert len(rows) == 200
    for row in rows:
        ref = reference_answer(row["answer"])
        assert ref is not None and ref == normalize_number(ref)
        assert extract_answer(row["answer"]) == ref, row["answer"][-80:]
        assert correctness_reward(row["answer"], ref) == 1.0


@needs_gsm8k
def test_reference_answer_with_thousands_separator_in_release():
    rows = _read_jsonl(GSM8K_DIR / "train.jsonl")
    with_comma = [r for r in rows if "," in r["answer"].rpartition("####")[2]]
    assert with_comma, "the release has answers like '#### 1,080'"
    for r in with_comma:
        assert "," not in reference_answer(r["answer"])
        assert extract_answer(r["answer"]) == reference_answer(r["answer"])


def test_reference_answer():
    assert reference_answer("a\nb\n#### 18") == "18"
    assert reference_answer("x\n#### 1,080") == "1080"
    assert reference_answer("x\n#### -3") == "-3"
    assert reference_answer("x\n#### 0.50") == "0.5"
    with pytest.raises(ValueError):
        reference_answer("no marker 18")
    with pytest.raises(ValueError):
        reference_answer("#### none")


def test_correctness_reward():
    assert correctness_reward("She has 4 + 5 = 9 toys. #### 9", "9") == 1.0
    assert correctness_reward("The answer is $1,000.", "1000") == 1.0
    assert correctness_reward("The answer is 1000.", "1,000") == 1.0
    assert correctness_reward("#### 0.5", "0.50") == 1.0
    assert correctness_reward("#### 9.0", "9") == 1.0
    assert correctness_reward("#### 8", "9") == 0.0
    assert correctness_reward("I am not sure.", "9") == 0.0
    assert correctness_reward("9 then 10", "9") == 0.0  # last number wins
    assert correctness_reward("#### 9", "not a number") == 0.0
    assert isinstance(correctness_reward("#### 9", "9"), float)


@pytest.mark.parametrize("digits", ["\u0664\u0662", "\uff14\uff12", "\u06f4\u06f2", "4\u0662"])
def test_a_number_in_unicode_decimal_digits_is_read_by_its_value(digits):
    """Decided in issue 75: every Unicode decimal digit (what ``\\d`` and int() accept) counts as its value in the
    training reward, as it did before fc91ef7; the authors' evaluation compares strings, so there it stays 0."""
    assert extract_answer(f"The answer is {digits}.") == "42" and normalize_number(f"${digits}") == "42"
    assert correctness_reward(f"#### {digits}", "42") == 1.0 and correctness_reward(f"so {digits} apples", "42") == 1.0
    assert correctness_reward(f"The answer is {digits}1", "42") == 0.0
    assert authors_correct(f"The answer is {digits}.", "#### 42") == 0.0


def test_trim_at_stop():
    resp = " He has 5 + 4 = 9. #### 9\n\nQuestion: A farmer has 7 cows. #### 3\nAnswer: 12"
    assert trim_at_stop(resp) == " He has 5 + 4 = 9. #### 9"
    assert extract_answer(trim_at_stop(resp)) == "9"
    assert trim_at_stop("5 + 4 = 9\nQuestion: x") == "5 + 4 = 9"
    assert trim_at_stop("5 + 4 = 9 \n  Question: x") == "5 + 4 = 9"
    assert trim_at_stop("Question: what?") == ""
    # absent, or not at the start of a line: unchanged
    assert trim_at_stop(" 5 + 4 = 9.  ") == " 5 + 4 = 9.  "
    assert trim_at_stop("The Question: is odd. 9") == "The Question: is odd. 9"
    assert trim_at_stop("The question: is 9\nquestion: 3") == "The question: is 9\nquestion: 3"
    # custom stop
    assert trim_at_stop("9\nQ: next", stop="Q:") == "9"
    assert trim_at_stop("9\nQuestion: next", stop="") == "9\nQuestion: next"


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


@needs_gsm8k
def test_load_local_real_release():
    train = load_gsm8k("train", source="local", dataset_path=GSM8K_DIR)
    test = load_gsm8k("test", source="local", dataset_path=GSM8K_DIR)
    assert len(train) == 7473 and len(test) == 1319
    assert set(train[0]) == {"question", "answer"}
    assert test[0]["question"].startswith("Janet")
    assert reference_answer(test[0]["answer"]) == "18"
    # auto with a dataset_path means local
    assert len(load_gsm8k("test", source="auto", dataset_path=str(GSM8K_DIR))) == 1319


def test_load_local_errors(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"question": "q?", "answer": "a\n#### 1"}) + "\n", encoding="utf-8"
    )
    assert load_gsm8k("train", source="local", dataset_path=tmp_path) == [
        {"question": "q?", "answer": "a\n#### 1"}
    ]
    from cory.errors import ConfigError
    with pytest.raises(ConfigError, match="test.jsonl not found"):
        load_gsm8k("test", source="local", dataset_path=tmp_path)
    (tmp_path / "test.jsonl").write_text('{"question": "q?"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"test.jsonl line 1: no 'answer'"):
        load_gsm8k("test", source="local", dataset_path=tmp_path)
    (tmp_path / "test.jsonl").write_text("not json\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"test.jsonl line 1: not valid JSON"):
        load_gsm8k("test", source="local", dataset_path=tmp_path)
    with pytest.raises(ValueError, match="dataset_path"):
        load_gsm8k("train", source="local")
    with pytest.raises(ValueError, match="split"):
        load_gsm8k("validation", source="local", dataset_path=tmp_path)
    with pytest.raises(ValueError, match="source"):
        load_gsm8k("train", source="nope")


def test_generated_format_and_disjoint():
    train = load_gsm8k("train", source="generated", seed=0, generated_size=1500)
    test = load_gsm8k("test", source="generated", seed=0, generated_size=400)
    assert len(train) == 1500 and len(test) == 400
    for rows in (train, test):
        assert len({r["question"] for r in rows}) == len(rows)  # no duplicates in a split
        for r in rows:
            assert set(r) == {"question", "answer"}
            assert r["question"] and not r["question"].endswith("Do not include units.")
            tail = r["answer"].rpartition("\n")[2]
            assert tail.startswith("#### ")
            ref = reference_answer(r["answer"])
            assert tail == f"#### {ref}"
            assert extract_answer(r["answer"]) == ref
    train_q = {" ".join(r["question"].split()) for r in train}
    test_q = {" ".join(r["question"].split()) for r in test}
    assert not train_q & test_q
    # Disjoint whatever the sizes: a bigger train never takes a test question.
    big_train = load_gsm8k("train", source="generated", seed=0, generated_size=4000)
    assert big_train[:1500] == train  # same stream, extended
    assert not {r["question"] for r in big_train} & {r["question"] for r in test}


def test_generated_deterministic_and_seeded():
    a = load_gsm8k("test", source="generated", seed=0, generated_size=50)
    b = load_gsm8k("test", source="generated", seed=0, generated_size=50)
    c = load_gsm8k("test", source="generated", seed=1, generated_size=50)
    assert a == b
    assert a != c
    assert not {r["question"] for r in c} & {
        r["question"] for r in load_gsm8k("train", source="generated", seed=1, generated_size=500)
    }
    with pytest.raises(ValueError):
        load_gsm8k("test", source="generated", generated_size=0)


def test_auto_offline_falls_back_quickly(offline_hub, caplog):
    caplog.set_level("INFO", logger="cory.tasks.gsm8k")
    t0 = time.monotonic()
    rows = load_gsm8k("test", source="auto", generated_size=30)
    elapsed = time.monotonic() - t0
    assert len(rows) == 30
    assert rows == load_gsm8k("test", source="generated", generated_size=30)
    assert elapsed < 30, elapsed
    msgs = [r.getMessage() for r in caplog.records if r.name == "cory.tasks.gsm8k"]
    assert len(msgs) == 1
    assert "generated" in msgs[0] and "NOT GSM8K" in msgs[0]


def test_hub_source_offline_raises_asset_error(offline_hub):
    assets = pytest.importorskip("cory.assets")
    t0 = time.monotonic()
    with pytest.raises(assets.AssetError):
        load_gsm8k("test", source="hub")
    assert time.monotonic() - t0 < 30


def test_auto_uses_hub_when_reachable(monkeypatch):
    """With a (fake) reachable hub, auto picks it; a failing hub load falls back to generated."""
    calls = []
    fake_assets: Any = types.ModuleType("cory.assets")

    class AssetError(RuntimeError):
        pass

    fake_assets.AssetError = AssetError
    fake_assets.check_hub_asset = lambda repo_id, repo_type="model", timeout=5.0: calls.append(
        (repo_id, repo_type)
    )
    # the task module imports the hub check at its top: route its calls to whatever the fake holds now
    monkeypatch.setattr("cory.tasks.gsm8k.check_hub_asset", lambda *a, **k: fake_assets.check_hub_asset(*a, **k))
    fake_datasets: Any = types.ModuleType("datasets")

    def load_dataset(name, config, split):
        assert (name, config) == ("openai/gsm8k", "main")
        return [{"question": f"{split} q{i}?", "answer": f"x\n#### {i}"} for i in range(3)]

    fake_datasets.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets)
    assert resolve_source("auto") == "hub"
    rows = load_gsm8k("test", source="auto")
    assert rows[1] == {"question": "test q1?", "answer": "x\n#### 1"}
    assert ("openai/gsm8k", "dataset") in calls
    task = Gsm8kTask(source="auto")
    assert task.source == "hub" and len(task) == 3

    def broken(name, config, split):
        raise ConnectionError("boom")

    fake_datasets.load_dataset = broken
    assert len(load_gsm8k("test", source="auto", generated_size=5)) == 5
    with pytest.raises(ConnectionError):
        load_gsm8k("test", source="hub")
    task = Gsm8kTask(source="auto", generated_size=6)
    assert task.source == "generated" and len(task) == 6

    def unreachable(repo_id, repo_type="model", timeout=5.0):
        raise AssetError("openai/gsm8k: not cached and hub unreachable")

    fake_assets.check_hub_asset = unreachable
    assert resolve_source("auto") == "generated"
    with pytest.raises(AssetError):
        load_gsm8k("test", source="hub")


# ---------------------------------------------------------------------------------------------
# Task
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_task():
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"real GSM8K release not found at {GSM8K_DIR}")
    return Gsm8kTask(source="local", dataset_path=GSM8K_DIR, seed=3)


def test_task_examples(real_task):
    task = real_task
    assert task.name == "gsm8k" and task.source == "local"
    assert len(task) == 7473
    ev = task.eval_examples(5)
    rows = _read_jsonl(GSM8K_DIR / "test.jsonl", limit=5)
    assert [e.query for e in ev] == [r["question"].strip() for r in rows]
    assert [e.reference for e in ev] == [reference_answer(r["answer"]) for r in rows]
    assert all(isinstance(e, Example) and e.prompt == build_prompt(e.query) for e in ev)
    assert ev[0].reference == "18" and ev[0].prompt_ids is None
    assert len(task.eval_examples()) == 1319
    assert task.eval_examples(0) == []
    assert task.observer_prompt(ev[0], " 16-3-4=9, 9*2=18 #### 18\n") == build_observer_prompt(
        ev[0].query, "16-3-4=9, 9*2=18 #### 18"
    )
    assert task.clean_response(" #### 18\nQuestion: more") == " #### 18"


def test_task_score(real_task):
    ev = real_task.eval_examples(3)
    responses = [
        f"So she makes {ev[0].reference} dollars. #### {ev[0].reference}",
        "The answer is 1234567.",
        f"The answer is {ev[2].reference}.",
    ]
    assert real_task.score(ev, responses) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        real_task.score(ev, responses[:2])


def test_task_sampling_deterministic_and_resumable():
    kw = dict(source="generated", seed=5, generated_size=40)
    a, b = Gsm8kTask(**kw), Gsm8kTask(**kw)
    first = [[e.query for e in a.sample(7)] for _ in range(3)]
    assert first == [[e.query for e in b.sample(7)] for _ in range(3)]
    state = a.state_dict()
    json.dumps(state)  # checkpointable
    nxt = [[e.query for e in a.sample(7)] for _ in range(12)]  # crosses several epochs
    c = Gsm8kTask(**kw)
    c.load_state_dict(state)
    assert [[e.query for e in c.sample(7)] for _ in range(12)] == nxt
    # a different seed gives another order of the same data
    d = Gsm8kTask(**{**kw, "seed": 6})
    assert [e.query for e in d.sample(7)] != first[0]
    assert {e.query for e in d.sample(40)} | {e.query for e in d.sample(40)} == {
        e.query for e in d.sample(80)
    }


def test_task_epochs_are_permutations_and_reshuffled():
    task = Gsm8kTask(source="generated", seed=0, generated_size=10)
    assert len(task) == 10
    stream = [e.query for e in task.sample(4)] + [e.query for e in task.sample(4)]
    stream += [e.query for e in task.sample(12)]  # crosses epochs mid-batch
    epoch0, epoch1 = stream[:10], stream[10:20]
    assert len(set(epoch0)) == 10 and set(epoch0) == set(epoch1)
    assert epoch0 != epoch1  # re-permuted per epoch
    assert (task.state_dict()["epoch"], task.state_dict()["position"]) == (1, 10)  # lazy wrap
    train_q = {e.query for e in task.sample(10)}
    assert not train_q & {e.query for e in task.eval_examples()}
    with pytest.raises(ValueError):
        task.sample(0)


def test_task_load_state_rejects_other_data():
    task = Gsm8kTask(source="generated", generated_size=10)
    state = task.state_dict()
    other = Gsm8kTask(source="generated", generated_size=12)
    with pytest.raises(ValueError, match="training problems"):
        other.load_state_dict(state)


# ----------------------------------------------------------------------------- the authors' evaluation protocol

@pytest.mark.parametrize("text,authors,training", [
    # "the answer is": the authors take the first number after its first occurrence, training the last occurrence's
    ("So 2 + 3 = 5. The answer is 5. Next the answer is 7.", "5", "7"),
    ("The Answer Is: 1,234.", "1234", "1234"),                # lower-cased; commas and a trailing "." dropped
    # no "the answer is": the last number of the whole text; "####" means nothing to the authors' rule
    ("He has 9 toys. #### 9\nQuestion: Tom has 3 cats", "3", "9"),
    ("5 + 4 = 9.", "9", "9"),
    # compared as strings by the authors, as numbers in training
    ("the answer is 3.50", "3.50", "3.5"),
    ("It costs $18 dollars", "18", "18"),
    ("the answer is unknown, maybe 4", "4", "4"),
    ("The answer is unknown", None, None),
    ("no digits at all", None, None),
])
def test_answer_extraction_authors_and_training_rules(text, authors, training):
    from cory.tasks.gsm8k_answers import authors_extract
    assert authors_extract(text) == authors
    assert extract_answer(text) == training


def test_authors_scoring_and_prompt():
    from cory.tasks.gsm8k import build_authors_prompt
    from cory.tasks.gsm8k_answers import authors_correct, authors_reference
    solution = "He had 1,000 then 200 more.\n#### 1,200"
    assert authors_reference(solution) == "1200"
    assert authors_correct("The answer is 1,200.", solution) == 1.0
    assert authors_correct("The answer is 1200.00", solution) == 0.0  # a string compare, as the authors do
    assert correctness_reward("The answer is 1200.00", "1200") == 1.0   # the training reward reads the number
    prompt = build_authors_prompt("  How many? ")
    assert prompt.endswith("\nQuestion: How many?\n Answer:") and "fromhis" in prompt
    assert "5 + 4 = 9.\nQuestion:" in prompt and "####" not in prompt
