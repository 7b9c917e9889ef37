"""The claim at matched KL (lab.matched_kl) on synthetic held-out paths: a CORY that only learns slower along
PPO's own reward-vs-KL line is never "yes"; a line twice as steep is "yes"; a much flatter one is "no"; and the
interpolation, the design file and the learning checks that come first."""
import json
import shutil

import numpy as np
import pytest

from lab.errors import ReportError
from lab.design import Design, load_design
from lab.matched_kl import (CORY_DID_NOT_LEARN, PPO_DID_NOT_LEARN, HeldoutPath, heldout_path,
                                 matched_kl, normaliser_alone, reward_at, value_at)
from lab.report import build_report
from lab.results import load_experiment
from test_report import cory_rows, ppo_rows, write_run

STEPS, EVERY, BASE = 30, 3, 0.1


def line(slope, kl_rate, rng, noise=0.02):
    """A held-out path: KL grows by ``kl_rate`` nats per iteration, reward = base + slope * KL + noise."""
    its = np.arange(0, STEPS + 1, EVERY)
    kl = kl_rate * its * (1 + rng.normal(0, 0.03, len(its)))
    reward = BASE + slope * kl + rng.normal(0, noise, len(its))
    kl[0], reward[0] = 0.0, BASE
    return its, kl, reward


def write_paths(root, seeds, ppo, llm1, llm2, rng=0):
    """Runs whose eval.jsonl holds the given paths ((slope, KL rate) each); training rows are flat filler."""
    g = np.random.default_rng(rng)
    flat = np.zeros(STEPS)
    for s in seeds:
        for label, agents, rows in (("ppo", {"policy": ppo}, ppo_rows(flat, flat)),
                                    ("cory", {"llm1": llm1, "llm2": llm2}, cory_rows(flat, flat, flat, flat))):
            d = write_run(root, label, s, rows, heldout=None)
            evals = []
            for agent, (slope, rate) in agents.items():
                for it, k, r in zip(*line(slope, rate, g)):
                    evals.append({"iterations": int(it), "agent": agent, "task_reward": float(r), "kl": float(k),
                                  "reward_sd": 0.37, "n_prompts": 110})
            (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_only_slower_on_ppos_own_line_is_never_yes(tmp_path):
    # CORY moves along PPO's reward-vs-KL line at half the speed: lower KL at lower reward, the same trade-off
    write_paths(tmp_path, range(8), ppo=(0.05, 1.0), llm1=(0.05, 0.5), llm2=(0.05, 0.4))
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer != "yes", v.text
    assert v.answer == "no", v.text  # its reward is shown not to exceed PPO's by the margin
    assert all(abs(r.diff.mean) < 0.03 for r in v.agents)


@pytest.mark.parametrize("seeds", [range(8), range(3)])
def test_a_line_twice_as_steep_is_yes(tmp_path, seeds):
    write_paths(tmp_path, seeds, ppo=(0.05, 1.0), llm1=(0.10, 0.5), llm2=(0.10, 0.4))
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "yes", v.text
    assert all(r.answer == "yes" for r in v.agents)


def test_a_much_flatter_line_is_no(tmp_path):
    write_paths(tmp_path, range(8), ppo=(0.05, 1.0), llm1=(0.01, 1.0), llm2=(0.015, 1.0))
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "no" and "shown lower" in v.text, v.text


def test_noise_with_few_seeds_could_not_tell(tmp_path):
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.06, 0.5), llm2=(0.06, 0.5))
    for s in range(3):  # a large spread of one seed's endpoint
        p = tmp_path / "runs" / "cory" / f"seed_{s}" / "eval.jsonl"
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        for r in rows:
            if r["iterations"]:
                r["task_reward"] += (0.3, -0.25, 0.2)[s]
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "could not tell", v.text


def test_ppo_that_did_not_learn_tests_nothing(tmp_path):
    write_paths(tmp_path, range(4), ppo=(0.0, 1.0), llm1=(0.10, 0.5), llm2=(0.10, 0.5))
    assert matched_kl(load_experiment(tmp_path)).answer == PPO_DID_NOT_LEARN


def test_cory_that_did_not_learn_is_named(tmp_path):
    write_paths(tmp_path, range(4), ppo=(0.05, 1.0), llm1=(0.0, 0.5), llm2=(0.0, 0.5))
    assert matched_kl(load_experiment(tmp_path)).answer == CORY_DID_NOT_LEARN


