"""The arithmetic task: its exact 0/1 reward, the paper's GSM8K prompt form, a held-out share training never draws,
resumable sampling, and both training scripts end to end on the tiny presets (real trl PPO, a tiny real model)."""
import copy
import re

import pytest

from conftest import trained
from cory.assets import locate
from cory.heldout import evaluate_reward
from cory import models
from cory.run.outputs import read_jsonl
from cory.tasks import task_spec
from cory.tasks.arithmetic import (EVAL_SIZE, SETTINGS, ArithmeticTask, build_observer_prompt, build_prompt,
                                   held_out, is_held_out)
from cory.tasks.base import Example


def _score(answer: str, result: str) -> float:
    return ArithmeticTask("sums_2x1").score([Example(query="q", prompt="q", reference=result)], [answer])[0]


@pytest.mark.parametrize("answer, result, reward", [
    ("The answer is 68.", "68", 1.0),
    (" 60 + 8 = 68. The answer is 68.", "68", 1.0),
    ("The answer is 680.", "68", 0.0),        # the right digits in a longer number
    ("680", "68", 0.0),
    ("6 8", "68", 0.0),                       # spaced digits are two numbers, the last one 8
    ("The answer is 1680", "68", 0.0),        # a number inside a longer wrong one
    ("The answer is 68.5", "68", 0.0),
    ("4 - 9 = -5. The answer is -5.", "-5", 1.0),
    ("4 - 9 = 5. The answer is 5.", "-5", 0.0),  # the sign counts
    ("The answer is 68, or maybe 70", "68", 1.0),  # "answer is" wins over the last number
    ("no number at all", "68", 0.0),
    ("", "68", 0.0),
    ("The answer is \u0666\u0668.", "68", 1.0),  # Arabic-Indic digits are read by their value, as int() reads them
    ("The answer is \uff16\uff18.", "68", 1.0),  # fullwidth digits likewise (0 from fc91ef7 until issue 75)
    ("The answer is \uff16\uff18\uff10.", "68", 0.0),  # and a longer number is still another number
])
def test_the_reward_is_exact_correctness_of_the_final_number(answer, result, reward):
    assert _score(answer, result) == reward


def test_prompts_are_the_papers_gsm8k_form():
    assert build_prompt("What is 4 - 9?") == ("Question: What is 12 + 7?\nAnswer: 12 + 7 = 19. The answer is 19.\n\n"
                                              "Question: What is 4 - 9?\nAnswer:")
    assert build_observer_prompt("What is 4 - 9?", " 4 - 9 = -5. The answer is -5. ") == (
        "Question: What is 12 + 7?\nAnswer: 12 + 7 = 19. The answer is 19.\n\n"
        "Question: What is 4 - 9?\nReference: 4 - 9 = -5. The answer is -5.\nAnswer:")
    task = ArithmeticTask("sums_2x1", seed=3)
    ex = task.sample(1)[0]
    assert ex.prompt == build_prompt(ex.query) and ex.query == f"What is {ex.meta['expression']}?"
    assert task.observer_prompt(ex, "x") == build_observer_prompt(ex.query, "x")


def test_an_answer_ends_where_the_model_starts_a_new_question():
    task = ArithmeticTask("sums_2x1")
    assert task.clean_response(" 4 - 9 = -5. The answer is -5.\n\nQuestion: What is 1 + 1?\nAnswer: 2") == \
        " 4 - 9 = -5. The answer is -5."


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_references_are_the_expressions_results(setting):
    for ex in ArithmeticTask(setting, seed=1).sample(50):
        assert int(ex.reference) == eval(ex.meta["expression"])  # noqa: S307 - digits and + - * only


def test_training_never_draws_a_held_out_problem_and_the_held_out_set_is_fixed():
    evaluation = held_out("sums_2x12")
    assert len(evaluation) == EVAL_SIZE and all(is_held_out(ex.meta["expression"]) for ex in evaluation)
    drawn = {ex.meta["expression"] for seed in (0, 1) for ex in ArithmeticTask("sums_2x12", seed=seed).sample(1000)}
    assert not drawn & {ex.meta["expression"] for ex in evaluation}
    # the same problems for every seed and every run: the held-out path of each run reads one set
    assert ArithmeticTask("sums_2x12", seed=5).eval_examples() == ArithmeticTask("sums_2x12").eval_examples()
    # drawn as training draws: a setting of few problems repeats its held-out ones, EVAL_SIZE answers in all
    small = held_out("sums_2x1")
    assert len(small) == EVAL_SIZE and 10 < len({ex.query for ex in small}) < 60


