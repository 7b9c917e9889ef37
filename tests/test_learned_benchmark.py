"""benchmarks/learned.py: stops the run when the held-out gain shows, reports when, and deletes only its own folder.
A stand-in training script writes the held-out rows, so the harness's logic is tested in seconds."""
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FAKE = textwrap.dedent("""
    import argparse, json, pathlib, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--config"); p.add_argument("--output_dir"); p.add_argument("--rewards")
    a = p.parse_args()
    out = pathlib.Path(a.output_dir); out.mkdir()
    pathlib.Path(a.config).with_name("pid").write_text(str(__import__("os").getpid()))
    for i, r in enumerate(json.loads(a.rewards)):
        with open(out / "eval.jsonl", "a") as f:
            f.write(json.dumps({"iterations": 3 * i, "task_reward": r, "kl": float(i)}) + "\\n")
        time.sleep(0.3)
    time.sleep(60)  # a run that would go on: the harness must stop it
""")


def run(tmp_path, rewards, *extra):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE)
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/learned.py", "--script", str(script), "--config",
                           str(tmp_path / "cfg.yaml"), "--rewards", json.dumps(rewards), "--json", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_stops_at_the_first_evaluation_past_the_gain(tmp_path):
    proc, result = run(tmp_path, [0.1, 0.2, 0.35, 0.45, 0.9])
    assert proc.returncode == 0, proc.stderr
    assert result["base_reward"] == 0.1 and result["learned_at_iteration"] == 9  # 0.45 >= 0.1 + 0.3; 0.35 is not
    assert 0 < result["minutes"] < 1
    assert "--rewards" in result["command"] and result["cpu_flags"] is not None
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert "learned (held-out reward 0.3 above" in proc.stdout


def test_a_run_that_never_gains_is_reported_and_its_folder_removed(tmp_path):
    before = {p.name for p in Path(tempfile.gettempdir()).glob("cory_learned_*")}
    proc, result = run(tmp_path, [0.1, 0.2, 0.3], "--limit_min", "0.05")
    assert proc.returncode == 1 and result["minutes"] is None
    assert "not within 0.05 minutes" in proc.stderr
    assert {p.name for p in Path(tempfile.gettempdir()).glob("cory_learned_*")} == before
