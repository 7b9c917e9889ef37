"""benchmarks/run_profile.py: where a finished experiment's runs spent their time, from the folder's own files."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
import run_profile  # noqa: E402


def write_folder(root: Path) -> None:
    runs = {}
    for name, method, wall, row, status in (
            ("ppo/seed_0", "ppo", 100.0, {"time/generate_s": 5.0, "time/step_s": 20.0, "time/iteration_s": 25.0},
             "finished"),
            ("cory/seed_0", "cory", 200.0, {"time/pioneer_generate_s": 4.0, "time/observer_generate_s": 6.0,
                                            "time/pioneer_step_s": 20.0, "time/observer_step_s": 30.0,
                                            "time/swap_s": 0.0, "time/iteration_s": 60.0}, "finished"),
            ("ppo/seed_1", "ppo", 50.0, {"time/generate_s": 1.0, "time/step_s": 1.0, "time/iteration_s": 2.0},
             "failed")):
        d = root / "runs" / name
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, **row}) + "\n" for i in range(2)))
        runs[name] = {"method": method, "status": status,
                      "attempts": [{"exit_status": 1, "wall_time_s": 7.0},
                                   {"exit_status": 0 if status == "finished" else 1, "wall_time_s": wall}]}
    (root / "runs.json").write_text(json.dumps({"runs": runs}))


def test_the_parts_are_the_iterations_timers_and_the_wall_time_outside_them(tmp_path):
    write_folder(tmp_path)
    doc = run_profile.profile(tmp_path)
    assert set(doc["runs"]) == {"ppo/seed_0", "cory/seed_0"}  # the failed run is not a run's cost
    assert doc["runs"]["ppo/seed_0"] == {"method": "ppo", "wall_s": 100.0, "iterations": 2, "generation": 10.0,
                                         "steps": 40.0, "outside iterations": 50.0}
    cory = doc["runs"]["cory/seed_0"]
    assert (cory["generation"], cory["steps"], cory["outside iterations"]) == (20.0, 100.0, 80.0)
    assert doc["methods"]["cory"]["median_share"]["steps"] == pytest.approx(0.5)
    assert doc["methods"]["cory"]["ceiling_if_free"]["steps"] == pytest.approx(2.0)
    assert doc["methods"]["ppo"]["ceiling_if_free"]["outside iterations"] == pytest.approx(2.0)


def test_a_folder_without_runs_json_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH / "run_profile.py"), str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"error: {tmp_path}: no runs.json there; give a folder written by python -m lab.experiments"]


def test_the_json_holds_the_table_and_its_command(tmp_path):
    write_folder(tmp_path / "exp")
    out = tmp_path / "profile.json"
    p = subprocess.run([sys.executable, str(BENCH / "run_profile.py"), str(tmp_path / "exp"), "--json", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "| ppo: the run's speed-up were it free | | 1.11x | 1.67x | 2.00x |" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python benchmarks/run_profile.py ") and len(doc["runs"]) == 2