def test_an_agent_that_did_not_learn_is_left_out_with_its_numbers(tmp_path):
    """The folder is judged on the agents that learned; the one that did not says why, in numbers."""
    write_paths(tmp_path, range(4), ppo=(0.05, 1.0), llm1=(0.01, 1.0), llm2=(0.0, 0.5))
    v = matched_kl(load_experiment(tmp_path))
    llm1, llm2 = v.agents
    assert llm1.learned and llm1.answer == "no" and v.answer == "no", v.text
    line = llm2.line()
    assert llm2.learned is False and "CORY-LLM2 did not learn: not tested (its held-out reward against the base " \
        "model's" in line and "(std over 4 seeds); one-sided p" in line, line


def collapse_after(root, label, agents, after_iteration=15, to=0.0):
    """PPO (or an agent) learned along its path, then its reward fell to ``to`` past the grid (KL still rising)."""
    for p in (root / "runs" / label).glob("seed_*/eval.jsonl"):
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        for r in rows:
            if r["agent"] in agents and r["iterations"] > after_iteration:
                r["task_reward"], r["kl"] = to, r["kl"] + 10.0
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_ppo_that_learned_then_collapsed_is_read_at_the_grid_where_the_design_says_so(tmp_path):
    """At the paper's batch on a GPU, PPO's held-out reward rose to 0.77 at KL 18 and fell below the base model's
    by iteration 100: its final models say "did not learn", its path at the KL grid says it learned."""
    write_paths(tmp_path, range(4), ppo=(0.05, 0.4), llm1=(0.05, 0.3), llm2=(0.05, 0.3))
    collapse_after(tmp_path, "ppo", {"policy"})
    assert matched_kl(load_experiment(tmp_path)).answer == PPO_DID_NOT_LEARN  # the default: the final models
    (tmp_path / "design.yaml").write_text("learned_at: kl_grid\n")
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "no", v.text  # the same line: read at matched KL, not refused
    assert "largest KL-grid point" in v.text and "learning read along the path at the KL grid" in v.text
    # a PPO that never rose along its path did not learn, whatever the design reads
    write_paths(tmp_path, range(4), ppo=(0.0, 0.4), llm1=(0.05, 0.3), llm2=(0.05, 0.3))
    assert matched_kl(load_experiment(tmp_path)).answer == PPO_DID_NOT_LEARN
    # a CORY agent is read the same way: collapsed past the grid, it still learned what is compared
    write_paths(tmp_path, range(4), ppo=(0.05, 0.4), llm1=(0.05, 0.3), llm2=(0.05, 0.3))
    collapse_after(tmp_path, "cory", {"llm1", "llm2"})
    assert all(a.learned for a in matched_kl(load_experiment(tmp_path)).agents)


def test_fewer_ppo_seeds_than_the_design_needs_is_not_decided_whatever_their_gain(tmp_path):
    """Below the design's min_seeds the numbers are shown and no verdict given: PPO's gain, not yet shown beyond
    the few seeds' noise, does not make it "did not learn"; at min_seeds the same gain decides."""
    write_paths(tmp_path, range(2), ppo=(0.0, 0.4), llm1=(0.05, 0.3), llm2=(0.05, 0.3))
    (tmp_path / "design.yaml").write_text("min_seeds: 3\n")
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "not decided" and v.text.startswith("**not decided** — 2 PPO seed(s), the design needs 3; ")
    write_paths(tmp_path, range(3), ppo=(0.0, 0.4), llm1=(0.05, 0.3), llm2=(0.05, 0.3))
    assert matched_kl(load_experiment(tmp_path)).answer == PPO_DID_NOT_LEARN


def test_fewer_cory_seeds_than_the_design_needs_is_not_decided_whatever_their_gain(tmp_path):
    """The same rule for CORY's learning check: with PPO's seeds enough and learning, CORY agents not yet shown to
    learn on fewer seeds than min_seeds read "not decided", with their numbers; at min_seeds they are "not tested"."""
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.0, 0.3), llm2=(0.0, 0.3))
    (tmp_path / "design.yaml").write_text("min_seeds: 3\n")
    assert matched_kl(load_experiment(tmp_path)).answer == CORY_DID_NOT_LEARN
    shutil.rmtree(tmp_path / "runs" / "cory" / "seed_2")
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "not decided" and v.text.startswith("**not decided** — 2 CORY seed(s), the design needs 3; ")
    assert "LLM1" in v.text and "LLM2" in v.text  # each agent's numbers are still shown
    # and each agent's line agrees: not judged yet, not "did not learn"
    assert v.text.count("Not judged: 2 seed(s), the design needs 3; not yet shown to learn.") == 2
    assert "did not learn" not in v.text


