"""The objective task's secondary readings along the held-out paths (lab.paths): the fall from the peak on
hand-written paths, the tables at matched iterations on synthetic runs, and where the report shows them."""
import json

import numpy as np
import pytest

from lab.matched_kl import HeldoutPath
from lab.paths import along_paths, fall_at
from lab.report import build_report
from lab.results import load_experiment
from test_report import cory_rows, ppo_rows, write_run

ITS = [0, 3, 6, 9, 12]
KL = [0.0, 1.0, 2.0, 3.0, 4.0]
RISING = [0.2, 0.3, 0.4, 0.5, 0.6]
PEAKED = [0.2, 0.35, 0.45, 0.3, 0.25]  # learned, then lost it


def path(kl, values):
    return HeldoutPath(np.arange(len(kl)) * 3, np.array(kl, dtype=float), np.array(values, dtype=float))


def test_the_fall_from_the_peak():
    p = path([0, 1, 2, 3], [0.2, 0.5, 0.3, 0.4])
    assert fall_at(p) == pytest.approx(0.1)           # best 0.5, last 0.4
    assert fall_at(p, 1.0) == pytest.approx(0.0)      # at its best there
    assert fall_at(p, 2.0) == pytest.approx(0.2)
    assert fall_at(p, 1.5) == pytest.approx(0.1)      # interpolated 0.4 against the 0.5 before it
    assert fall_at(p, 4.0) is None                    # never reached
    assert fall_at(path([0, 1, 2], [0.2, 0.3, 0.4])) == 0.0
    # KL that falls back: the value where the path *first* reaches 2.5, against every evaluation before it
    assert fall_at(path([0, 2, 1, 3], [0.2, 0.6, 0.1, 0.3]), 2.5) == pytest.approx(0.6 - 0.25)


def write_paths(root, seeds=3, greedy=True):
    flat = np.zeros(12)
    for s in range(seeds):
        for label, agents, rows in (("ppo", {"policy": RISING}, ppo_rows(flat, flat)),
                                    ("cory", {"llm1": PEAKED, "llm2": RISING}, cory_rows(flat, flat, flat, flat))):
            d = write_run(root, label, s, rows, heldout=None)
            (root / "design.yaml").write_text("kl_grid: [1, 2, 3]\nmargin: 0.05\n")
            evals = [{"iterations": it, "agent": agent, "task_reward": v + 0.01 * s, "kl": k,
                      **({"greedy_reward": v + 0.1} if greedy else {})}
                     for agent, values in agents.items() for it, k, v in zip(ITS, KL, values)]
            (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def row(text, *start):
    """The first table row whose first cells are ``start``."""
    return next(ln for ln in text.splitlines() if ln.startswith("| " + " | ".join(start) + " |"))


def test_the_tables_at_matched_iterations_and_the_fall(tmp_path):
    write_paths(tmp_path)
    text = along_paths(load_experiment(tmp_path))
    assert row(text, "PPO", "accuracy (sampled)").endswith("| 0.61 ± 0.00577 |")  # 0.6, 0.61, 0.62
    assert row(text, "CORY-LLM1", "greedy accuracy").endswith("| 0.35 ± 0 |")
    assert row(text, "CORY-LLM2", "held-out KL").endswith("| 4 ± 0 |")
    # paired by seed: the seeds' offsets cancel
    assert row(text, "CORY-LLM1 − PPO", "accuracy (sampled)").endswith("| -0.35 ± 0, p 0 |")
    assert row(text, "CORY-LLM2 − PPO", "accuracy (sampled)").endswith("| +0 ± 0, p 1 |")
    # LLM1 fell 0.45 -> 0.25 by the end and 0.15 by KL 3; PPO and LLM2 never fell
    assert row(text, "CORY-LLM1", "3") == "| CORY-LLM1 | 3 | 0.2 ± 0 | 0 ± 0 | 0 ± 0 | 0.15 ± 0 | 3 of 3 |"
    assert row(text, "PPO", "3") == "| PPO | 3 | 0 ± 0 | 0 ± 0 | 0 ± 0 | 0 ± 0 | 0 of 3 |"
    fall = text.split("Each CORY agent's fall minus PPO's")[1]
    assert row(fall, "CORY-LLM1 − PPO") == ("| CORY-LLM1 − PPO | +0.2 ± 0, p 0 | +0 ± 0, p 1 | +0 ± 0, p 1 "
                                            "| +0.15 ± 0, p 0 |")


def test_the_report_shows_them_only_where_greedy_accuracy_is_recorded(tmp_path):
    write_paths(tmp_path / "objective")
    assert "## Along the held-out paths" in build_report(tmp_path / "objective").read_text()
    write_paths(tmp_path / "vader", greedy=False)
    assert along_paths(load_experiment(tmp_path / "vader")) is None
    assert "## Along the held-out paths" not in build_report(tmp_path / "vader").read_text()


def test_each_runs_path_is_a_row_with_its_transfer_where_read(tmp_path):
    write_paths(tmp_path, seeds=2)
    run = tmp_path / "runs" / "cory" / "seed_1" / "eval.jsonl"
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    for r in rows:
        if r["agent"] == "llm2" and r["iterations"] == 6:
            r.update({"transfer/copy_rate": 0.9, "transfer/correction_rate": None})
    rows = [r for r in rows if not (r["agent"] == "llm1" and r["iterations"] == 12)]  # an evaluation it lacks
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = along_paths(load_experiment(tmp_path)).split("**Each run's path**")[1]
    assert row(table, "PPO, seed 1") == ("| PPO, seed 1 | 0.21 / 0.3, 0 | 0.31 / 0.4, 1 | 0.41 / 0.5, 2 "
                                         "| 0.51 / 0.6, 3 | 0.61 / 0.7, 4 |")
    assert row(table, "CORY-LLM2, seed 1").split(" | ")[3] == "0.41 / 0.5, 2 [0.9, n/a]"  # iteration 6
    assert row(table, "CORY-LLM1, seed 1").endswith("| 0.31 / 0.4, 3 | – |")  # PEAKED, seed 1: +0.01
    assert [ln.split(" | ")[0] for ln in table.splitlines() if ln.startswith("| CORY")] == [
        "| CORY-LLM1, seed 0", "| CORY-LLM1, seed 1", "| CORY-LLM2, seed 0", "| CORY-LLM2, seed 1"]
