"""What the benchmarks write beside every timing: the commit it was taken at and the CPU it ran on."""
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import harness  # noqa: E402


def git(tree, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=tree, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_the_commit_says_dirty_only_when_a_tracked_file_differs(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-qm", "a")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")
    assert harness.git_commit(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("not the benchmark's code\n")
    assert harness.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert harness.git_commit(tmp_path) == head + "+dirty"


def test_outside_a_git_tree_the_commit_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert harness.git_commit(tmp_path) == "?"


def test_the_cpu_info_names_the_vector_flags_and_the_load():
    info = harness.cpu_info()
    assert set(info) == {"model", "cores", "flags", "load"}
    assert all(f.startswith(("avx", "fma", "amx")) for f in info["flags"])
    assert len(info["load"]) == 3 and info["cores"] >= 1