def test_reward_at_reads_where_the_path_first_reaches_k():
    p = HeldoutPath(np.array([0, 3, 6, 9]), np.array([0.0, 2.0, 5.0, 4.0]), np.array([0.1, 0.3, 0.6, 0.9]))
    assert reward_at(p, 1.0) == pytest.approx(0.2)
    assert reward_at(p, 4.5) == pytest.approx(0.55)   # on the way up, not where it came back down
    assert reward_at(p, 5.0) == pytest.approx(0.6)
    assert reward_at(p, 6.0) is None                  # never reached
    assert reward_at(p, 0.0) == pytest.approx(0.1)


def test_any_held_out_series_is_read_at_matched_kl_as_the_reward_is(tmp_path):
    write_paths(tmp_path, range(1), ppo=(0.05, 1.0), llm1=(0.05, 0.5), llm2=(0.05, 0.4))
    p = tmp_path / "runs" / "ppo" / "seed_0" / "eval.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    for r in rows:  # distinct-2 falls by 0.01 a nat; one evaluation did not record it
        r["distinct_2"] = 0.9 - 0.01 * r["kl"]
    del rows[2]["distinct_2"]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    group = load_experiment(tmp_path).main_group("ppo")
    reward, d2 = heldout_path(group, 0, "policy"), heldout_path(group, 0, "policy", "distinct_2")
    assert reward.key == "task_reward" and d2.key == "distinct_2"
    assert len(d2.iterations) == len(reward.iterations) - 1 and rows[2]["iterations"] not in d2.iterations
    for k in (2.0, 7.5, 20.0):
        assert value_at(d2, k) == pytest.approx(0.9 - 0.01 * k)
        assert value_at(reward, k) == reward_at(reward, k)
    assert value_at(d2, 1000.0) is None
    assert heldout_path(group, 0, "policy", "base_logprob") is None  # not recorded: no path


def test_endpoint_uses_only_grid_points_both_reached(tmp_path):
    # CORY's KL stops at 3 nats (rate 0.1 over 30 iterations): only the grid point 2 is common
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.10, 0.1), llm2=(0.10, 0.1))
    v = matched_kl(load_experiment(tmp_path))
    assert all(list(r.points) == [2.0] for a in v.agents for r in a.readings), v.text
    # a CORY that never reaches the grid's first point is left out and named
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.10, 0.05), llm2=(0.10, 0.05))
    v = matched_kl(load_experiment(tmp_path))
    assert v.answer == "not decided" and "Left out (no grid point both paths reached): seeds 0, 1, 2" in v.text


def test_a_design_that_tests_every_agent_tests_one_that_did_not_learn(tmp_path):
    """agents_tested: all (the arithmetic comparison at 30 iterations): the agent that did not learn is tested, Holm
    runs over both agents, and the folder reads no only if both are no."""
    write_paths(tmp_path, range(4), ppo=(0.05, 1.0), llm1=(0.01, 1.0), llm2=(0.0, 0.5))
    (tmp_path / "design.yaml").write_text("agents_tested: all\nmin_seeds: 4\n")
    v = matched_kl(load_experiment(tmp_path))
    llm1, llm2 = v.agents
    assert llm2.learned is False and llm2.judged and llm2.answer in ("no", "could not tell"), v.text
    assert "did not learn" in llm2.line() and "tested all the same" in llm2.line()
    assert v.answer == ("no" if llm2.answer == "no" and llm1.answer == "no" else "could not tell")
    # both CORY agents that did not learn are tested too, not "not tested (CORY did not learn)"
    write_paths(tmp_path, range(4), ppo=(0.05, 1.0), llm1=(0.0, 0.5), llm2=(0.0, 0.5))
    assert matched_kl(load_experiment(tmp_path)).answer != CORY_DID_NOT_LEARN


