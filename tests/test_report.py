"""The report builder on synthetic metrics files: statistics against numpy, figures, verdict, robustness."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from lab import results
from lab.curves import Final, curve, final_value, pooled_std, sweep_points
from lab.report import build_report
from lab.results import load_experiment
from lab.stats import Diff, difference, p_value
from lab.verdict import verdict

ETA = 0.2


LEARNED = (0.1, 0.6)  # a held-out evaluation whose final models beat the base model clearly


def write_run(root, label, seed, rows, config=None, samples=None, heldout=LEARNED):
    """A run's files; ``heldout`` (base, final): a PPO run's own held-out evaluation (eval.jsonl) at iteration 0 and
    at its end, a little noise per seed, so that the baseline of a synthetic comparison learned (None: none)."""
    d = root / "runs" / label / f"seed_{seed}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if heldout is not None:
        # the baseline's own evaluations only, so that the claim's tests read the training rewards given here
        agents = sorted({k.split("/")[0] for r in rows for k in r if k.split("/")[0] == "policy"})
        end = max(r["step"] for r in rows) + 1
        evals = [{"iterations": it, "agent": a, "task_reward": value, "kl": 0.0, "distinct_2": 0.9}
                 for it, value in ((0, heldout[0]), (end, heldout[1] + 0.01 * seed)) for a in agents]
        (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    cfg = {"task": "imdb", "seed": seed, "steps": len(rows), "model_name": "tiny", "reward_model": "vader",
           "init_kl_coef": ETA, "learning_rate": 1e-4, **(config or {})}
    import yaml
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if samples is not None:
        (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return d


def agent_row(prefix, reward, kl, length=10.0):
    return {f"{prefix}/task_reward": reward, f"{prefix}/kl": kl, f"{prefix}/kl_coef": ETA,
            f"{prefix}/combined_reward": None if reward is None or kl is None else reward - ETA * kl,
            f"{prefix}/response_length": length}


def ppo_rows(reward, kl, length=None):
    length = np.full(len(reward), 12.0) if length is None else length
    return [{"step": i, **agent_row("policy", float(r), float(k), float(n)), "time/iteration_s": 2.0}
            for i, (r, k, n) in enumerate(zip(reward, kl, length))]


def cory_rows(r1, k1, r2, k2):
    rows = []
    for i in range(len(r1)):
        rows.append({"step": i, "pioneer": "llm1" if (i // 5) % 2 == 0 else "llm2",
                     **agent_row("llm1", float(r1[i]), float(k1[i])), **agent_row("llm2", float(r2[i]), float(k2[i])),
                     "time/iteration_s": 5.0})
    return rows


def synthetic(root, *, cory_wins: bool, seeds=(0, 1, 2), steps=15, seed=0):
    """PPO's KL grows fast; CORY's reward is similar with lower KL (cory_wins) or worse on every count."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    data = {}
    for s in seeds:
        ppo_r = 0.5 + 0.03 * t + rng.normal(0, 0.02, steps)
        ppo_k = 0.4 * t + rng.normal(0, 0.1, steps)
        if cory_wins:
            c = [0.5 + 0.03 * t + rng.normal(0, 0.02, steps), 0.1 * t + rng.normal(0, 0.05, steps),
                 0.49 + 0.03 * t + rng.normal(0, 0.02, steps), 0.12 * t + rng.normal(0, 0.05, steps)]
        else:
            c = [0.2 + 0.01 * t + rng.normal(0, 0.02, steps), 0.8 * t + rng.normal(0, 0.05, steps),
                 0.2 + 0.01 * t + rng.normal(0, 0.02, steps), 0.9 * t + rng.normal(0, 0.05, steps)]
        write_run(root, "ppo", s, ppo_rows(ppo_r, ppo_k),
                  samples=[{"step": i, "query": "The film", "response": f" was great {i}", "reward": 0.5}
                           for i in (0, 0, steps - 1)])
        write_run(root, "cory", s, cory_rows(*c), config={"swap_period": 5, "knowledge_transfer": True},
                  samples=[{"step": i, "pioneer": "llm1", "query": "The plot", "pioneer_response": f" a1 {i}",
                            "pioneer_reward": 0.1, "observer_prompt": "x", "observer_response": f" a2 {i}",
                            "observer_reward": -0.2} for i in (0, steps - 1)])
        data[s] = {"ppo_r": ppo_r, "ppo_k": ppo_k, "c": c}
    return data


