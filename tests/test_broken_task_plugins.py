"""A broken task plug-in (a one-file task, docs/adding_a_task.md, broken in one way) gets one line naming what is
wrong, through its real entry point (the task file as a script, the runner, evaluate): exit status, one line,
nothing written."""
import subprocess
import sys

import pytest

from conftest import REPO, one_line
from test_adding_a_task import guide_file

TINY = ["--model_name", "tiny", "--batch_size", "4", "--mini_batch_size", "2"]


def run(*args, cwd=REPO, timeout=900):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def runner(*args, timeout=900):
    return run("-m", "lab.experiments", *args, timeout=timeout)


def task_file(tmp_path, replace=(), name="kind_words.py"):
    """The guide's one-file task, with ``replace``'s (old, new) edits: a plug-in broken in one way."""
    text = guide_file()
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- its reward

@pytest.mark.slow
@pytest.mark.parametrize("score,message,status", [
    ("return [0.5] * (len(responses) - 1)", "returned 2 scores for 3 texts", 1),
    ("return [float('nan')] * len(responses)", "non-finite score (nan) on text 0", 1),
    # a dict of as many numbers as texts: its keys 0, 1, 2 were taken for the scores
    ("return {i: 0.5 for i in range(len(responses))}", "returned a dict, not a list of numbers, one per text (its "
                                                        "score() at {path}:", 1),
])
def test_evaluate_applies_trainings_score_checks(tmp_path, score, message, status):
    path = task_file(tmp_path, [
        ("        return [sum(w.strip(\".,!?\").lower() in KIND for w in r.split()) / max(1, len(r.split()))\n"
         "                for r in responses]", f"        {score}")])
    out = tmp_path / "eval.json"
    line = one_line(run("-m", "lab.evaluate", "--task_file", path, "--task", "kind_words", "--model", "tiny",
                        "--reward", "kind_share", "--json", out, "--max_new_tokens", "3"), status)
    assert message.format(path=path) in line and not out.exists()


@pytest.mark.slow
def test_a_run_whose_every_iteration_was_skipped_says_so(tmp_path):
    path = task_file(tmp_path, [
        ("        return [sum(w.strip(\".,!?\").lower() in KIND for w in r.split()) / max(1, len(r.split()))\n"
         "                for r in responses]", "        return [float('inf')] * len(responses)")])
    out = tmp_path / "run"
    p = run(path, "ppo", *TINY, "--steps", "2", "--on_nonfinite", "skip", "--output_dir", out, cwd=tmp_path)
    line = one_line(p, 1)
    assert "every one of the 2 iterations was skipped" in line and "done:" not in p.stdout
    assert not (out / "final").exists() and not (out / "metrics.jsonl").exists()


# ----------------------------------------------------------------------------- its sampler, prompts and state

@pytest.mark.slow
def test_sample_returning_another_count_is_one_line(tmp_path):
    path = task_file(tmp_path, [("for i in range(batch_size)]", "for i in range(batch_size - 1)]")])
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", tmp_path / "r", cwd=tmp_path), 1)
    assert "task kind_words: sample(4) returned 3 examples" in line


@pytest.mark.slow
def test_an_observer_prompt_that_is_not_a_string_is_one_line(tmp_path):
    path = task_file(tmp_path, [('return f"{example.prompt}{pioneer_response}\\nNow say it more kindly:"',
                                 "return None")])
    line = one_line(run(path, "cory", *TINY, "--steps", "1", "--output_dir", tmp_path / "r", cwd=tmp_path), 1)
    assert "task kind_words: observer_prompt() returned a NoneType" in line


@pytest.mark.slow
def test_prompts_past_the_models_context_are_refused_before_anything_is_written(tmp_path):
    path = task_file(tmp_path, [('prompt=f"Say something about {s}:") for s in picks]',
                                'prompt="Say something about " + " and ".join([s] * 400) + ":") for s in picks]')])
    out = tmp_path / "r"
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", out, cwd=tmp_path), 2)
    assert "task kind_words: a prompt of" in line and "does not fit tiny's context of" in line
    assert not out.exists()


@pytest.mark.slow
def test_a_state_dict_the_safe_loader_refuses_is_found_before_training(tmp_path):
    path = task_file(tmp_path, [('return {"position": self.position}',
                                 'return {"position": self.position, "when": __import__("datetime").date(2024, 1, 1)}')])
    out = tmp_path / "r"
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", out, cwd=tmp_path), 2)
    assert "task kind_words: state_dict() holds a datetime.date" in line and "never be resumed" in line
    assert not out.exists()


# ----------------------------------------------------------------------------- the file itself

def test_a_task_file_that_prints_at_import_still_runs_with_the_runner(tmp_path):
    path = task_file(tmp_path, [("KIND = {", 'print("loading kind words")\nKIND = {')])
    from lab.experiments import build_parser, plan

    pairs, _ = plan(build_parser().parse_args(["--task_file", str(path), "--methods", "ppo", "--seeds", "0",
                                          "--out", str(tmp_path / "exp"), "--set", "model_name=tiny"]))
    assert pairs[0].intended["model_name"] == "tiny"


