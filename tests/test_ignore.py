""".gitignore: committed experiment folders keep their metrics, lose their weights.

``git check-ignore --no-index`` judges a path by the ignore rules alone, so the paths need not exist.
"""
import shutil
import subprocess

import pytest

from conftest import REPO

RUN = "results/imdb_cpu/runs/{method}/seed_0/"


def _git_ok() -> bool:
    if shutil.which("git") is None or not (REPO / ".git").exists():  # a worktree's .git is a file
        return False
    p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return p.returncode == 0


pytestmark = pytest.mark.skipif(not _git_ok(), reason="needs git and the repository's .git")


def ignored(path: str) -> bool:
    p = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=REPO, capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr  # 128: a git error, not an answer
    return p.returncode == 0


@pytest.mark.parametrize("path", [
    "runs/demo/metrics.jsonl",                      # the training scripts' default output folder
    "runs/imdb_ppo_cpu/samples.jsonl",
    RUN.format(method="cory") + "checkpoints/step_000010/state.pt",
    RUN.format(method="cory") + "final/llm1/model.safetensors",
    RUN.format(method="ppo") + "final/policy/config.json",
    "results/imdb_cpu/state.pt",
    "results/imdb_cpu/.cory.lock",
    RUN.format(method="cory") + ".cory.lock",
    RUN.format(method="cory") + "tensorboard/events.out.tfevents.1.host",
])
def test_ignored(path):
    assert ignored(path), path


@pytest.mark.parametrize("path", [
    RUN.format(method="ppo") + "metrics.jsonl",
    RUN.format(method="ppo") + "samples.jsonl",
    RUN.format(method="ppo") + "config.yaml",
    RUN.format(method="cory") + "eval_imdb.json",
    "results/gsm8k_cpu/runs/cory_kl0.01/seed_2/metrics.jsonl",
    "results/imdb_cpu/REPORT.md",
    "results/imdb_cpu/runs.json",
])
def test_kept(path):
    assert not ignored(path), path
