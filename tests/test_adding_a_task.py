"""docs/adding_a_task.md does what it says: its file, saved as written, trains PPO and CORY on a new task."""
import re

import pytest

from conftest import REPO
from cory.outputs import read_jsonl

GUIDE = REPO / "docs" / "adding_a_task.md"


def guide_file() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_guide_stays_short():
    assert len(guide_file().strip().splitlines()) < 70  # task + reward + both scripts
    code = guide_file().split("@dataclass")[0]  # the task itself and its registration
    assert len([ln for ln in code.splitlines() if ln.strip()]) < 50


@pytest.mark.parametrize("method", ["cory", "ppo"])
def test_the_guides_task_trains(tmp_path, method):
    import subprocess
    import sys

    script = tmp_path / "kind_words.py"
    script.write_text(guide_file())
    out = tmp_path / f"kind_{method}"
    # the guide's command, on the tiny model so it takes seconds
    p = subprocess.run([sys.executable, str(script), method, "--steps", "2", "--output_dir", str(out),
                        "--model_name", "tiny", "--batch_size", "4", "--mini_batch_size", "2"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    agents = ["llm1", "llm2"] if method == "cory" else ["policy"]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0.0 <= r[f"{a}/task_reward"] <= 1.0 for r in rows for a in agents)
    samples = read_jsonl(out / "samples.jsonl")
    if method == "cory":
        assert samples[0]["observer_prompt"].endswith("Now say it more kindly:")
    help_text = subprocess.run([sys.executable, str(script), method, "--help"], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120).stdout
    assert "--task" in help_text and "kind_words" in help_text
