"""The verdict rule on synthetic experiments, one test per case the rule distinguishes: a clear yes, a well-powered
no, a could-not-tell, a trivial reward dip under the non-inferiority margin, paired against unpaired seeds, Holm's
control of "partly" on pure noise and the power figures."""
import math

import numpy as np
import pytest

from lab.curves import Final
from lab.report import build_report
from lab.results import load_experiment
from lab.stats import ALPHA, difference, holm, min_detectable, p_value, power
from lab.verdict import Comparison, Margin, Pairing, decide, verdict
from test_report import cory_rows, ppo_rows, write_run

STEPS = 12  # the final window is iterations 2-11


def claim_text(v) -> str:
    """The verdict on the paper's claim, after the paragraph that says the baseline learned (which comes first)."""
    first, rest = v.text.split("\n\n", 1)
    assert first.startswith("**PPO learned**"), first
    return rest


def experiment(root, seeds, ppo, llm1, llm2, *, seed_sd=0.0, noise=0.05, paired=True, rng=0, label="",
               eta=None):
    """PPO and CORY runs whose final (reward, KL) levels are the given ones. Each seed draws one luck term per
    metric that both methods share (as runs sharing a seed's prompts and length draws do) plus independent noise
    per iteration; iteration 0 is the untrained model: reward 0 + the seed's draw, the same for both methods
    when ``paired``, KL 0, answer length 10."""
    g = np.random.default_rng(rng)
    t = np.arange(STEPS)
    config = {} if eta is None else {"init_kl_coef": eta}
    for s in seeds:
        luck_r, luck_k, r0 = g.normal(0, seed_sd), g.normal(0, seed_sd * 10), g.normal(0, 0.01)

        def series(level, luck, start, scale=1.0):
            v = level + luck + g.normal(0, noise * scale, STEPS)
            v[0] = start
            return v
        write_run(root, f"ppo{label}", s, ppo_rows(series(ppo[0], luck_r, r0), series(ppo[1], luck_k, 0.0, 10),
                                                   np.full(STEPS, 10.0)), config)
        start = r0 if paired else r0 + 0.123
        write_run(root, f"cory{label}", s, cory_rows(series(llm1[0], luck_r, start), series(llm1[1], luck_k, 0.0, 10),
                                                     series(llm2[0], luck_r, r0), series(llm2[1], luck_k, 0.0, 10)),
                  config)
    return t


def test_clear_yes_states_its_power(tmp_path):
    experiment(tmp_path, range(4), (1.0, 10.0), (1.0, 4.0), (0.99, 4.5))
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "yes" and v.power >= 0.8, v.text
    assert claim_text(v).startswith("**yes (power ") and v.text.count("the claim holds") == 2
    assert "paired by seed" in v.text


def test_clear_no_with_high_power(tmp_path):
    # CORY's KL equals PPO's, rewards equal, little spread, 8 seeds: the paper's halving would have shown
    experiment(tmp_path, range(8), (1.0, 10.0), (1.0, 10.0), (1.0, 10.0), noise=0.02)
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "no" and v.power >= 0.8, v.text
    assert claim_text(v).startswith(f"**no (power {100 * v.power:.0f}%)**") or claim_text(v).startswith("**no (power >99%)**")
    assert "the claim is not shown" in v.text and "could not tell" not in v.text.split("\n")[0]


def test_could_not_tell_with_low_power(tmp_path):
    # the same true state, but 3 seeds with a large spread: too weak to call it a "no"
    experiment(tmp_path, range(3), (1.0, 10.0), (1.0, 10.0), (1.0, 10.0), noise=0.6, paired=False)
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "could not tell" and v.power < 0.8, v.text
    pct = "<1%" if v.power < 0.005 else f"{100 * v.power:.0f}%"
    assert claim_text(v).startswith(f"**could not tell (power {pct})**") and "no evidence against the claim" in v.text
    assert "**no" not in v.text
    # every comparison gives the differences it could have detected
    assert v.text.count("smallest KL gap detectable at 80% power (α/2): ") == 2