def test_curve_mean_std_and_last10_match_numpy(tmp_path):
    data = synthetic(tmp_path, cory_wins=True)
    exp = load_experiment(tmp_path)
    ppo = exp.groups["ppo"]
    kl = np.stack([data[s]["ppo_k"] for s in (0, 1, 2)])
    c = curve(ppo, "policy", "kl")
    assert list(c.steps) == list(range(15))
    np.testing.assert_allclose(c.mean, kl.mean(axis=0))
    np.testing.assert_allclose(c.std, kl.std(axis=0, ddof=1))
    f = final_value(ppo, "policy", "kl")
    per_seed = kl[:, -10:].mean(axis=1)
    assert f.last == 10
    np.testing.assert_allclose(f.per_seed, per_seed)
    assert f.mean == pytest.approx(per_seed.mean())
    assert f.std == pytest.approx(per_seed.std(ddof=1))
    # r_c is the logged combined reward, not recomputed
    rc = np.stack([data[s]["ppo_r"] - ETA * data[s]["ppo_k"] for s in (0, 1, 2)])
    assert final_value(ppo, "policy", "combined_reward").mean == pytest.approx(rc[:, -10:].mean())
    llm2 = np.stack([data[s]["c"][2] for s in (0, 1, 2)])
    assert final_value(exp.groups["cory"], "llm2", "task_reward").mean == pytest.approx(llm2[:, -10:].mean())
    # the table in REPORT.md shows the same numbers
    text = build_report(tmp_path).read_text()
    assert f"{per_seed.mean():.3g} ± {per_seed.std(ddof=1):.3g}" in text
    r2 = llm2[:, -10:].mean(axis=1)
    assert f"{r2.mean():.3g} ± {r2.std(ddof=1):.3g}" in text


def test_fewer_than_ten_iterations_use_all():
    rows = ppo_rows([1.0, 2.0, 4.0], [0.0, 1.0, 2.0])
    g = results.Group("ppo", "ppo", None, {0: results.SeedRun(0, None, rows, {})})
    f = final_value(g, "policy", "task_reward")
    assert f.last == 3 and f.mean == pytest.approx(7 / 3) and f.n == 1 and np.isnan(f.std)


def test_pooled_std_by_hand():
    a = Final(np.array([1.0, 2.0, 3.0]), 10, [0, 1, 2])          # var 1, n 3
    b = Final(np.array([0.0, 4.0]), 10, [0, 1])                  # var 8, n 2
    assert pooled_std(a, b) == pytest.approx(np.sqrt((2 * 1 + 1 * 8) / 3))
    one = Final(np.array([1.0]), 10, [0])
    assert pooled_std(one, one) == 0.0