def test_the_base_models_reward_is_the_mean_of_its_draws_where_the_design_says_so(tmp_path):
    from lab.matched_kl import base_reward

    write_paths(tmp_path, range(4), ppo=(0.05, 1.0), llm1=(0.05, 1.0), llm2=(0.05, 1.0))
    (tmp_path / "base_draws").mkdir()
    for seed, value in ((1, 0.04), (2, 0.07)):
        doc = {"settings": {"seed": seed}, "results": [{"name": "base", "task_reward": value, "reward_sd": 0.37,
                                                          "n_prompts": 110}]}
        (tmp_path / "base_draws" / f"eval_base_seed{seed}.json").write_text(json.dumps(doc))
    one = base_reward(load_experiment(tmp_path), Design())
    assert one[0] == BASE and one[1] == pytest.approx(0.37 / 110 ** 0.5) and one[2] == ""
    (tmp_path / "design.yaml").write_text("base_draws: 4\n")
    with pytest.raises(ReportError, match="needs learned_at: kl_grid"):
        load_design(tmp_path)
    (tmp_path / "design.yaml").write_text("base_draws: 4\nlearned_at: kl_grid\nkl_grid: [1]\n")
    mean, error, said = base_reward(load_experiment(tmp_path), load_design(tmp_path))
    assert mean == pytest.approx((BASE + 0.04 + 0.07) / 3) and error == pytest.approx(0.37 / 110 ** 0.5 / 3 ** 0.5)
    assert "the mean of 3 sampled draws" in said and "the design asks for 4" in said
    assert "the mean of 3 sampled draws" in matched_kl(load_experiment(tmp_path)).text


def test_design_file_is_read_and_checked(tmp_path):
    assert load_design(tmp_path) == Design()
    (tmp_path / "design.yaml").write_text("kl_grid: [3, 1]\nmargin: 0.1\n")
    d = load_design(tmp_path)
    assert d.kl_grid == (1.0, 3.0) and d.margin == 0.1 and d.source == "design.yaml"
    for bad, what in (("kl_grid: []", "kl_grid"), ("kl_grid: [0]", "kl_grid"), ("margin: -1", "margin"),
                      ("alpha: 2", "alpha"), ("min_seeds: 1.5", "min_seeds"), ("endpoint: final_kl", "endpoint"), ("collapse_share: 0", "collapse_share"),
                      ("learned_at: peak", "learned_at"), ("agents_tested: some", "agents_tested"),
                      ("base_draws: 0", "base_draws"), ("base_draws: 2.5", "base_draws"),
                      ("colour: red", "unknown key"), ("- 1", "mapping"), ("kl_grid: [", "YAML")):
        (tmp_path / "design.yaml").write_text(bad + "\n")
        with pytest.raises(ReportError, match=what):
            load_design(tmp_path)


def test_report_leads_with_the_matched_kl_answer_and_its_figure(tmp_path):
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.10, 0.5), llm2=(0.10, 0.4))
    text = build_report(tmp_path).read_text()
    assert text.index("## The claim at matched KL") < text.index("## Verdict")
    assert "**yes**" in text and "the report's defaults" in text
    assert (tmp_path / "fig_reward_vs_kl.png").exists() and "fig_reward_vs_kl.png" in text


# ----------------------------------------------------------------------------- the η frontier at matched KL

def sweep(root, ppo_slope, cory_slope, seeds=range(4), rng=0):
    """PPO and CORY at three η: lower η, higher final KL; each method's final reward = base + slope × KL (held-out
    final evaluations, a little noise per seed)."""
    from lab.frontier import frontier  # noqa: F401  (the module under test)
    g = np.random.default_rng(rng)
    flat = np.zeros(STEPS)
    for eta, kl in ((0.01, 24.0), (0.05, 12.0), (0.2, 5.0)):
        for s in seeds:
            for label, agents, rows in (("ppo", {"policy": (ppo_slope, 1.0)}, ppo_rows(flat, flat)),
                                        ("cory", {"llm1": (cory_slope, 0.8), "llm2": (cory_slope, 0.7)},
                                         cory_rows(flat, flat, flat, flat))):
                d = write_run(root, f"{label}_kl{eta:g}", s, rows, {"init_kl_coef": eta}, heldout=None)
                evals = []
                for agent, (slope, share) in agents.items():
                    k = kl * share * (1 + g.normal(0, 0.03))
                    evals += [{"iterations": 0, "agent": agent, "task_reward": BASE, "kl": 0.0},
                              {"iterations": STEPS, "agent": agent, "kl": k,
                               "task_reward": BASE + slope * k + g.normal(0, 0.02)}]
                (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_frontier_steeper_is_yes_and_the_same_line_is_not(tmp_path):
    from lab.frontier import frontier

    sweep(tmp_path / "steeper", 0.03, 0.06)
    sweep(tmp_path / "same", 0.03, 0.03)
    steeper, same = frontier(load_experiment(tmp_path / "steeper")), frontier(load_experiment(tmp_path / "same"))
    assert steeper.answer == "yes", steeper.text
    assert same.answer == "no" and "held-out evaluations of the final models" in same.text, same.text
    text = build_report(tmp_path / "same").read_text()
    assert "## The η frontier at matched KL" in text


def test_no_frontier_with_one_shared_eta(tmp_path):
    from lab.frontier import frontier

    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.10, 0.5), llm2=(0.10, 0.4))
    assert frontier(load_experiment(tmp_path)) is None
    assert "## The η frontier" not in build_report(tmp_path).read_text()


