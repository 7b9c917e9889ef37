"""The collapse test (lab.collapse) on synthetic final evaluations: CORY that stays fluent where PPO
degenerates is "yes" only beyond chance; CORY collapsing as often is "no"; a setting where PPO does not collapse
tests nothing; the exact sign test's arithmetic; the report leads with it when the design says so."""
import json

import numpy as np
import pytest

from lab.collapse import PPO_DID_NOT_COLLAPSE, RULE, at_matched_kl, collapse_test, sign_test_p
from lab.report import build_report
from lab.results import load_experiment
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


# ----------------------------------------------------------------------------- at matched held-out KL (descriptive)

ITERATIONS, EVERY = 30, 3


def write_d2_paths(root, seeds, ppo, llm1, llm2, base_logprob=False, rng=0):
    """Runs whose eval.jsonl holds held-out paths: per agent (KL rate per iteration, distinct-2 lost per nat), KL
    grows with the iterations and distinct-2 falls along a line from the base model's (a little noise per point);
    ``base_logprob`` also records the base model's log-likelihood of the answers, falling along its own line."""
    g = np.random.default_rng(rng)
    flat = np.zeros(ITERATIONS)
    for s in seeds:
        for label, agents, rows in (("ppo", {"policy": ppo}, ppo_rows(flat, flat)),
                                    ("cory", {"llm1": llm1, "llm2": llm2}, cory_rows(flat, flat, flat, flat))):
            d = write_run(root, label, s, rows, heldout=None)
            evals = []
            for agent, (rate, slope) in agents.items():
                for it in range(0, ITERATIONS + 1, EVERY):
                    kl = rate * it * (1 + g.normal(0, 0.03)) if it else 0.0
                    row = {"iterations": it, "agent": agent, "task_reward": 0.1 + 0.01 * kl, "kl": kl,
                           "distinct_2": BASE_D2 - slope * kl + (g.normal(0, 0.005) if it else 0.0)}
                    if base_logprob:
                        row["base_logprob"] = -2.0 - 0.05 * kl + (g.normal(0, 0.01) if it else 0.0)
                    evals.append(row)
            (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_a_slower_walk_along_ppos_path_reads_nothing_at_matched_kl_and_much_at_the_end(tmp_path):
    # CORY's agents walk PPO's own (KL, distinct-2) line at half and two fifths of its KL rate: at the last iteration
    # they are far less collapsed, at the same held-out KL they are not
    write_d2_paths(tmp_path, range(6), ppo=(2.0, 0.015), llm1=(1.0, 0.015), llm2=(0.8, 0.015))
    reading = at_matched_kl(load_experiment(tmp_path))
    points = [p for p in reading.points if p.key == "distinct_2"]
    assert {p.agent for p in points} == {"CORY-LLM1", "CORY-LLM2"}
    llm1 = {p.kl: p for p in points if p.agent == "CORY-LLM1"}
    assert {2, 4, 6, 8, 10, 12, 20} <= set(llm1) and 40 not in llm1  # CORY's KL ends near 30, PPO's near 60
    assert llm1[20].seeds == list(range(6))
    for p in points:
        assert abs(np.mean(p.matched)) < 0.01, p
        assert np.mean(p.last) > 0.3, p  # 0.015 × (60 − 30 or 24) nats more distinct-2 at the end
    assert reading.not_recorded == ["base_logprob"]
    assert "| CORY-LLM1 | 10 | 6 | " in reading.text


def test_a_cory_that_keeps_its_diversity_at_the_same_kl_reads_higher(tmp_path):
    write_d2_paths(tmp_path, range(6), ppo=(2.0, 0.015), llm1=(1.0, 0.005), llm2=(1.0, 0.015))
    points = {(p.agent, p.kl): p for p in at_matched_kl(load_experiment(tmp_path)).points}
    assert np.mean(points["CORY-LLM1", 20.0].matched) == pytest.approx(0.01 * 20, abs=0.02)
    assert abs(np.mean(points["CORY-LLM2", 20.0].matched)) < 0.01


def test_the_report_reads_collapse_at_matched_kl_beside_the_test_and_says_what_was_not_recorded(tmp_path):
    write_d2_paths(tmp_path, range(6), ppo=(2.0, 0.015), llm1=(1.0, 0.015), llm2=(0.8, 0.015))
    (tmp_path / "design.yaml").write_text("endpoint: collapse\n")
    text = build_report(tmp_path).read_text()
    section = text.split("### Collapse at matched held-out KL (descriptive)\n")[1].split("\n## ")[0]
    assert text.index("## The collapse test\n") < text.index("### Collapse at matched held-out KL") \
        < text.index("## The claim at matched KL (secondary")
    assert "_Descriptive, not a pre-registered test_" in section
    assert "**Held-out distinct-2**" in section
    assert ("The base model's mean per-token log-likelihood of the answers (`base_logprob`) was not recorded for these "
            "runs") in section
    assert "parseable_share`) was not recorded" not in section  # a task that does not parse is not told so
    # recorded, it is read like distinct-2 and the sentence goes
    write_d2_paths(tmp_path, range(6), ppo=(2.0, 0.015), llm1=(1.0, 0.015), llm2=(0.8, 0.015), base_logprob=True)
    reading = at_matched_kl(load_experiment(tmp_path))
    assert reading.not_recorded == [] and "was not recorded" not in reading.text
    logprob = [p for p in reading.points if p.key == "base_logprob"]
    assert logprob and all(abs(np.mean(p.matched)) < 0.02 for p in logprob)
    assert all(np.mean(p.last) > 0.9 for p in logprob)  # 0.05 × 24-30 nats likelier at the end


def test_no_reading_without_held_out_paths_of_both(tmp_path):
    write_d2_paths(tmp_path, range(3), ppo=(2.0, 0.015), llm1=(1.0, 0.015), llm2=(0.8, 0.015))
    for p in (tmp_path / "runs" / "cory").glob("seed_*/eval.jsonl"):
        p.unlink()
    assert at_matched_kl(load_experiment(tmp_path)) is None
    assert "Collapse at matched held-out KL" not in build_report(tmp_path).read_text()


def _one_word(root, base_d2, finals):
    """``finals``: per seed, PPO's and the two CORY agents' final held-out distinct-2 (None: undefined, the answers
    of a one-word task); ``base_d2`` the base model's."""
    flat = np.zeros(STEPS)
    for s, (p, a, b) in enumerate(finals):
        for label, agents, rows in (("ppo", {"policy": p}, ppo_rows(flat, flat)),
                                    ("cory", {"llm1": a, "llm2": b}, cory_rows(flat, flat, flat, flat))):
            d = write_run(root, label, s, rows, heldout=None)
            evals = []
            for agent, d2 in agents.items():
                evals += [{"iterations": 0, "agent": agent, "task_reward": 0.1, "kl": 0.0, "distinct_2": base_d2},
                          {"iterations": STEPS, "agent": agent, "task_reward": 0.6, "kl": 20.0, "distinct_2": d2,
                           "samples": [{"query": "Count the words: a b c.", "response": " 3"}]}]
            (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_a_one_word_task_is_not_called_collapsed(tmp_path):
    """distinct-2 of one-word answers is undefined (null), not 0: the base model's undefined, nothing is tested
    and no model is called collapsed, in the test, its descriptive reading and the report."""
    _one_word(tmp_path, None, [(None, None, None)] * 6)
    (tmp_path / "design.yaml").write_text("endpoint: collapse\n")
    v = collapse_test(load_experiment(tmp_path))
    assert v.answer == "not decided" and "distinct-2 is undefined here" in v.text
    assert "no model is called collapsed or not" in v.text
    text = build_report(tmp_path).read_text()
    section = text.split("## The collapse test\n")[1].split("\n## ")[0].replace(RULE, "")  # the rule names both
    assert "(collapsed)" not in section and "collapsed in" not in section, section
    assert "Held-out distinct-2 is undefined along these paths" in section
    assert "distinct-2 was not recorded" not in section


def test_a_final_model_with_undefined_distinct_2_is_not_judged(tmp_path):
    """The base model wrote sentences; the final models of seeds 0 and 1 answer in one word: they are named, and
    counted neither collapsed nor not (before, their distinct-2 of 0 read as collapsed)."""
    _one_word(tmp_path, BASE_D2, [(None, None, 0.9), (None, 0.9, 0.9)] + [(0.1, 0.9, 0.9)] * 4)
    v = collapse_test(load_experiment(tmp_path))
    assert "- PPO: collapsed in 4 of 4 seeds (distinct-2 undefined for seeds 0, 1: no held-out answer of two words " \
           "or more, so not judged); final held-out distinct-2 0.1 ± 0" in v.text, v.text
    assert "- CORY-LLM1: collapsed in 0 of 4 seeds (distinct-2 undefined for seed 0: no held-out answer" in v.text
    assert "- CORY-LLM2: collapsed in 0 of 4 seeds; final" in v.text
