"""The collapse test (cory.lab.collapse) on synthetic final evaluations: CORY that stays fluent where PPO
degenerates is "yes" only beyond chance; CORY collapsing as often is "no"; a setting where PPO does not collapse
tests nothing; the exact sign test's arithmetic; the report leads with it when the design says so."""
import json

import numpy as np
import pytest

from cory.lab.collapse import PPO_DID_NOT_COLLAPSE, collapse_test, sign_test_p
from cory.lab.report import build_report
from cory.lab.results import load_experiment
from test_report import cory_rows, ppo_rows, write_run

STEPS, BASE_D2 = 6, 0.94


def write_finals(root, ppo_d2, llm1_d2, llm2_d2):
    """One seed per entry: each final model's held-out distinct-2 (eval.jsonl's last row), the base model's at 0."""
    flat = np.zeros(STEPS)
    for s, (p, a, b) in enumerate(zip(ppo_d2, llm1_d2, llm2_d2)):
        for label, agents, rows in (("ppo", {"policy": p}, ppo_rows(flat, flat)),
                                    ("cory", {"llm1": a, "llm2": b}, cory_rows(flat, flat, flat, flat))):
            d = write_run(root, label, s, rows, heldout=None)
            evals = []
            for agent, d2 in agents.items():
                evals += [{"iterations": 0, "agent": agent, "task_reward": 0.1, "kl": 0.0, "distinct_2": BASE_D2},
                          {"iterations": STEPS, "agent": agent, "task_reward": 0.6, "kl": 20.0, "distinct_2": d2,
                           "samples": [{"query": "This film", "response": " good good good" if d2 < 0.4 else " was fine"}]}]
            (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_sign_test():
    assert sign_test_p(6, 0) == pytest.approx(1 / 64)
    assert sign_test_p(5, 1) == pytest.approx(7 / 64)
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(0, 3) == 1.0


def test_cory_fluent_where_ppo_collapsed_is_yes(tmp_path):
    write_finals(tmp_path, [0.1] * 6, [0.9] * 6, [0.85] * 6)
    v = collapse_test(load_experiment(tmp_path))
    assert v.answer == "yes", v.text
    assert "(collapsed)" in v.text and "good good good" in v.text


def test_one_cory_collapse_in_six_is_not_beyond_chance(tmp_path):
    write_finals(tmp_path, [0.1] * 6, [0.9] * 5 + [0.2], [0.9] * 5 + [0.2])
    assert collapse_test(load_experiment(tmp_path)).answer == "could not tell"


def test_cory_collapsing_as_often_is_no(tmp_path):
    write_finals(tmp_path, [0.1] * 6, [0.2] * 6, [0.1] * 6)
    v = collapse_test(load_experiment(tmp_path))
    assert [a.answer for a in v.agents] == ["no", "no"] and v.answer == "no", v.text


def test_fewer_seeds_than_the_design_shows_the_counts_and_no_test(tmp_path):
    write_finals(tmp_path, [0.1] * 3, [0.9, 0.2, 0.9], [0.9] * 3)
    (tmp_path / "design.yaml").write_text("endpoint: collapse\nmin_seeds: 6\n")
    v = collapse_test(load_experiment(tmp_path))
    assert v.answer == "not decided" and "3 PPO seed(s) with a held-out distinct-2, the design needs 6" in v.text
    assert "- CORY-LLM1: collapsed in 1 of 3 seeds" in v.text and "- CORY-LLM2: collapsed in 0 of 3 seeds" in v.text
    assert "(not judged)" in v.text and "exact p" not in v.text and "good good good" in v.text


def test_ppo_that_did_not_collapse_tests_nothing(tmp_path):
    write_finals(tmp_path, [0.9] * 4 + [0.1] * 2, [0.9] * 6, [0.9] * 6)
    assert collapse_test(load_experiment(tmp_path)).answer == PPO_DID_NOT_COLLAPSE


def test_the_design_chooses_which_test_leads_the_report(tmp_path):
    write_finals(tmp_path, [0.1] * 6, [0.9] * 6, [0.85] * 6)
    (tmp_path / "design.yaml").write_text("endpoint: collapse\ncollapse_share: 0.5\n")
    text = build_report(tmp_path).read_text()
    assert text.index("## The collapse test\n") < text.index("## The claim at matched KL (secondary")
    assert "![held-out distinct-2 along training](fig_heldout_distinct_2.png)" in text  # the test's picture
    assert (tmp_path / "fig_heldout_distinct_2.png").stat().st_size > 0
    (tmp_path / "fig_heldout_distinct_2.png").unlink()
    (tmp_path / "design.yaml").write_text("endpoint: reward_at_matched_kl\n")
    text = build_report(tmp_path).read_text()
    assert text.index("## The claim at matched KL\n") < text.index("## The collapse test (secondary")
    assert "fig_heldout_distinct_2.png" not in text and not (tmp_path / "fig_heldout_distinct_2.png").exists()
