"""Tests never reach the network: the hub is declared offline for every test process."""
import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
GSM8K_DIR = Path(os.environ.get("CORY_GSM8K_DIR", REPO.parent / "shared" / "data" / "gsm8k"))


@pytest.fixture
def repo() -> Path:
    return REPO


def run_script(script: str, *args: str, timeout: int = 900, cwd: Path = REPO):
    """A training script as a user runs it (a fresh process), returning the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)