def test_figures_written_and_nonempty(tmp_path):
    synthetic(tmp_path, cory_wins=True)
    rng = np.random.default_rng(1)
    t = np.arange(15)
    for s in (0, 1):
        for label in ("cory_no_kt", "cory_no_swap"):
            write_run(tmp_path, label, s, cory_rows(0.5 + 0.02 * t, 0.3 * t, 0.5 + 0.02 * t + rng.normal(0, .01, 15),
                                                   0.2 * t))
        for eta, slope in ((0.01, 1.0), (0.1, 0.5)):
            write_run(tmp_path, f"ppo_kl{eta:g}", s, ppo_rows(0.6 + 0.03 * t, slope * t), {"init_kl_coef": eta})
            write_run(tmp_path, f"cory_kl{eta:g}", s, cory_rows(0.6 + 0.03 * t, slope * t / 3, 0.6 + 0.03 * t,
                                                              slope * t / 2), {"init_kl_coef": eta})
    md = build_report(tmp_path)
    expected = [f"fig_{m}.png" for m in ("task_reward", "kl", "combined_reward", "response_length")]
    expected += [f"fig_ablation_{m}.png" for m in ("task_reward", "kl", "combined_reward")] + ["fig_kl_sweep.png"]
    for name in expected:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
        assert f"]({name})" in md.read_text()
    import re
    links = re.findall(r"\]\(([^)\s#]+)", md.read_text())  # every file the report links is there
    assert links and not [t for t in links if not re.match(r"[a-z]+:", t) and not (tmp_path / t).exists()]
    # the sweep holds the two swept etas plus the preset's own (0.2, from the unsuffixed runs)
    points = sweep_points(load_experiment(tmp_path))
    assert [p[0] for p in points[("ppo", "policy")]] == [0.01, 0.1, 0.2]
    assert set(points) == {("ppo", "policy"), ("cory", "llm1"), ("cory", "llm2")}
    kl01 = final_value(load_experiment(tmp_path).groups["ppo_kl0.1"], "policy", "kl").mean
    assert points[("ppo", "policy")][1][2].mean == pytest.approx(kl01) == pytest.approx(0.5 * np.arange(5, 15).mean())


def test_verdict_flips_between_cory_and_ppo_wins(tmp_path):
    synthetic(tmp_path / "win", cory_wins=True)
    synthetic(tmp_path / "lose", cory_wins=False)
    win, lose = verdict(load_experiment(tmp_path / "win")), verdict(load_experiment(tmp_path / "lose"))
    assert win.answer == "yes" and lose.answer == "no", (win.text, lose.text)
    assert "**yes (power " in build_report(tmp_path / "win").read_text().split("## Verdict")[1].split("##")[0]
    section = build_report(tmp_path / "lose").read_text().split("## Verdict")[1].split("## Figures")[0]
    # a well-powered negative reads "no" with its power, never "could not tell"
    assert "**no (power " in section and "lower not shown" in section and "higher not shown" in section
    assert "similar not shown" in section
    assert "non-inferiority" in section and "Holm" in section and "could not tell" in section  # the rule
    # the deciding numbers are in the text
    exp = load_experiment(tmp_path / "lose")
    kl = final_value(exp.groups["ppo"], "policy", "kl")
    assert f"{kl.mean:.3g} ± {kl.std:.3g}" in section


def test_verdict_lower_kl_with_reward_far_behind_is_no_claim(tmp_path):
    t = np.arange(12)
    for s in (0, 1, 2):
        write_run(tmp_path, "ppo", s, ppo_rows(1.0 + 0.01 * s + 0 * t, 2.0 + 0 * t))
        # reward far lower but KL lower and r_c = 0.5 - 0.2*0.1 < 1.0 - 0.2*2 = 0.6
        write_run(tmp_path, "cory", s, cory_rows(0.5 + 0.01 * s + 0 * t, 0.1 + 0 * t, 0.4 + 0 * t, 0.1 + 0 * t))
    v = verdict(load_experiment(tmp_path))
    # lower KL alone is not the paper's claim: the reward is far outside any margin, so no agent's claim holds
    assert v.answer in ("no", "could not tell") and "the claim holds" not in v.text, v.text
    # KL is constant over seeds in both methods: no spread, decided by the sign of the difference, and said so
    assert v.text.count("one-sided p = 0 (no spread over seeds: decided by the sign): lower;") == 2
    # the iteration-0 rewards differ, so the seeds are not paired, and the report says why
    assert "unpaired (Welch): seed 0's iteration-0 task reward or answer length differs" in v.text
    assert v.text.count("similar not shown") == 2


