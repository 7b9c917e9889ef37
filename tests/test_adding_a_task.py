"""docs/adding_a_task.md does what it says: each of its two files (a reward in Python; a 0/1 reward), saved as
written, trains PPO and CORY on a new task, the trained models evaluate, and the experiment runner runs the comparison
on it; the 0/1 task's transfer check runs too."""
import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from cory.run.outputs import read_jsonl

GUIDE = REPO / "docs" / "adding_a_task.md"
# the guide's commands, on the tiny model so each takes seconds
TINY = ["--model_name", "tiny", "--batch_size", "4", "--mini_batch_size", "2"]


def guide_files() -> dict[str, str]:
    """The guide's task files, by the name of the task each one's class has (``name = "..."``)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    names = [re.search(r'^    name = "(\w+)"$', b, flags=re.M) for b in blocks]
    assert len(blocks) == 2 and all(names), "the guide holds two task files"
    return {m.group(1): b for m, b in zip(names, blocks) if m is not None}


def guide_file(name: str = "kind_words") -> str:
    return guide_files()[name]


def guide_commands() -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S))


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "kind_words.py").write_text(guide_file())
    return folder / "kind_words.py"


@pytest.fixture(scope="module")
def words_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "word_count.py").write_text(guide_file("word_count"))
    return folder / "word_count.py"


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
@pytest.mark.parametrize("name, file", [("kind_words", "task_file"), ("word_count", "words_file")])
def test_the_guides_task_runs_in_the_experiment_runner(name, file, request, tmp_path):
    task_file = request.getfixturevalue(file)
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
    assert record["task"] == name
    assert all(r["status"] == "finished" for r in record["runs"].values()) and len(record["runs"]) == 2
    assert record["runs"]["cory/seed_0"]["attempts"][0]["command"].split()[2] == "cory"  # python FILE cory ...
    for key in ("ppo/seed_0", "cory/seed_0"):
        assert [r["step"] for r in read_jsonl(out / "runs" / key / "metrics.jsonl")] == [0, 1]
    assert name in (out / "REPORT.md").read_text().lower()


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


# ----------------------------------------------------------------------------- the second file: a 0/1 reward


def test_the_zero_one_guide_stays_short_and_shows_its_settings_and_commands():
    code = guide_file("word_count")
    assert len(code.strip().splitlines()) < 85
    assert len([ln for ln in code.split("@dataclass")[0].splitlines() if ln.strip()]) < 60
    assert "    zero_one_reward = True" in code and 'value_head_init: str = "zero"' in code
    commands = guide_commands()
    for needed in ("python word_count.py ppo ", "python word_count.py cory ",
                   "python word_count.py cory --steps 30 --advantage_estimator grpo --num_generations 4",
                   "python -m lab.evaluate --task_file word_count.py --task word_count --model runs/words_cory",
                   "python -m lab.experiments --task_file word_count.py --methods ppo,cory",
                   "--set advantage_estimator=grpo --set num_generations=4",
                   "python -m lab.transfer_check --task_file word_count.py --task word_count"):
        assert needed in commands, needed


def test_the_zero_one_guides_task_scores_zero_or_one_and_checks_transfer(words_file):
    from lab.transfer_check import main as transfer_check
    from cory.tasks import registered

    doc = transfer_check(["--task_file", str(words_file), "--task", "word_count", "--model", "tiny", "--n", "4",
                          "--batch_size", "4", "--max_new_tokens", "4"])
    assert doc["task"] == "word_count" and doc["reward"] == "exact_count" and doc["n"] == 4
    for reading in doc["observer"].values():
        assert reading["copy_n"] + reading["correction_n"] == 4
    assert doc["example_observer_prompt"].endswith(" words:") and "\nAgain, in exactly " in doc["example_observer_prompt"]
    # the reward reads the first line that holds anything, a prefix of the answer, and is 1 or 0
    task = registered()["word_count"].make(None, None, 0)
    examples = [task.ask("the sea", 3)] * 3
    answers = [task.clean_response(a) for a in ["\n Calm blue water.\nDescribe", " Calm water", " Calm, blue  water"]]
    assert answers[0] == "\n Calm blue water." and task.score(examples, answers) == [1.0, 0.0, 1.0]
    held_out = {ex.query for ex in task.eval_examples()}
    assert held_out.isdisjoint(ex.query for ex in task.sample(64))


@pytest.mark.slow
def test_the_zero_one_guides_task_trains_with_either_learner_and_evaluates(words_file):
    folder = words_file.parent
    runs = {"ppo": (folder / "words_ppo", []),  # GAE with the zero value head, as the file says
            "cory": (folder / "words_cory_grpo", ["--advantage_estimator", "grpo", "--num_generations", "4"])}
    for method, (out, learner) in runs.items():
        p = run(words_file, method, "--steps", "2", "--output_dir", out, *learner, *TINY, cwd=folder)
        assert p.returncode == 0, p.stderr[-2000:]
        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1]
        agents = ["llm1", "llm2"] if method == "cory" else ["policy"]
        assert all(on_grid(r[f"{a}/task_reward"], 4) for r in rows for a in agents)  # 4 answers, each 0 or 1
    ppo_config = yaml.safe_load((runs["ppo"][0] / "config.yaml").read_text())
    cory_config = yaml.safe_load((runs["cory"][0] / "config.yaml").read_text())
    assert ppo_config["value_head_init"] == "zero" and ppo_config["advantage_estimator"] == "gae"
    assert (cory_config["advantage_estimator"], cory_config["num_generations"]) == ("grpo", 4)
    for r in read_jsonl(runs["cory"][0] / "metrics.jsonl"):  # a 0/1 reward: the rates are read (one is defined)
        assert r["transfer/copy_rate"] is not None or r["transfer/correction_rate"] is not None

    # the guide's evaluation command, on both runs: every final model next to the base, sampled and greedy
    p = run("-m", "lab.evaluate", "--task_file", words_file.name, "--task", "word_count", "--model", "words_cory_grpo",
            "--model", "words_ppo", "--max_new_tokens", "4", "--json", "eval.json", cwd=folder)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads((folder / "eval.json").read_text())
    assert [r["name"] for r in doc["results"]] == ["base", "words_cory_grpo/llm1", "words_cory_grpo/llm2",
                                                  "words_ppo/policy"]
    for r in doc["results"]:
        assert r["n_prompts"] == 12 and on_grid(r["task_reward"], 12) and on_grid(r["greedy_reward"], 12)


def on_grid(mean: float, n: int) -> bool:
    """Whether ``mean`` is a mean of ``n`` rewards of 0 or 1."""
    return 0.0 <= mean <= 1.0 and abs(mean * n - round(mean * n)) < 1e-6