@pytest.mark.parametrize("seeds", [4, 20])
def test_trivial_reward_dip_does_not_block_similar_reward(tmp_path, seeds):
    # KL 4 vs 10 with CORY's reward 5% below PPO's (PPO gained 1.0 over iteration 0; the margin is 0.2 of that):
    # "similar" holds, and more seeds make it hold more surely, not fail
    experiment(tmp_path, range(seeds), (1.0, 10.0), (0.95, 4.0), (0.95, 4.0), noise=0.03)
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "yes", v.text
    assert v.text.count(": similar (within the margin);") == 2
    assert "margin = 0.2 × PPO's reward gain" in v.text


def test_a_real_reward_drop_blocks_similar_reward(tmp_path):
    # half of PPO's gain lost, with many seeds: outside the margin, so lower KL alone does not make the claim
    experiment(tmp_path, range(20), (1.0, 10.0), (0.5, 4.0), (0.5, 4.0), noise=0.03)
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "no" and v.text.count("similar not shown") == 2 and v.text.count(": lower;") == 2, v.text


def test_pairing_cancels_seed_luck_and_falls_back_when_draws_differ(tmp_path):
    # a large seed-to-seed spread shared by both methods, tiny noise: paired differences see the KL gap
    kw = dict(seed_sd=0.5, noise=0.01, rng=3)
    experiment(tmp_path / "paired", range(4), (1.0, 10.0), (1.0, 6.0), (1.0, 6.0), **kw)
    experiment(tmp_path / "unpaired", range(4), (1.0, 10.0), (1.0, 6.0), (1.0, 6.0), paired=False, **kw)
    p, u = verdict(load_experiment(tmp_path / "paired")), verdict(load_experiment(tmp_path / "unpaired"))
    assert p.answer == "yes" and "paired by seed: each of the 4 seeds' runs shared" in p.text, p.text
    assert "seed correlation 1" in p.text or "seed correlation 0.99" in p.text
    assert u.answer == "could not tell", u.text
    assert "unpaired (Welch): seed 0's iteration-0 task reward or answer length differs" in u.text
    # different seed sets: unpaired too, and said so
    experiment(tmp_path / "seeds", range(4), (1.0, 10.0), (1.0, 6.0), (1.0, 6.0), **kw)
    import shutil
    shutil.rmtree(tmp_path / "seeds" / "runs" / "cory" / "seed_3")
    assert "unpaired (Welch): the seeds differ (0,1,2,3 vs 0,1,2)" in verdict(load_experiment(tmp_path / "seeds")).text


def test_paired_p_value_is_scipys():
    from scipy import stats
    a = Final(np.array([1.0, 2.5, 3.1, 4.0]), 10, [0, 1, 2, 3])
    b = Final(np.array([1.4, 2.9, 3.0, 4.9]), 10, [0, 1, 2, 3])
    d = difference(a, b, paired=True)
    assert d.df == 3 and p_value(d, "less") == pytest.approx(stats.ttest_rel(a.per_seed, b.per_seed,
                                                                            alternative="less").pvalue)
    assert d.corr == pytest.approx(np.corrcoef(a.per_seed, b.per_seed)[0, 1])
    # the seeds are matched by number, not by position
    shuffled = Final(b.per_seed[::-1], 10, [3, 2, 1, 0])
    assert difference(a, shuffled, paired=True).mean == pytest.approx(d.mean)