@pytest.mark.parametrize("removed,held", [("cory", "PPO"), ("ppo", "CORY")])
def test_one_side_only_is_reported_as_no_comparison(tmp_path, removed, held):
    """A folder with one method's runs (a baseline folder, or a comparison whose other side has not run yet) says
    so once, up front, instead of a claim, a collapse test and a verdict that each read "not decided"."""
    synthetic(tmp_path, cory_wins=True)
    import shutil
    shutil.rmtree(tmp_path / "runs" / removed)
    assert verdict(load_experiment(tmp_path)).answer == "not decided"
    text = build_report(tmp_path).read_text()
    lacking = {"PPO": "CORY", "CORY": "PPO"}[held]
    assert text.startswith(f"# {held} runs: ")
    assert f"This folder holds {held} runs with metrics and no {lacking} runs, so there is nothing to compare" in text
    for section in ("## The claim at matched KL", "## The collapse test", "## Verdict"):
        assert section not in text
    assert "## Final values" in text and "## Samples" in text  # the runs it holds are still described
    assert not (tmp_path / "fig_reward_vs_kl.png").exists()


def test_partial_results_nan_none_and_different_lengths(tmp_path):
    rng = np.random.default_rng(3)
    kl = rng.uniform(0, 5, size=(3, 20))
    kl[1, 4] = np.nan
    for s in range(3):
        n = 20 if s < 2 else 14  # seed 2 was cut off after 14 iterations
        rows = ppo_rows(np.ones(n), kl[s, :n])
        if s == 1:
            rows[4]["policy/kl"] = None          # NaN is written as null by the trainer
            rows[6]["policy/task_reward"] = float("nan")
        write_run(tmp_path, "ppo", s, rows)
    # a line cut by a kill, a seed folder without metrics, a stray folder, a cory run without llm2 keys
    with open(tmp_path / "runs" / "ppo" / "seed_0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 20, "policy/kl": 1.')
    (tmp_path / "runs" / "ppo" / "seed_3").mkdir()
    (tmp_path / "runs" / "ppo" / "notes").mkdir()
    rows = [{"step": i, **agent_row("llm1", 1.0, 0.5)} for i in range(5)]
    write_run(tmp_path, "cory", 0, rows)

    exp = load_experiment(tmp_path)
    c = curve(exp.groups["ppo"], "policy", "kl")
    common = [i for i in range(14) if i != 4]
    assert list(c.steps) == common
    np.testing.assert_allclose(c.mean, kl[:, common].mean(axis=0))
    np.testing.assert_allclose(c.std, kl[:, common].std(axis=0, ddof=1))
    final = final_value(exp.groups["ppo"], "policy", "kl")
    np.testing.assert_allclose(final.per_seed, kl[:, common[-10:]].mean(axis=1))
    assert exp.groups["cory"].agents == ["llm1"]

    text = build_report(tmp_path).read_text()
    assert "present in all of them" in text and "seed 2: 14" in text
    assert "unreadable line" in text and "seed_3" in text
    assert (tmp_path / "fig_kl.png").stat().st_size > 0
    assert verdict(exp).answer == "too few seeds"  # CORY has one seed


def test_samples_and_provenance_in_report(tmp_path):
    synthetic(tmp_path, cory_wins=True)
    runs = {"task": "imdb", "preset": "tiny", "invocations": [
        {"command": "python -m lab.experiments --task imdb --preset tiny --out results/x", "started": "2025-01-01",
         "git_commit": "abc123", "git_dirty": False, "ran": 6, "skipped": 0, "failed": 0},
        {"command": "python -m lab.experiments --task imdb --preset tiny --out results/x --seeds 3",
         "started": "2025-01-02", "git_commit": "abc123", "git_dirty": False, "ran": 0, "skipped": 6, "failed": 0,
         "cpu": {"model": "AMD EPYC 7B13", "cores": 2, "flags": ["fma", "avx", "avx2"]}}],
        "runs": {f"ppo/seed_{s}": {"script": "imdb_train/ppo.py", "status": "finished", "attempts": [
            {"mode": "new", "command": f"python imdb_train/ppo.py --seed {s}", "wall_time_s": 30.0,
             "exit_status": 0}]} for s in (0, 1, 2)}}
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    text = build_report(tmp_path).read_text()
    samples = text.split("## Samples")[1].split("## What was run")[0]
    assert "iteration 0:" in samples and "iteration 14:" in samples
    assert "The film ⟶  was great 14" in samples and "[LLM1 pioneer r=+0.100]" in samples
    assert "[LLM2 observer r=-0.200]" in samples
    run = text.split("## What was run")[1]
    assert "abc123" in run and "python imdb_train/ppo.py --seed 2" in run
    # the CPU beside the wall times where the invocation recorded it (runs.json before 2026-11-29 did not)
    assert "failed 0\n" in run and "failed 0; on AMD EPYC 7B13, 2 cores (fma avx avx2)\n" in run
    assert "| ppo | imdb_train/ppo.py | 0, 1, 2 | 90 s | 90 s | 2.0 s |" in run
    assert "In all, 5.2 min of training iterations" in run  # PPO 3 x 15 x 2 s, CORY 3 x 15 x 5 s
    assert "| model_name | tiny | tiny |" in run
    assert "Task `imdb`, preset `tiny` (`configs/imdb/<ppo|cory>_tiny.yaml`)." in run
    # a task file's runs have no preset: said so, not "preset None (configs/<task>/..._None.yaml)"
    (tmp_path / "runs.json").write_text(json.dumps({**runs, "preset": None}))
    run = build_report(tmp_path).read_text().split("## What was run")[1]
    assert "Task `imdb`, no preset (the training script's own values)." in run and "None" not in run


def test_cli(tmp_path):
    p = subprocess.run([sys.executable, "-m", "lab.report", str(tmp_path / "nope")], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 2 and p.stderr.startswith("error:") and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nope").exists()
    synthetic(tmp_path, cory_wins=False)
    p = subprocess.run([sys.executable, "-m", "lab.report", str(tmp_path)], capture_output=True, text=True,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr
    first = (tmp_path / "REPORT.md").read_text()
    build_report(tmp_path)  # rebuilding gives the same file
    assert (tmp_path / "REPORT.md").read_text() == first


def test_verdict_compares_methods_over_the_iterations_all_reached(tmp_path):
    # PPO ran 20 iterations, CORY was cut off after 12: both are judged on iterations 2-11
    t = np.arange(20)
    for s in (0, 1, 2):
        write_run(tmp_path, "ppo", s, ppo_rows(0.5 + 0.0 * t + 0.01 * s, 0.5 * t))
        write_run(tmp_path, "cory", s, cory_rows(0.5 + 0.0 * t[:12], 0.6 * t[:12], 0.5 + 0.0 * t[:12], 0.6 * t[:12]))
    v = verdict(load_experiment(tmp_path))
    # over 2-11 CORY's KL (0.6 * 6.5 = 3.9) is above PPO's (0.5 * 6.5 = 3.25); over PPO's own last 10 it would
    # be compared with 0.5 * 14.5 = 7.25 and look lower
    assert v.answer in ("no", "could not tell") and "the claim holds" not in v.text, v.text
    assert "iterations 2–11" in v.text and "compared up to iteration 11" in v.text
    assert "3.9 ± 0" in v.text and "3.25 ± 0" in v.text
    table = build_report(tmp_path).read_text().split("## Final values")[1]
    assert "| PPO | 0.2 | 3 | 10–19 |" in table and "| CORY-LLM1 | 0.2 | 3 | 2–11 |" in table


# ----------------------------------------------------------------------------- the verdict's test

def two_methods(root, seeds, ppo, llm1, llm2, steps=12, seed=0):
    """PPO and CORY with each seed's values drawn around the given (reward, KL) means, noise 0.05; every reward
    starts at 0 at iteration 0 (so PPO's reward gain, which sets the similar-reward margin, is its mean)."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    for s in seeds:
        def noise():
            return rng.normal(0, 0.05, steps)

        def rising(level):
            return np.where(t == 0, 0.0, level + noise())
        write_run(root, "ppo", s, ppo_rows(rising(ppo[0]), ppo[1] + noise()))
        write_run(root, "cory", s, cory_rows(rising(llm1[0]), llm1[1] + noise(), rising(llm2[0]), llm2[1] + noise()))


def test_verdict_equal_distributions_is_not_yes(tmp_path):
    for k in range(8):
        root = tmp_path / str(k)
        two_methods(root, (0, 1, 2), (0.5, 2.0), (0.5, 2.0), (0.5, 2.0), seed=k)
        v = verdict(load_experiment(root))
        assert v.answer in ("no", "could not tell", "partly"), v.text
        # with the same distribution a claim that holds is an accident (at most α), never both agents at once
        assert v.text.count("the claim holds") <= 1


def test_verdict_yes_when_both_agents_clearly_separated(tmp_path):
    two_methods(tmp_path, (0, 1, 2), (0.5, 3.0), (0.5, 0.5), (0.49, 0.6))
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "yes", v.text
    assert v.text.count("the claim holds") == 2 and v.text.count(": similar (within the margin);") == 2
    assert "KL ratio PPO/CORY-LLM1 = " in v.text and "(paper: > 2)" in v.text
    exp = load_experiment(tmp_path)
    ratio = final_value(exp.groups["ppo"], "policy", "kl").mean / final_value(exp.groups["cory"], "llm1", "kl").mean
    assert ratio > 2 and f"KL ratio PPO/CORY-LLM1 = {ratio:.3g} " in v.text


def test_verdict_partly_names_the_one_agent(tmp_path):
    # LLM1 clearly better; LLM2 drawn like PPO
    two_methods(tmp_path, (0, 1, 2), (0.5, 3.0), (0.5, 0.5), (0.5, 3.0))
    v = verdict(load_experiment(tmp_path))
    assert v.answer == "partly", v.text
    assert "Only CORY-LLM1 showed similar task reward at lower KL; CORY-LLM2 did not" in v.text


def test_verdict_too_few_seeds_still_shows_the_numbers(tmp_path):
    synthetic(tmp_path, cory_wins=True, seeds=(0, 1))
    exp = load_experiment(tmp_path)
    v = verdict(exp)
    assert v.answer == "too few seeds" and "PPO has 2, CORY 2" in v.text
    kl = final_value(exp.groups["ppo"], "policy", "kl")
    assert f"{kl.mean:.3g} ± {kl.std:.3g}" in v.text and v.text.count("Not judged: 2 seed(s)") == 2
    assert "p = " not in v.text and "KL ratio PPO/CORY-LLM2" in v.text
    section = build_report(tmp_path).read_text().split("## Verdict")[1].split("## Figures")[0]
    assert "**too few seeds**" in section


def _t_cdf(t: float, df: float) -> float:
    """Student's t CDF at t <= 0 by numerical integration of the density (numpy only)."""
    x = np.linspace(t - 5000.0, t, 4_000_001)
    dens = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) \
        * (1 + x ** 2 / df) ** (-(df + 1) / 2)
    return float(np.trapezoid(dens, x))


def test_unpaired_p_value_by_hand():
    a = Final(np.array([0.9, 1.1, 1.3, 1.0]), 10, [0, 1, 2, 3])
    b = Final(np.array([1.6, 2.4, 2.0]), 10, [0, 1, 2])
    va, vb = a.per_seed.var(ddof=1) / a.n, b.per_seed.var(ddof=1) / b.n
    t = (a.mean - b.mean) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))  # Welch-Satterthwaite
    d = difference(a, b, paired=False)
    assert d.df == pytest.approx(df) and d.mean == pytest.approx(a.mean - b.mean)
    p = p_value(d, "less")
    assert p == pytest.approx(_t_cdf(t, df), rel=1e-4)
    from scipy import stats
    two_sided = stats.ttest_ind(a.per_seed, b.per_seed, equal_var=False).pvalue
    assert p == pytest.approx(two_sided / 2) and p_value(d, "greater") == pytest.approx(1 - two_sided / 2)
    assert 0.001 < p < 0.05


