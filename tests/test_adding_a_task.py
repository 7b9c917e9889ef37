"""docs/adding_a_task.md does what it says: its file, saved as written, trains PPO and CORY on a new task, the
trained models evaluate, and the experiment runner runs the comparison on it."""
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO
from cory.outputs import read_jsonl

GUIDE = REPO / "docs" / "adding_a_task.md"
# the guide's commands, on the tiny model so each takes seconds
TINY = ["--model_name", "tiny", "--batch_size", "4", "--mini_batch_size", "2"]


def guide_file() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def guide_commands() -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S))


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "kind_words.py").write_text(guide_file())
    return folder / "kind_words.py"


def run(*args, cwd):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=900)


def test_the_guide_stays_short():
    assert len(guide_file().strip().splitlines()) < 70  # task + reward + both scripts
    code = guide_file().split("@dataclass")[0]  # the task itself and its registration
    assert len([ln for ln in code.splitlines() if ln.strip()]) < 50


def test_the_guide_shows_training_evaluation_and_the_runner():
    commands = guide_commands()
    assert "python kind_words.py cory" in commands and "python kind_words.py ppo" in commands
    assert "python -m lab.evaluate --task_file kind_words.py --task kind_words" in commands
    assert "python -m lab.experiments --task_file kind_words.py" in commands


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cory", "ppo"])
def test_the_guides_task_trains_and_evaluates(task_file, method):
    out = task_file.parent / f"kind_{method}"
    p = run(task_file, method, "--steps", "2", "--output_dir", out, *TINY, cwd=task_file.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    agents = ["llm1", "llm2"] if method == "cory" else ["policy"]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0.0 <= r[f"{a}/task_reward"] <= 1.0 for r in rows for a in agents)
    samples = read_jsonl(out / "samples.jsonl")
    if method == "cory":
        assert samples[0]["observer_prompt"].endswith("Now say it more kindly:")
    help_text = run(task_file, method, "--help", cwd=task_file.parent).stdout
    assert "--task" in help_text and "kind_words" in help_text

    # the guide's evaluation command: every final model of the run next to the base, on the held-out subjects
    p = run("-m", "lab.evaluate", "--task_file", task_file.name, "--task", "kind_words", "--model", out,
            "--max_new_tokens", "4", cwd=task_file.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads((out / "eval_kind_words.json").read_text())
    assert [r["name"] for r in doc["results"]] == ["base"] + [f"kind_{method}/{a}" for a in agents]
    assert doc["settings"]["reward"] == "kind_share"
    for r in doc["results"]:
        assert r["n_prompts"] == 3 and 0.0 <= r["task_reward"] <= 1.0 and r["kl"] >= -1e-6
        assert {s["query"] for s in r["samples"]} <= {"the library", "my sister", "this song"}


# a task file that writes beside itself, relative to where it runs, each time it is imported
NOTED = 'import os\nwith open("imported.txt", "a") as _f:\n    _f.write(f"{os.getpid()}\\n")\n'


@pytest.mark.slow
def test_the_guides_task_runs_in_the_experiment_runner(task_file, tmp_path):
    out = tmp_path / "exp"
    user = tmp_path / "user"  # the folder the user runs the runner in: the task file's relative paths are there
    user.mkdir()
    (user / task_file.name).write_text(NOTED + task_file.read_text())
    sets = [f for k, v in zip(TINY[::2], TINY[1::2]) for f in ("--set", f"{k[2:]}={v}")]
    p = run("-m", "lab.experiments", "--task_file", task_file.name, "--methods", "ppo,cory", "--seeds", "0",
            "--steps", "2", "--out", out, *sets, cwd=user)
    assert p.returncode == 0, p.stderr[-3000:]
    pids = (user / "imported.txt").read_text().split()
    assert len(pids) >= 4 and len(set(pids)) == len(pids)  # both configs and both runs; once in each process
    assert not (REPO / "imported.txt").exists()
    record = json.loads((out / "runs.json").read_text())
    assert record["task"] == "kind_words"
    assert all(r["status"] == "finished" for r in record["runs"].values()) and len(record["runs"]) == 2
    assert record["runs"]["cory/seed_0"]["attempts"][0]["command"].split()[2] == "cory"  # python FILE cory ...
    for key in ("ppo/seed_0", "cory/seed_0"):
        assert [r["step"] for r in read_jsonl(out / "runs" / key / "metrics.jsonl")] == [0, 1]
    assert "kind_words" in (out / "REPORT.md").read_text().lower()


def test_eval_args_the_runner_would_not_use_are_refused_before_any_run(task_file, tmp_path):
    out = tmp_path / "exp"
    p = run("-m", "lab.experiments", "--task_file", task_file.name, "--methods", "ppo", "--seeds", "0",
            "--steps", "1", "--out", out, "--eval_args", "--limit 0", *[f for k, v in zip(TINY[::2], TINY[1::2])
                                                                       for f in ("--set", f"{k[2:]}={v}")],
            cwd=task_file.parent)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert lines[0] == ("error: --eval_args '--limit 0': the runner will not evaluate these runs (task kind_words is "
                        "not registered in the runner's process), so nothing would take them; leave --eval_args out "
                        "and evaluate the finished runs with python -m lab.evaluate")
    assert not out.exists()
