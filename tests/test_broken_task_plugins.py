"""Hardening, round 3 (issue 28): the runner never deletes or shortens a finished run, a record never claims what a
run did not do, a broken task plug-in gets one line. Each case through its real entry point: exit status, one
line, nothing lost."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, rejected
from test_adding_a_task import guide_file

TINY = ["--model_name", "tiny", "--batch_size", "4", "--mini_batch_size", "2"]


def run(*args, cwd=REPO, timeout=900):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def one_line(p, status):
    import re

    lines = [ln for ln in re.split(r"[\r\n]", p.stderr) if ln.strip()]  # a progress bar's line ends in \r
    assert p.returncode == status and lines and lines[-1].startswith("error: "), (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return lines[-1]


def runner(*args, timeout=900):
    return run("-m", "cory.lab.experiments", *args, timeout=timeout)


def task_file(tmp_path, replace=(), name="kind_words.py"):
    """The guide's one-file task, with ``replace``'s (old, new) edits: a plug-in broken in one way."""
    text = guide_file()
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- data loss

def test_the_runner_never_shortens_a_finished_run(tmp_path):
    out = tmp_path / "exp"
    base = ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--out", out, "--no_eval",
            "--no_report"]
    assert runner(*base, "--steps", "2").returncode == 0
    run_dir = out / "runs" / "ppo" / "seed_0"
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    line = one_line(runner(*base, "--steps", "1"), 2)
    assert "runs/ppo/seed_0" in line and "2 iterations, more than --steps 1" in line
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
    # the same folder shaped as a committed results/ folder: metrics, samples, config; no weights
    shutil.rmtree(run_dir / "final")
    shutil.rmtree(run_dir / "checkpoints")
    metrics = (run_dir / "metrics.jsonl").read_text()
    line = one_line(runner(*base, "--steps", "1"), 2)
    assert "2 iterations, more than --steps 1" in line
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def test_the_runner_refuses_a_training_run_as_its_out_folder(finished):
    before = sorted(p.name for p in (finished / "ppo").iterdir())
    line = one_line(runner("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0",
                           "--out", finished / "ppo"), 2)
    assert "is a training run's folder" in line
    assert sorted(p.name for p in (finished / "ppo").iterdir()) == before


# ----------------------------------------------------------------------------- records that claim what did not happen

def test_resume_refuses_a_hand_edited_config(finished, tmp_path):
    out = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", out)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("learning_rate: 0.0001", "learning_rate: 1.0e-06"))
    edited = config.read_text()
    line = one_line(run("imdb_train/ppo.py", "--resume", out, "--steps", "3"), 2)
    assert "config.yaml says learning_rate 1e-06" in line and "trained with 0.0001" in line
    assert config.read_text() == edited and not (out / "final" / "policy" / "x").exists()


def test_a_horizon_that_would_turn_the_kl_penalty_into_a_bonus_is_refused():
    line = rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_tiny.yaml", "--adap_kl_ctrl", "true",
                                    "--target", "1000", "--horizon", "0.5"])
    assert "horizon: 0.5" in line and "zero or negative" in line and "0.8" in line


@pytest.mark.parametrize("score,message,status", [
    ("return [0.5] * (len(responses) - 1)", "returned 2 scores for 3 texts", 1),
    ("return [float('nan')] * len(responses)", "non-finite score (nan) on text 0", 1),
])
def test_evaluate_applies_trainings_score_checks(tmp_path, score, message, status):
    path = task_file(tmp_path, [
        ("        return [sum(w.strip(\".,!?\").lower() in KIND for w in r.split()) / max(1, len(r.split()))\n"
         "                for r in responses]", f"        {score}")])
    out = tmp_path / "eval.json"
    line = one_line(run("-m", "cory.lab.evaluate", "--task_file", path, "--task", "kind_words", "--model", "tiny",
                        "--reward", "kind_share", "--json", out, "--max_new_tokens", "3"), status)
    assert message in line and not out.exists()


def test_a_run_whose_every_iteration_was_skipped_says_so(tmp_path):
    path = task_file(tmp_path, [
        ("        return [sum(w.strip(\".,!?\").lower() in KIND for w in r.split()) / max(1, len(r.split()))\n"
         "                for r in responses]", "        return [float('inf')] * len(responses)")])
    out = tmp_path / "run"
    p = run(path, "ppo", *TINY, "--steps", "2", "--on_nonfinite", "skip", "--output_dir", out, cwd=tmp_path)
    line = one_line(p, 1)
    assert "every one of the 2 iterations was skipped" in line and "done:" not in p.stdout
    assert not (out / "final").exists() and not (out / "metrics.jsonl").exists()


def test_a_verdict_pools_only_runs_of_the_same_settings(tmp_path):
    from test_report import cory_rows, ppo_rows, write_run
    import numpy as np

    t = np.arange(12)
    for seed in (0, 1, 2):
        write_run(tmp_path, "ppo", seed, ppo_rows(0.1 * t, t), {"learning_rate": 1e-4 if seed < 2 else 3e-5})
        write_run(tmp_path, "cory", seed, cory_rows(0.1 * t, 0.5 * t, 0.1 * t, 0.5 * t))
    p = run("-m", "cory.lab.report", tmp_path)
    assert p.returncode == 0, p.stderr
    report = (tmp_path / "REPORT.md").read_text()
    assert "**not decided** — PPO's runs were made with different settings (learning_rate 0.0001 (seeds 0, 1), " \
           "3e-05 (seed 2))" in report


# ----------------------------------------------------------------------------- a broken task plug-in

def test_sample_returning_another_count_is_one_line(tmp_path):
    path = task_file(tmp_path, [("for i in range(batch_size)]", "for i in range(batch_size - 1)]")])
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", tmp_path / "r", cwd=tmp_path), 1)
    assert "task kind_words: sample(4) returned 3 examples" in line


def test_an_observer_prompt_that_is_not_a_string_is_one_line(tmp_path):
    path = task_file(tmp_path, [('return f"{example.prompt}{pioneer_response}\\nNow say it more kindly:"',
                                 "return None")])
    line = one_line(run(path, "cory", *TINY, "--steps", "1", "--output_dir", tmp_path / "r", cwd=tmp_path), 1)
    assert "task kind_words: observer_prompt() returned a NoneType" in line


def test_prompts_past_the_models_context_are_refused_before_anything_is_written(tmp_path):
    path = task_file(tmp_path, [('prompt=f"Say something about {s}:") for s in picks]',
                                'prompt="Say something about " + " and ".join([s] * 400) + ":") for s in picks]')])
    out = tmp_path / "r"
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", out, cwd=tmp_path), 2)
    assert "task kind_words: a prompt of" in line and "does not fit tiny's context of" in line
    assert not out.exists()


def test_a_state_dict_the_safe_loader_refuses_is_found_before_training(tmp_path):
    path = task_file(tmp_path, [('return {"position": self.position}',
                                 'return {"position": self.position, "when": __import__("datetime").date(2024, 1, 1)}')])
    out = tmp_path / "r"
    line = one_line(run(path, "ppo", *TINY, "--steps", "1", "--output_dir", out, cwd=tmp_path), 2)
    assert "task kind_words: state_dict() holds a datetime.date" in line and "never be resumed" in line
    assert not out.exists()


def test_a_task_file_that_prints_at_import_still_runs_with_the_runner(tmp_path):
    path = task_file(tmp_path, [("KIND = {", 'print("loading kind words")\nKIND = {')])
    from cory.lab.experiments import _parser, plan

    pairs, _ = plan(_parser().parse_args(["--task_file", str(path), "--methods", "ppo", "--seeds", "0",
                                          "--out", str(tmp_path / "exp"), "--set", "model_name=tiny"]))
    assert pairs[0].intended["model_name"] == "tiny"


def test_a_task_file_without_main_is_one_line(tmp_path):
    path = task_file(tmp_path, [('if __name__ == "__main__":', "if False:")])
    line = one_line(runner("--task_file", path, "--methods", "ppo", "--seeds", "0", "--out", tmp_path / "exp"), 2)
    assert "printed no config" in line and "__main__" in line
    assert not (tmp_path / "exp").exists()


def test_a_task_file_with_a_syntax_error_names_its_file_and_line(tmp_path):
    path = task_file(tmp_path, [("class KindWords(TaskBase):", "class KindWords(TaskBase)")])
    line = one_line(runner("--task_file", path, "--methods", "ppo", "--seeds", "0", "--out", tmp_path / "exp"), 2)
    assert f"--task_file: {path} line " in line
    line = one_line(run("-m", "cory.lab.evaluate", "--task_file", path, "--task", "kind_words", "--model", "tiny"), 2)
    assert f"task_file: {path} line " in line
    assert not (tmp_path / "exp").exists()


# ----------------------------------------------------------------------------- smaller

def test_another_methods_run_folder_gets_advice_that_works(finished):
    line = rejected("imdb", "cory", ["--config", "configs/imdb/cory_tiny.yaml", "--output_dir", finished / "ppo"])
    assert "holds a ppo run on imdb; continue it with imdb_train/ppo.py --resume" in line


def test_figures_and_reports_are_written_whole(tmp_path, monkeypatch):
    from cory.lab import figures

    class Broken:
        def savefig(self, path, format=None):
            with open(path, "wb") as f:
                f.write(b"half")
            raise KeyboardInterrupt

    target = tmp_path / "fig.png"
    target.write_bytes(b"old figure")
    with pytest.raises(KeyboardInterrupt):
        figures.save_figure(Broken(), target)
    assert target.read_bytes() == b"old figure" and sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]


def _output_until(proc, marker: str, timeout: float) -> tuple[list[str], threading.Thread]:
    """Collect the process's output in a thread (it ends with the output); return once ``marker`` shows (the
    command is at work, past its imports: a signal during an import can be swallowed by library code, so a fixed
    sleep is flaky on a busy machine) or the timeout passes."""
    chunks: list[str] = []

    def read():
        for chunk in iter(lambda: proc.stdout.read(64), ""):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while marker not in "".join(chunks) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    return chunks, reader


@pytest.mark.parametrize("module,args,marker", [
    ("cory.lab.evaluate", ["--task", "imdb", "--model", "tiny", "--max_new_tokens", "400"], "prompt/s"),
    ("cory.lab.experiments", ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0",
                              "--steps", "50", "--no_eval"], "start"),
])
def test_ctrl_c_exits_130_with_one_line(tmp_path, module, args, marker):
    args = args + (["--out", str(tmp_path / "exp")] if module.endswith("experiments") else
                   ["--json", str(tmp_path / "e.json")])
    # a suite started in the background by a non-interactive shell runs with SIGINT ignored, which children
    # inherit, and Python then installs no KeyboardInterrupt handler: give the command a terminal's default
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    chunks, reader = _output_until(proc, marker, timeout=300)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=600)
    reader.join(timeout=60)  # the last of the output
    err = "".join(chunks)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted" in err.strip().splitlines()[-1]


def test_report_ctrl_c_exits_130(tmp_path, monkeypatch, capsys):
    from cory.lab import report

    def interrupted(path):
        raise KeyboardInterrupt
    monkeypatch.setattr(report, "build_report", interrupted)
    with pytest.raises(SystemExit) as e:
        report.main([str(tmp_path)])
    assert e.value.code == 130 and "interrupted" in capsys.readouterr().err


@pytest.mark.parametrize("text,expected", [
    ("_tiny: &t\n  learning_rate: 1.0e-4\n  batch_size: 4\nlearning_rate: *t\n", None),  # an alias as a value
    ("steps: &n 2\nsave_every: *n\n", {"steps": 2, "save_every": 2}),
    ("defaults: &d {steps: 2}\n<<: *d\nsave_every: 1\n", {"steps": 2, "save_every": 1}),
])
def test_yaml_anchors_aliases_and_merge_keys_are_yaml(tmp_path, text, expected):
    from cory.config import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text(text)
    data = load_yaml(path)
    if expected is not None:
        assert {k: data[k] for k in expected} == expected
    else:
        assert data["learning_rate"] == {"learning_rate": 1e-4, "batch_size": 4}