def test_both_constant_decided_by_sign():
    lo, hi = (Final(np.full(3, v), 10, [0, 1, 2]) for v in (1.0, 2.0))
    for paired in (False, True):
        d = difference(lo, hi, paired)
        assert d.constant and p_value(d, "less") == 0.0 and p_value(d, "greater") == 1.0
        same = difference(lo, lo, paired)
        assert same.constant and math.isnan(p_value(same, "less"))
    one = Final(np.array([1.0]), 10, [0])
    assert math.isnan(p_value(difference(one, hi, False), "less"))
    assert math.isnan(p_value(Diff(True, 1.0, float("nan"), float("nan"), 1), "greater"))


def test_confounds_in_report_figures_and_verdict(tmp_path):
    synthetic(tmp_path, cory_wins=True)
    rng = np.random.default_rng(5)
    t = np.arange(15)
    for s in (0, 1, 2):
        write_run(tmp_path, "ppo_norm", s, ppo_rows(0.5 + 0.03 * t + rng.normal(0, .02, 15),
                                                    0.2 * t + rng.normal(0, .1, 15)), {"score_norm": True})
        write_run(tmp_path, "cory_authors", s,
                  cory_rows(0.5 + 0.03 * t + rng.normal(0, .02, 15), 0.1 * t + rng.normal(0, .05, 15),
                            0.5 + 0.03 * t + rng.normal(0, .02, 15), 0.1 * t + rng.normal(0, .05, 15)),
                  {"reset_on_swap": True, "init_kl_coef": 0.4})
        # cory_authors in a --kl_coefs sweep: its own --init_kl_coef 0.4 won, so the folder is no sweep point
        write_run(tmp_path, "cory_authors_kl0.01", s, cory_rows(0.5 + 0 * t, 0.1 * t, 0.5 + 0 * t, 0.1 * t),
                  {"init_kl_coef": 0.4})
    text = build_report(tmp_path).read_text()
    for m in ("task_reward", "kl", "combined_reward"):
        data = (tmp_path / f"fig_confounds_{m}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000 and f"](fig_confounds_{m}.png)" in text
    section = text.split("## Verdict")[1].split("## Figures")[0]
    assert "**yes (power " in section
    extra = section.split("Confounds, same test")[1]
    assert "CORY vs PPO with score normalisation" in extra and "- CORY-LLM1 vs PPO with score normalisation (unpaired, 3 seeds):" in extra
    assert "- CORY with the authors' resets-LLM2 vs PPO (unpaired, 3 seeds):" in extra
    assert extra.count("one-sided p = ") == 4 * 3
    # the final-values table puts the confounds right after PPO and CORY
    table = text.split("## Final values")[1].split("## Samples")[0]
    rows = [r.split("|")[1].strip() for r in table.splitlines() if r.startswith("| ") and "method" not in r]
    assert rows[:6] == ["PPO", "CORY-LLM1", "CORY-LLM2", "PPO with score normalisation",
                        "CORY with the authors' resets-LLM1", "CORY with the authors' resets-LLM2"]
    assert "| CORY with the authors' resets-LLM1 (η=0.01) | 0.4 |" in table
    assert "`cory_authors_kl0.01`: its runs started from init_kl_coef 0.4" in text
    assert ("cory_authors", "llm1") not in sweep_points(load_experiment(tmp_path))


