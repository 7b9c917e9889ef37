"""GSM8K end to end on the tiny presets (real trl PPO, tiny real models), and the trainer's trimming of a
model-started "Question:"."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import GSM8K_DIR, run_script, trained
from cory import models
from cory.assets import locate
from cory.run.outputs import read_jsonl
from cory.tasks.base import Example
from cory.tasks.gsm8k import Gsm8kTask
from cory.rollout import decode_and_clean

needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "train.jsonl").is_file(),
                                 reason=f"real GSM8K release not found at {GSM8K_DIR}")


def _loads_and_generates(folder):
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("Question: 2 + 3?\nAnswer:", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2


# the GSM8K scripts' end-to-end run in make test (the CORY script's runs on the real release, or on a GPU)
def test_ppo_on_generated_problems(tmp_path):
    out = tmp_path / "ppo"
    rows = trained("gsm8k_train/ppo.py", out, "--config", "configs/gsm8k/ppo_tiny.yaml", "--steps", "1")
    assert [r["step"] for r in rows] == [0]
    for r in rows:
        assert 0.0 <= r["policy/task_reward"] <= 1.0
        assert r["policy/kl_coef"] == pytest.approx(0.01)
        assert 1 <= r["policy/response_length"] <= 8
    samples = read_jsonl(out / "samples.jsonl")
    assert samples and all(s["reward"] in (0.0, 1.0) for s in samples)
    _loads_and_generates(out / "final" / "policy")


@needs_gsm8k
def test_cory_on_real_gsm8k(tmp_path):
    out = tmp_path / "cory"
    p = run_script("gsm8k_train/cory.py", "--config", "configs/gsm8k/cory_tiny.yaml", "--steps", "1",
                   "--dataset", "local", "--dataset_path", GSM8K_DIR, "--output_dir", out)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [(r["step"], r["pioneer"]) for r in rows] == [(0, "llm1")]
    for r in rows:
        for agent in ("llm1", "llm2"):
            assert 0.0 <= r[f"{agent}/task_reward"] <= 1.0
            # a batch mean of per-question sums in {0, 1, 2}
            assert 0.0 <= r[f"{agent}/collective_reward"] <= 2.0
        assert r["llm1/collective_reward"] == pytest.approx(r["llm1/task_reward"] + r["llm2/task_reward"])
    # the questions are GSM8K's own training questions
    train = {json.loads(line)["question"].strip() for line in (GSM8K_DIR / "train.jsonl").open()}
    samples = read_jsonl(out / "samples.jsonl")
    assert samples and all(s["query"] in train for s in samples)
    assert all("\nReference: " in s["observer_prompt"] for s in samples)
    for agent in ("llm1", "llm2"):
        _loads_and_generates(out / "final" / agent)


def test_trainer_trims_a_model_started_question():
    tok = models.load_tokenizer(locate("tiny"))
    task = Gsm8kTask(source="generated", generated_size=8)
    answer = " He has 5 + 4 = 9 toys. #### 9"
    ids = tok(answer + "\n\nQuestion: How many cars", add_special_tokens=False).input_ids
    untouched = tok(" The Question: part stays inside a line. #### 3", add_special_tokens=False).input_ids
    texts, kept = decode_and_clean(task, tok, [torch.tensor(ids), torch.tensor(untouched)])
    assert texts[0] == answer
    # the tokens PPO trains on end where the kept text ends: a prefix, without the new question
    assert kept[0].tolist() == ids[: len(kept[0])] and len(kept[0]) < len(ids)
    assert tok.decode(kept[0]).rstrip() == answer and "Question" not in tok.decode(kept[0])
    assert texts[1] == tok.decode(untouched) and kept[1].tolist() == untouched
    assert task.score([Example(query="q", prompt="q", reference="9")], texts[:1]) == [1.0]