def test_a_task_file_without_main_is_one_line(tmp_path):
    path = task_file(tmp_path, [('if __name__ == "__main__":', "if False:")])
    line = one_line(runner("--task_file", path, "--methods", "ppo", "--seeds", "0", "--out", tmp_path / "exp"), 2)
    assert "printed no config" in line and "__main__" in line
    assert not (tmp_path / "exp").exists()


@pytest.mark.slow
def test_a_task_file_with_a_syntax_error_names_its_file_and_line(tmp_path):
    path = task_file(tmp_path, [("class KindWords(TaskBase):", "class KindWords(TaskBase)")])
    line = one_line(runner("--task_file", path, "--methods", "ppo", "--seeds", "0", "--out", tmp_path / "exp"), 2)
    assert f"--task_file: {path} line " in line
    line = one_line(run("-m", "lab.evaluate", "--task_file", path, "--task", "kind_words", "--model", "tiny"), 2)
    assert f"task_file: {path} line " in line
    assert not (tmp_path / "exp").exists()


# ----------------------------------------------------------------------------- checked where they enter, in both

SAMPLE = "        return [Example(query=s, prompt=f\"Say something about {s}:\") for s in picks]"
HELD = "        return [Example(query=s, prompt=f\"Say something about {s}:\") for s in HELD_OUT[:limit]]"
MAKE = "register_task(\"kind_words\", lambda cfg, tokenizer, seed: KindWords(seed), rewards=(\"kind_share\",))"
EVALUATE = ["-m", "lab.evaluate", "--task", "kind_words", "--model", "tiny", "--reward", "kind_share",
            "--max_new_tokens", "3"]


@pytest.mark.slow
@pytest.mark.parametrize("replace,message", [
    ((HELD, "        return []"), "task kind_words: eval_examples(None) returned no examples"),
    ((HELD, "        return [Example(query=s, prompt='x', prompt_ids=[99999999]) for s in HELD_OUT]"),
     "example 0's prompt_ids holds 99999999, outside the tokenizer's vocabulary (0..50256)"),
    ((HELD, "        return [Example(query=s, prompt='x', prompt_ids=[]) for s in HELD_OUT]"),
     "example 0's prompt_ids is empty"),
    ((MAKE, MAKE.replace("KindWords(seed)", "None")), "make() returned NoneType, not a task"),
    ((MAKE, MAKE.replace("KindWords(seed)", "KindWords(seed, 'extra')")),
     "make() raised TypeError: KindWords.__init__() takes 2 positional arguments but 3 were given (registered at"),
    ((MAKE, MAKE.replace("KindWords(seed)", "KindWords(int('many'))")),
     "make() raised ValueError: invalid literal for int() with base 10: 'many' (registered at {path}:"),
    ((HELD, "        return [Example(query=s, prompt='x', prompt_ids=[5] * 4000) for s in HELD_OUT]"),
     "task kind_words: a prompt of 4000 tokens ('the library'...) with answers of up to 3 tokens does not fit"),
], ids=["no_eval_examples", "prompt_ids_outside_vocab", "empty_prompt_ids", "make_returns_none", "make_raises",
        "make_raises_a_value_error", "prompt_ids_past_the_context"])
def test_evaluate_checks_a_plugin_where_it_enters(tmp_path, replace, message):
    path = task_file(tmp_path, [replace])
    out = tmp_path / "eval.json"
    line = one_line(run(*EVALUATE[:2], "--task_file", path, *EVALUATE[2:], "--json", out), 2)
    assert message.format(path=path.resolve()) in line, line
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("replace,message", [
    ((SAMPLE, "        return [Example(query=s, prompt='x', prompt_ids=[-1]) for s in picks]"),
     "task kind_words: sample(4): example 0's prompt_ids holds -1, outside the tokenizer's vocabulary"),
    ((MAKE, MAKE.replace("KindWords(seed)", "None")), "make() returned NoneType, not a task"),
    ((HELD, "        return [Example(query=s, prompt='x', prompt_ids=[5] * 4000) for s in HELD_OUT]"),
     "task kind_words: a prompt of 4000 tokens ('the library'...) with answers of up to"),
], ids=["prompt_ids_outside_vocab", "make_returns_none", "held_out_prompt_ids_past_the_context"])
def test_training_checks_a_plugin_where_it_enters(tmp_path, replace, message):
    path = task_file(tmp_path, [replace])
    out = tmp_path / "run"
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", out, cwd=tmp_path), 2)
    assert message in line, line
    assert not (out / "final").exists() and not (out / "metrics.jsonl").exists()


@pytest.mark.slow
def test_evaluate_refuses_answers_past_the_models_context_before_loading(tmp_path):
    out = tmp_path / "eval.json"
    line = one_line(run("-m", "lab.evaluate", "--task", "imdb", "--model", "tiny", "--limit", "2",
                        "--max_new_tokens", "100000", "--json", out), 2)
    assert "does not fit tiny's context of" in line and "lower --max_new_tokens" in line, line
    assert not out.exists()