def test_power_and_minimum_detectable_difference():
    d = difference(Final(np.array([1.0, 1.2, 0.9, 1.3, 1.1]), 10, list(range(5))),
                   Final(np.array([0.0, 0.1, 0.3, 0.0, 0.2]), 10, list(range(5))), paired=False)
    assert power(0.0, d, ALPHA) == pytest.approx(ALPHA)           # no effect: the test's own level
    mdd = min_detectable(d, ALPHA)
    assert power(mdd, d, ALPHA) == pytest.approx(0.8, abs=1e-6)
    assert power(2 * mdd, d, ALPHA) > 0.99 and power(mdd / 2, d, ALPHA) < 0.5
    # more seeds, same spread: a smaller detectable difference
    wide = difference(Final(np.tile([1.0, 1.2, 0.9, 1.3, 1.1], 4), 10, list(range(20))),
                      Final(np.tile([0.0, 0.1, 0.3, 0.0, 0.2], 4), 10, list(range(20))), paired=False)
    assert min_detectable(wide, ALPHA) < mdd / 2
    # Monte Carlo check of the noncentral t: one-sided Welch-free case, paired, n 6
    rng = np.random.default_rng(0)
    n, sd, effect = 6, 1.0, 1.2
    from scipy import stats
    draws = rng.normal(-effect, sd, size=(4000, n))
    hits = stats.ttest_1samp(draws, 0.0, axis=1, alternative="less").pvalue < ALPHA
    se = sd / math.sqrt(n)
    analytic = power(effect, results_diff(se, n - 1), ALPHA)
    assert abs(hits.mean() - analytic) < 0.03


def results_diff(se, df):
    from lab.stats import Diff
    return Diff(True, 0.0, se, float(df), int(df) + 1)


def test_margin_allows_no_drop_when_ppo_gained_nothing():
    assert Margin(0.5, 1.0, 0).value == pytest.approx(0.1)
    flat = Margin(0.5, 0.45, 0)
    assert flat.value == 0.0 and "did not rise" in flat.text("PPO")


def test_holm():
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]       # 0.01 < 0.05/3; 0.03 > 0.05/2 stops
    assert holm([0.01, 0.02, 0.04]) == [True, True, True]          # 0.01 < .0167, 0.02 < .025, 0.04 < .05
    assert holm([float("nan"), 0.001]) == [False, True]


def test_partly_fires_on_pure_noise_at_most_alpha():
    """Both agents drawn like PPO (no true effect), seeds paired, many simulated experiments: "yes" or "partly"
    must fire at most α of the time; without Holm's correction it would fire about twice as often."""
    rng = np.random.default_rng(7)
    n, reps = 4, 1500
    seeds = list(range(n))
    fired = uncorrected = 0
    margin = Margin(0.0, 1.0, 0)  # a generous margin: "similar" passes, the KL test decides
    for _ in range(reps):
        base = {"task_reward": rng.normal(1.0, 0.05, n), "kl": rng.normal(10.0, 1.0, n)}
        base["combined_reward"] = base["task_reward"] - 0.1 * base["kl"]
        comps = []
        for agent in ("llm1", "llm2"):
            fin = {"task_reward": rng.normal(1.0, 0.05, n), "kl": rng.normal(10.0, 1.0, n)}
            fin["combined_reward"] = fin["task_reward"] - 0.1 * fin["kl"]
            comps.append(Comparison(agent, agent, "PPO", {k: Final(v, 10, seeds) for k, v in fin.items()},
                                    {k: Final(v, 10, seeds) for k, v in base.items()},
                                    Pairing(True, "paired"), margin))
        decide(comps)
        fired += any(c.holds for c in comps)
        uncorrected += any(c.p_claim < ALPHA for c in comps)
    # the two agents share PPO's values, so their tests are correlated; still the uncorrected rate is well above α
    assert fired / reps <= ALPHA + 0.015, fired / reps
    assert uncorrected / reps > ALPHA + 0.015, uncorrected / reps


def test_the_margin_has_a_floor_of_a_share_of_the_rewards_range():
    # PPO gained nothing: without a known range no drop is allowed; with VADER's [-1, 1] the floor applies
    assert Margin(0.5, 0.45, 0).value == 0.0
    assert Margin(0.5, 0.45, 0, (-1.0, 1.0)).value == pytest.approx(0.05)
    # a large gain: the share of the gain, not the floor
    assert Margin(0.0, 1.0, 0, (-1.0, 1.0)).value == pytest.approx(0.2)
    assert "at least 0.025" in Margin(0.5, 0.45, 0, (-1.0, 1.0)).text("PPO")