def test_the_normalised_cory_is_read_beside_the_answer(tmp_path):
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.05, 0.5), llm2=(0.05, 0.4))
    shutil.copytree(tmp_path / "runs" / "cory", tmp_path / "runs" / "cory_norm")
    assert matched_kl(load_experiment(tmp_path), "cory_norm").answer == matched_kl(load_experiment(tmp_path)).answer
    text = build_report(tmp_path).read_text()
    claim = text.split("## The claim at matched KL")[1].split("## The collapse test")[0]
    assert "CORY with score normalisation (`cory_norm`, as the authors run it) against PPO" in claim
    assert "CORY with score normalisation (`cory_norm`, as the authors run it; score_norm" in text
    # the confound figures' captions name the confounds run, not others
    assert "confounds (CORY with score normalisation), PPO and CORY as thin reference lines" in text
    assert "authors' resets" not in text


def write_cory(root, label, seeds, llm1, llm2, rng=1):
    """CORY runs under ``label`` (e.g. cory_norm) whose eval.jsonl holds the given paths ((slope, KL rate) each)."""
    g = np.random.default_rng(rng)
    flat = np.zeros(STEPS)
    for s in seeds:
        d = write_run(root, label, s, cory_rows(flat, flat, flat, flat), heldout=None)
        evals = [{"iterations": int(it), "agent": agent, "task_reward": float(r), "kl": float(k), "reward_sd": 0.37,
                  "n_prompts": 110}
                 for agent, (slope, rate) in (("llm1", llm1), ("llm2", llm2)) for it, k, r in zip(*line(slope, rate, g))]
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_the_normaliser_alone_reads_lower_kl_at_matched_iterations_and_nothing_at_matched_kl(tmp_path):
    # The normalised CORY walks the same reward-vs-KL line at half the KL rate (what a doubled η does to a
    # learner): at the last iteration its KL and reward are lower; at matched KL there is nothing to see.
    write_paths(tmp_path, range(6), ppo=(0.05, 1.0), llm1=(0.05, 0.5), llm2=(0.05, 0.4))
    write_cory(tmp_path, "cory_norm", range(6), llm1=(0.05, 0.25), llm2=(0.05, 0.2))
    text = normaliser_alone(load_experiment(tmp_path))
    lines = text.splitlines()
    assert len(lines) == 2 and "paired seeds 0, 1, 2, 3, 4, 5: at iteration 30" in lines[0]
    for line_, kl_drop in zip(lines, (7.5, 6.0)):  # 30 iterations × the halved rate
        kl = float(line_.split("held-out KL ")[1].split(" nats")[0])
        assert kl == pytest.approx(-kl_drop, rel=0.1)
        reward = float(line_.split("held-out reward ")[1].split(" ±")[0])
        assert reward == pytest.approx(0.05 * -kl_drop, abs=0.04)
        matched = float(line_.split("at matched held-out KL")[1].split("): ")[1].split(" ±")[0])
        assert abs(matched) < 0.02, line_  # the points' own noise is 0.02; the KL effect above is 15-19x that
    report = build_report(tmp_path).read_text()
    assert "The normaliser alone: CORY with score normalisation minus CORY without" in report
    assert text in report


def test_the_normaliser_alone_is_silent_without_both_corys(tmp_path):
    write_paths(tmp_path, range(3), ppo=(0.05, 1.0), llm1=(0.05, 0.5), llm2=(0.05, 0.4))
    assert normaliser_alone(load_experiment(tmp_path)) == ""
    assert "The normaliser alone" not in build_report(tmp_path).read_text()
