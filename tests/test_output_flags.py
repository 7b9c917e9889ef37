"""Output flags never destroy: a --json path holding a file the tool did not write (a user's) is refused in one line
before any work, and left as it was; --force replaces it; a file the tool wrote before is replaced (hardening
round 5)."""
import json
import subprocess
import sys
import pytest

from conftest import REPO


def _run(*args, cwd):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_evaluate_refuses_a_users_file_and_replaces_its_own(tmp_path):
    mine = tmp_path / "results.json"
    mine.write_text("my own notes, not an evaluation\n")
    args = ["-m", "lab.evaluate", "--task", "imdb", "--model", "tiny", "--limit", "2", "--max_new_tokens", "2"]
    p = _run(*args, "--json", mine, cwd=REPO)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "already exists and was not written by python -m lab.evaluate" in p.stderr and "--force" in p.stderr
    assert mine.read_text() == "my own notes, not an evaluation\n"
    p = _run(*args, "--json", mine, "--force", cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    first = json.loads(mine.read_text())
    assert first["command"].startswith("python -m lab.evaluate")
    p = _run(*args, "--json", mine, "--seed", "1", cwd=REPO)  # its own file: replaced without --force
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(mine.read_text())["settings"]["seed"] == 1


def test_the_iteration_benchmark_refuses_a_users_file_before_any_work(tmp_path):
    mine = tmp_path / "results.json"
    mine.write_text('{"mine": true}\n')
    p = _run(REPO / "benchmarks" / "iteration.py", "--preset", "tiny", "--batch_size", "4", "--variants", "ppo",
             "--json", mine, cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "already exists and was not written by python benchmarks/iteration.py" in p.stderr
    assert mine.read_text() == '{"mine": true}\n'


@pytest.mark.slow
def test_evaluate_writes_into_a_run_folder_only_that_runs_own_evaluation(finished, tmp_path):
    """A run folder holds what its run writes and the evaluation of its own models under its own name (the default,
    and what the runner passes); any other --json inside it, or another model's evaluation under that name, is
    refused in one line before any work."""
    from entry_points import tree

    run = tmp_path / "ppo"
    import shutil

    shutil.copytree(finished / "ppo", run)
    before = tree(run)
    base = ["-m", "lab.evaluate", "--task", "imdb", "--limit", "2", "--max_new_tokens", "2"]
    for model, target in ((run, run / "notes.json"), (run, run / "final" / "eval_imdb.json"),
                          ("tiny", run / "eval_imdb.json")):
        p = _run(*base, "--model", model, "--json", target, cwd=REPO)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
        assert f"--json {target}: is inside the run folder {run}" in lines[0], lines
    assert tree(run) == before
    p = _run(*base, "--model", run, "--no_base", "--json", run / "eval_imdb.json", cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((run / "eval_imdb.json").read_text())["results"][0]["name"] == "ppo/policy"