# ----------------------------------------------------------------------------- did the baseline learn?

def _flat(root, seeds, heldout, ppo_reward=0.5):
    t = np.arange(STEPS)
    for s in seeds:
        write_run(root, "ppo", s, ppo_rows(np.full(STEPS, ppo_reward), 1.0 * t), heldout=heldout)
        write_run(root, "cory", s, cory_rows(np.full(STEPS, 0.5), 0.2 * t, np.full(STEPS, 0.5), 0.2 * t),
                  heldout=heldout)


@pytest.mark.parametrize("heldout", [(0.15, 0.13), None])
def test_a_baseline_that_did_not_learn_leaves_the_claim_untested(tmp_path, heldout):
    """CORY's KL is a fifth of PPO's here, a clear "lower KL" - but PPO gained nothing (held-out, or over its
    training batches when no evaluation exists), so nothing is tested and the text says by how much it missed."""
    _flat(tmp_path, range(4), heldout)
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "not tested (PPO did not learn)", v.text
    assert v.text.startswith("**not tested (PPO did not learn)** — ")
    assert ("held-out reward" if heldout else "training reward, iterations 0–5 against 6–11") in v.text
    assert "missed it by" in v.text and "lower KL" not in v.text and "power" not in v.text
    report = build_report(tmp_path).read_text()
    assert "First, did the baseline learn?" in report.split("Does CORY reach")[0]


def test_the_base_models_own_sampling_error_counts(tmp_path):
    """Gains of 0.02 over 4 seeds with a tiny spread beat the seeds' noise alone, but not the base model's own
    sampling error (reward_sd 0.4 over 110 prompts: 0.038)."""
    import json

    _flat(tmp_path, range(4), (0.15, 0.17))
    assert verdict(load_experiment(tmp_path)).answer != "not tested (PPO did not learn)"
    (tmp_path / "eval_base_imdb.json").write_text(json.dumps({"results": [
        {"name": "base", "task_reward": 0.15, "reward_sd": 0.4, "n_prompts": 110}]}))
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "not tested (PPO did not learn)", v.text


def test_whether_one_seed_learned_cannot_be_told():
    from lab.learning import baseline_learned

    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        _flat(Path(d), [0], (0.1, 0.9))
        exp = load_experiment(d)
        learning = baseline_learned(exp, exp.groups["ppo"])
    assert learning.learned is None and "one seed" in learning.text


def test_similar_reward_is_read_from_the_held_out_evaluations_when_every_model_has_one(tmp_path):
    """CORY's training rewards are far below PPO's here, but its final models answer held-out prompts as well as
    PPO's: with an evaluation of every final model, the similar-reward test reads those (and says so)."""
    import json

    t = np.arange(STEPS)
    for s in range(4):
        write_run(tmp_path, "ppo", s, ppo_rows(np.full(STEPS, 0.8), 10.0 + 0.1 * s + 0 * t))
        d = write_run(tmp_path, "cory", s, cory_rows(np.full(STEPS, 0.1), 4.0 + 0.1 * s + 0 * t, np.full(STEPS, 0.1),
                                                     4.0 + 0.1 * s + 0 * t), heldout=None)
        rows = [{"iterations": STEPS, "agent": a, "task_reward": 0.6 + 0.01 * s} for a in ("llm1", "llm2")]
        (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    v = verdict(load_experiment(tmp_path))
    claim = claim_text(v)
    assert "task reward: each final model's held-out reward" in claim
    assert "held-out reward gain (the base model's 0.1 → 0.615 final)" in claim
    assert v.answer == "yes", claim
    # without CORY's evaluations the training rewards decide: far behind, no claim
    for s in range(4):
        (tmp_path / "runs" / "cory" / f"seed_{s}" / "eval.jsonl").unlink()
    assert verdict(load_experiment(tmp_path)).answer != "yes"