def one_digit(expression: str) -> bool:
    return all(len(n) == 1 for n in re.findall(r"\d+", expression))


def test_the_held_out_set_holds_the_trainings_mix_of_problems():
    """sums_2x12 draws a sum of one-digit numbers about half the time, from only 200 such expressions: a held-out
    set of distinct expressions was 86.5% two-digit sums (results/arithmetic_cpu_pilot/DESIGN.md, stage 3)."""
    training = ArithmeticTask("sums_2x12", seed=0).sample(2000)
    evaluation = held_out("sums_2x12")
    share = sum(one_digit(ex.meta["expression"]) for ex in training) / len(training)
    held = sum(one_digit(ex.meta["expression"]) for ex in evaluation) / len(evaluation)
    # the binomial spread of 200 draws is 0.035: four of them
    assert 0.4 < share < 0.6 and abs(held - share) < 0.14, (share, held)


def test_seeds_draw_different_streams_and_a_resume_draws_the_same_batches():
    a, b = ArithmeticTask("sums_2x12", seed=0), ArithmeticTask("sums_2x12", seed=1)
    assert [x.query for x in a.sample(16)] != [x.query for x in b.sample(16)]
    state = copy.deepcopy(a.state_dict())
    expected = [x.query for x in a.sample(16)]
    resumed = ArithmeticTask("sums_2x12", seed=0)
    resumed.load_state_dict(state)
    assert [x.query for x in resumed.sample(16)] == expected
    with pytest.raises(ValueError, match="sums_2x1"):
        ArithmeticTask("sums_2x1").load_state_dict(state)


def test_parseable_answers_hold_a_number():
    assert ArithmeticTask.parseable("The answer is 12.") and ArithmeticTask.parseable("-3")
    assert not ArithmeticTask.parseable("Protdyggy valley daddy") and not ArithmeticTask.parseable("")


def test_the_held_out_evaluation_reads_greedy_accuracy_and_parseable_answers():
    tok = models.load_tokenizer(locate("tiny"))
    model = models.load_causal_lm(locate("tiny"))
    task = ArithmeticTask("sums_2x12")
    assert task_spec("arithmetic").evaluation.greedy
    res = evaluate_reward(model, model, tok, task, task.eval_examples(6), max_new_tokens=6, batch_size=4, seed=0,
                          reward_name="correctness", allow_early_eos=True, progress=False, greedy=True)
    assert 0 <= res["task_reward"] <= 1 and 0 <= res["greedy_reward"] <= 1 and 0 <= res["parseable_share"] <= 1
    assert res["kl"] == pytest.approx(0, abs=1e-6)  # the model is its own reference
    assert res["base_logprob"] < 0
    # greedy answers are read after the sampled ones and draw nothing: the sampled answers are what they were
    plain = evaluate_reward(model, model, tok, task, task.eval_examples(6), max_new_tokens=6, batch_size=4, seed=0,
                            reward_name="correctness", allow_early_eos=True, progress=False)
    assert "greedy_reward" not in plain and plain["task_reward"] == res["task_reward"]
    assert plain["distinct_2"] == res["distinct_2"] and plain["kl"] == res["kl"]


# both in the slow set: the arithmetic scripts' end-to-end run in make test is CORY's with RLOO
# (tests/test_advantages.py); PPO's here adds a held-out evaluation of 200 problems
@pytest.mark.slow
@pytest.mark.parametrize("method", ["ppo", "cory"])
def test_the_training_scripts_run_the_task(tmp_path, method):
    out = tmp_path / method
    # the held-out evaluation of a run (200 problems, sampled and greedy) once, PPO's: the game is what CORY adds
    rows = trained(f"arithmetic_train/{method}.py", out, "--config", f"configs/arithmetic/{method}_tiny.yaml",
                   "--steps", "1", "--eval_every", "1" if method == "ppo" else "0")
    agents = ["policy"] if method == "ppo" else ["llm1", "llm2"]
    for r in rows:
        for agent in agents:
            assert 0.0 <= r[f"{agent}/task_reward"] <= 1.0
    if method == "cory":
        assert rows[0]["llm1/collective_reward"] == pytest.approx(rows[0]["llm1/task_reward"]
                                                                  + rows[0]["llm2/task_reward"])
        assert all("\nReference: " in s["observer_prompt"] for s in read_jsonl(out / "samples.jsonl"))
        return
    evals = read_jsonl(out / "eval.jsonl")
    assert {(r["iterations"], r["agent"]) for r in evals} == {(0, "policy"), (1, "policy")}
    assert all({"greedy_reward", "parseable_share", "base_logprob"} <= set(r) and r["n_prompts"] == 200
               for r in evals)