def _drawn(monkeypatch) -> dict:
    """The figures a report draws, by file name, kept instead of written (their legends and axes to read)."""
    from pathlib import Path

    from lab import figures

    drawn = {}  # lab.transfer imports save_figure from lab.figures when it draws
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.__setitem__(Path(path).name, fig))
    return drawn


def _legend(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_a_critic_free_folder_names_its_learner_and_k_in_every_label(tmp_path, monkeypatch):
    """Single-agent GRPO is not labelled plain "PPO": the title, the learners' line, every table row, the samples'
    headings and the figures' legends name the learner and K; a GAE folder's names stay as they were."""
    synthetic(tmp_path / "gae", cory_wins=True)
    synthetic(tmp_path / "grpo", cory_wins=True)
    for config in (tmp_path / "grpo").glob("runs/*/seed_*/config.yaml"):
        config.write_text(config.read_text() + "advantage_estimator: grpo\nnum_generations: 4\n")
    drawn = _drawn(monkeypatch)
    text = build_report(tmp_path / "grpo").read_text()
    assert text.startswith("# CORY vs PPO (GRPO, K = 4): IMDB\n")
    assert "**Learners**" in text and "PPO (GRPO, K = 4): `advantage_estimator: grpo`, `num_generations: 4`" in text
    assert "| PPO (GRPO, K = 4) | 0.2 | 3 |" in text and "| CORY-LLM2 (GRPO, K = 4) | 0.2 | 3 |" in text
    assert "**PPO (GRPO, K = 4)** (seed 0: first and last iteration" in text
    assert "- PPO (GRPO, K = 4): collapsed in 0 of 3 seeds" in text  # the collapse test's lines
    assert "| PPO |" not in text and "| CORY-LLM1 |" not in text and "**PPO**" not in text
    assert _legend(drawn["fig_task_reward.png"]) == [
        "PPO (GRPO, K = 4) (3 seeds)", "CORY-LLM1 (GRPO, K = 4) (3 seeds)", "CORY-LLM2 (GRPO, K = 4) (3 seeds)"]
    drawn.clear()
    text = build_report(tmp_path / "gae").read_text()
    assert text.startswith("# CORY vs PPO: IMDB\n") and "**Learners**" not in text and "| PPO | 0.2 | 3 |" in text
    assert _legend(drawn["fig_task_reward.png"]) == ["PPO (3 seeds)", "CORY-LLM1 (3 seeds)", "CORY-LLM2 (3 seeds)"]


def test_a_learner_is_named_by_the_runs_configs():
    from lab.labels import learner_name

    assert learner_name(None, None) is None and learner_name("gae", 1) is None  # before the switch: GAE's
    assert learner_name("rloo", 4) == "RLOO, K = 4" and learner_name("grpo", 8) == "GRPO, K = 8"
    assert learner_name("gae", 2) == "GAE, K = 2" and learner_name("varies by seed", 4) == "learner varies by seed"
    g = results.Group("ppo_kl0.01", "ppo", 0.01, {0: results.SeedRun(0, None, ppo_rows([1.0], [0.0]),
                                                                     {"advantage_estimator": "rloo",
                                                                      "num_generations": 4})})
    assert g.name("policy") == "PPO (RLOO, K = 4, η=0.01)" and g.name(eta=False) == "PPO (RLOO, K = 4)"


def test_per_iteration_figures_have_integer_iteration_ticks_and_label_every_axis(tmp_path, monkeypatch):
    """A 4-iteration run (matplotlib would tick it at 0.5 steps): every figure along iterations ticks whole
    iterations only, and every axis of every figure is labelled (the transfer panels' y axes too)."""
    synthetic(tmp_path, cory_wins=True, steps=4)
    for seed in (0, 1, 2):
        metrics = tmp_path / "runs" / "cory" / f"seed_{seed}" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        metrics.write_text("".join(json.dumps({**r, "transfer/observer_minus_pioneer": 0.1, "transfer/copy_rate": 0.5,
                                               "transfer/correction_rate": 0.2}) + "\n" for r in rows))
    drawn = _drawn(monkeypatch)
    build_report(tmp_path)
    along = ["fig_task_reward.png", "fig_kl.png", "fig_combined_reward.png", "fig_response_length.png",
             "fig_heldout_reward.png", "fig_transfer.png"]
    assert set(along) <= set(drawn), sorted(drawn)
    for name, fig in drawn.items():
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel(), (name, ax.get_title())
            if name in along:
                ax.figure.canvas.draw()
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
