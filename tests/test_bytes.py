"""Bytes as they come (hardening round 6): a path whose bytes are not UTF-8 (a report's folder, a --task_file) is
refused in one line before any work, with advice that fits the locale; a task file that is not UTF-8 names its line;
a reward reads an answer's 100,000-digit number in bounded time, and scores it 0.0 (or 1.0 when it is the answer)."""
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO
from cory.tasks.arithmetic import ArithmeticTask
from cory.tasks.gsm8k_answers import authors_correct, correctness_reward, extract_answer
from cory.errors import text_refusal
from entry_points import refused, tree
from test_report import synthetic

HUGE = "9" * 100_000


def test_a_huge_number_in_an_answer_scores_zero_in_bounded_time():
    answers = [f"The answer is {HUGE}", f"#### {HUGE}", f"so {HUGE} apples", "1," + ",".join(["000"] * 30_000),
               f"-{HUGE}.5", f"The answer is {HUGE}.{HUGE}"]
    start = time.perf_counter()
    for text in answers:
        assert correctness_reward(text, "18") == 0.0
        assert authors_correct(text, "#### 18") == 0.0
    assert time.perf_counter() - start < 5  # each once raised ValueError (int's 4300-digit limit)
    assert correctness_reward(f"The answer is {HUGE}", HUGE) == 1.0  # exact at any length
    assert extract_answer("#### 1,000.50") == "1000.5" and extract_answer("answer is -0.0") == "0"


def test_the_arithmetic_reward_scores_a_huge_number():
    task = ArithmeticTask(seed=0)
    batch = task.sample(2)
    assert task.score(batch, [f"The answer is {HUGE}", batch[1].reference]) == [0.0, 1.0]


def test_the_advice_fits_the_locale():
    name = os.fsdecode(b"exp\xff")
    line = text_refusal(name, "--out")
    if sys.getfilesystemencoding().lower().replace("-", "") == "utf8":
        assert "is not UTF-8 text" in line and "rename it" in line and "PYTHONUTF8" not in line
    assert text_refusal("exp_café", "--out") is None or "PYTHONUTF8=1" in text_refusal("exp_café", "--out")


def _undecodable(tmp_path: Path, name: bytes) -> Path:
    return Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name))


def _run(*args, cwd=REPO):
    return subprocess.run([sys.executable, *[os.fsencode(a) if isinstance(a, Path) else a for a in args]],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_a_report_on_a_folder_whose_name_is_not_utf8_is_one_line_before_any_figure(tmp_path):
    folder = _undecodable(tmp_path, b"exp\xff")
    synthetic(folder, cory_wins=False, seeds=(0, 1), steps=6)
    before = tree(tmp_path)
    p = _run("-m", "lab.report", folder)
    refused(p, "folder:", "exp\\udcff", "not UTF-8 text")
    assert tree(tmp_path) == before


def test_a_runner_task_file_whose_name_is_not_utf8_is_one_line(tmp_path):
    path = _undecodable(tmp_path, b"task\xff.py")
    path.write_text("x = 1\n")
    p = _run("-m", "lab.experiments", "--task_file", path, "--methods", "ppo", "--seeds", "0", "--out",
             tmp_path / "exp")
    refused(p, "--task_file:", "task\\udcff.py", "not UTF-8 text")
    assert not (tmp_path / "exp").exists()


def test_a_task_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "task.py"
    path.write_bytes(b"x = 1\ny = '\xff'\n")
    p = _run("-m", "lab.experiments", "--task_file", path, "--methods", "ppo", "--seeds", "0", "--out",
             tmp_path / "exp")
    refused(p, f"--task_file: {path} line ")
    assert not (tmp_path / "exp").exists()


def test_evaluate_refuses_a_task_file_whose_name_is_not_utf8(tmp_path, capsys):
    import pytest

    from lab import evaluate

    path = _undecodable(tmp_path, b"task\xff.py")
    path.write_text("x = 1\n")
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--task_file", str(path), "--task", "imdb", "--model", "tiny"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "task_file:" in err[0] and "not UTF-8 text" in err[0], err
