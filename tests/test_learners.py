"""The learner pilot's summary (lab.learners): whether a seed learned is read as the design states it (best held-out
accuracy after iteration 0, at least min_gain above the run's own iteration 0), runs from before the switch read as
GAE's, and the committed GAE runs of the horizon comparison give the rows their own files give."""
import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import REPO
from entry_points import lab, refused, succeeded, tree
from lab.learners import AgentSeed, build_summary, compute_of, estimator, read_folder
from lab.results import load_experiment

HORIZON = REPO / "results" / "arithmetic_cpu_horizon"


@pytest.fixture
def horizon(tmp_path):
    out = tmp_path / "horizon"
    shutil.copytree(HORIZON / "runs", out / "runs")
    shutil.copytree(HORIZON / "logs", out / "logs", ignore=shutil.ignore_patterns("eval"))  # each run's precision
    shutil.copy(HORIZON / "runs.json", out / "runs.json")
    return out


def test_learned_is_the_best_after_iteration_0_at_least_min_gain_above_it():
    def seed(best):
        return AgentSeed("PPO", 0, 0.265, (10, best), (30, 0.3), 5.0, 100.0)
    assert seed(0.415).learned(0.15)  # exactly the bar (0.265 + 0.15, inexact in binary) counts
    assert not seed(0.41).learned(0.15)
    assert not AgentSeed("PPO", 0, 0.265, None, None, None, None).learned(0.15)


def test_the_horizon_runs_read_as_gae_with_their_own_numbers(horizon):
    exp = load_experiment(horizon)
    assert estimator(exp.groups["ppo"]) == "gae" and estimator(exp.groups["cory"]) == "gae"
    notes = []
    rows = {(a.name, a.seed): a for _, agents in read_folder(exp, notes) for a in agents}
    evals = [json.loads(line) for line in (horizon / "runs/ppo/seed_0/eval.jsonl").read_text().splitlines()]
    ppo = rows["PPO", 0]
    assert ppo.base == next(r["task_reward"] for r in evals if r["iterations"] == 0) == 0.265
    best = max((r for r in evals if r["iterations"] > 0), key=lambda r: r["task_reward"])
    assert ppo.best == (best["iterations"], best["task_reward"]) == (30, 0.48) and ppo.learned(0.15)
    llm2 = rows["CORY-LLM2", 0]
    assert llm2.best[1] == 0.405 and not llm2.learned(0.15)  # 0.14 above its iteration 0
    rows_of_cory = [json.loads(line) for line in (horizon / "runs/cory/seed_0/metrics.jsonl").read_text().splitlines()]
    times = [r["time/iteration_s"] for r in rows_of_cory if r["step"] > 0]  # the first iteration loads and warms up
    assert rows["CORY-LLM1", 0].seconds == rows["CORY-LLM2", 0].seconds == pytest.approx(float(np.median(times)))
    assert not notes


def test_a_critic_free_folder_names_its_learner_and_the_ratio_to_gae(horizon, tmp_path):
    pilot = tmp_path / "pilot"
    shutil.copytree(horizon / "runs" / "ppo", pilot / "runs" / "ppo")
    shutil.copytree(horizon / "logs" / "ppo", pilot / "logs" / "ppo")  # each run's precision line
    for config in pilot.glob("runs/ppo/seed_*/config.yaml"):  # every seed the horizon folder holds
        config.write_text(config.read_text() + "advantage_estimator: rloo\nnum_generations: 4\n")
    assert estimator(load_experiment(pilot).groups["ppo"]) == "rloo, K = 4"
    summary = build_summary(pilot, horizon).read_text()
    assert "| pilot | rloo, K = 4 | PPO | 0 | 0.265 | 0.48 (30) |" in summary
    assert "| horizon | gae | PPO | 0 | 0.265 | 0.48 (30) |" in summary
    # the same runs: the same cost, set against GAE's runs that computed alike
    assert "- PPO: rloo, K = 4 on fp32, no native bf16: " in summary and "(1x GAE's alike)" in summary
    assert (pilot / "fig_learners.png").stat().st_size > 0


def test_a_cost_is_set_against_gae_only_where_it_computed_alike(horizon, tmp_path):
    """A run on an AMX CPU is not set against runs on CPUs without native bf16; a run with no log, against none."""
    pilot = tmp_path / "pilot"
    shutil.copytree(horizon / "runs" / "ppo", pilot / "runs" / "ppo", ignore=shutil.ignore_patterns("seed_[2-9]"))
    (pilot / "logs" / "ppo").mkdir(parents=True)
    (pilot / "logs" / "ppo" / "seed_0.log").write_text(
        "start\nprecision: fp32 (auto on a CPU with AMX, where bf16 was measured 0.88-1.22x fp32's speed)\n")
    for config in pilot.glob("runs/ppo/seed_*/config.yaml"):
        config.write_text(config.read_text() + "advantage_estimator: rloo\nnum_generations: 4\n")
    assert compute_of(pilot, "ppo", 0) == "fp32, AMX" and compute_of(pilot, "ppo", 1) == "?"
    assert compute_of(horizon, "cory", 0) == "fp32, no native bf16"
    summary = build_summary(pilot, horizon).read_text()
    assert "rloo, K = 4 on fp32, AMX: " in summary and "rloo, K = 4 on ?: " in summary
    assert "GAE's alike)" not in summary and summary.count("(no GAE run alike)") == 2
    assert "| pilot | rloo, K = 4 | PPO | 0 | 0.265 | 0.48 (30) | 0.48 (30) | 7.17 | **yes** |" in summary
    assert (pilot / "fig_learners.png").stat().st_size > 0


def test_the_summary_rebuilds_the_same_and_leaves_the_runs_alone(horizon):
    before = tree(horizon / "runs")
    succeeded(lab("learners", horizon))
    first = (horizon / "SUMMARY.md").read_text()
    assert first.startswith("# ARITHMETIC, cpu preset: the learner pilot\n")
    assert f"Generated by `python -m lab.learners {horizon.as_posix()}`" in first
    assert "## Knowledge transfer" in first and "copy rate" in first
    # the held-out readings too, each agent as the observer at every evaluation (iteration 0: the base model)
    assert "On the held-out questions" in first and "| observer | measure | 0 | 5 |" in first
    succeeded(lab("learners", horizon))
    assert (horizon / "SUMMARY.md").read_text() == first
    assert tree(horizon / "runs") == before


@pytest.mark.parametrize("args,message", [
    (["--min_gain", "nan"], "--min_gain: expected a finite number, got nan"),
    (["--against", "NOWHERE"], "--against NOWHERE: no runs/ folder"),
    (["--min_gan", "0.1"], "unrecognized arguments: --min_gan 0.1"),
    (["--min_gain=-0.1"], "--min_gain: expected a finite number, got -0.1; allowed: 0 or more"),
    (["--min_gain=-inf", "--against", "NOWHERE"], "--min_gain: expected a finite number, got -inf"),  # first
    (["--against", "HERE"], "--against HERE: the folder summarised (HERE); give each other folder once"),
    (["--against", "OTHER", "--against", "OTHER/."], "--against OTHER/.: given already (OTHER)"),
])
def test_the_summarys_mistakes_are_one_line_and_write_nothing(horizon, tmp_path, args, message):
    """Each refused before any folder is read: -0.1 counted every seed as learned, and a folder given twice (or the
    folder itself) read its rows twice."""
    names = {"NOWHERE": tmp_path / "nowhere", "HERE": horizon, "OTHER": tmp_path / "other"}
    shutil.copytree(horizon / "runs" / "ppo", names["OTHER"] / "runs" / "ppo")
    args = [str(a) for a in args]
    for name, path in names.items():
        args, message = [a.replace(name, str(path)) for a in args], message.replace(name, str(path))
    before = tree(horizon)
    refused(lab("learners", horizon, *args), message)
    assert tree(horizon) == before


@pytest.mark.parametrize("theirs", [
    "# The search\n\nGenerated by `python -m lab.search results/x` from the metrics in its folders.\n",
    "# The search\n\nGenerated by `python -m cory.lab.search results/x --within 30` from the metrics.\n",
    "my own notes on these runs\n",
])
def test_the_summary_never_replaces_a_summary_md_it_did_not_write(horizon, theirs):
    """lab.search's SUMMARY.md has the same name (results/arithmetic_cpu_pilot holds one): it was replaced."""
    (horizon / "SUMMARY.md").write_text(theirs)
    before = tree(horizon)
    refused(lab("learners", horizon), f"SUMMARY.md: {horizon / 'SUMMARY.md'} was not written by `python -m "
                                      "lab.learners`", "move it away, or give lab.learners another folder")
    assert tree(horizon) == before


def _broken_links(document) -> list[str]:
    """The relative links of a generated document whose file is not beside it."""
    import re

    return [t for t in re.findall(r"\]\(([^)\s#]+)", document.read_text())
            if not re.match(r"[a-z]+:", t) and not (document.parent / t).exists()]


def test_the_summary_links_the_design_only_where_the_folder_has_one(horizon):
    summary = build_summary(horizon)
    assert not (horizon / "DESIGN.md").exists() and "DESIGN.md" not in summary.read_text()
    assert not _broken_links(summary)
    (horizon / "DESIGN.md").write_text("# The pilot's design\n")
    summary = build_summary(horizon)
    assert "the design, fixed before the runs, is in [DESIGN.md](DESIGN.md)" in summary.read_text()
    assert not _broken_links(summary)


def test_the_learners_figure_ticks_whole_iterations_and_labels_its_axes(horizon, monkeypatch):
    from lab import learners

    drawn = []
    monkeypatch.setattr(learners, "save_figure", lambda fig, path: drawn.append(fig))
    build_summary(horizon)
    (fig,) = drawn
    for ax in fig.axes:
        ax.set_xlim(0, 3)  # a short run's range, where matplotlib would tick at 0.5 steps
        fig.canvas.draw()
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()
        assert ax.get_xlabel() == "iterations"
    assert fig.axes[0].get_ylabel() == "held-out accuracy (sampled)"  # the panels share it


@pytest.mark.parametrize("where", ["logs/ppo/seed_0.log", "runs/cory/seed_1/eval.jsonl", "runs.json", "notes.md"])
def test_a_pipe_in_a_folder_read_is_refused_not_waited_on(horizon, tmp_path, where):
    """A run's log (its precision line) hung the summary: it was opened, and a pipe waits for a writer. In the folder
    or in an --against folder, any file: refused in one line naming it, before anything is written."""
    other = tmp_path / "other"
    shutil.copytree(horizon, other)
    (other / where).unlink(missing_ok=True)
    os.mkfifo(other / where)
    before = tree(horizon)
    for args in ([other], [horizon, "--against", other]):
        refused(lab("learners", *args, timeout=120), f"{other / where}: a named pipe, not a regular file",
                f"move it out of {other}")
        assert tree(horizon) == before


def test_a_summary_md_that_is_a_pipe_is_refused_as_the_target_it_is(horizon):
    os.mkfifo(horizon / "SUMMARY.md")
    before = tree(horizon)
    refused(lab("learners", horizon, timeout=120), f"SUMMARY.md: {horizon / 'SUMMARY.md'} exists and is a named pipe")
    assert tree(horizon) == before


def test_a_run_log_that_is_a_pipe_reads_as_no_precision(horizon):
    """The reader itself never waits on a pipe: the log is opened without blocking and read only if regular."""
    log = horizon / "logs" / "ppo" / "seed_0.log"
    log.unlink()
    os.mkfifo(log)
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(compute_of(horizon, "ppo", 0)), daemon=True)
    reader.start()
    reader.join(20)
    waited = reader.is_alive()
    if waited:  # be the writer it waits for, so that it ends
        os.close(os.open(log, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(20)
    assert not waited and read == ["?"]


def test_a_dirty_invocation_is_named_as_the_report_names_it(horizon):
    doc = json.loads((horizon / "runs.json").read_text())
    doc["invocations"][0]["git_dirty"] = True
    (horizon / "runs.json").write_text(json.dumps(doc))
    runs = next(line for line in build_summary(horizon).read_text().splitlines() if line.startswith("Runs: "))
    first, *others = runs.split("; ")
    assert first.endswith("` at f560d23 (with uncommitted changes)")
    assert others and not any("uncommitted" in part for part in others)


# SUMMARY.md's writing, stopped by a SIGTERM halfway through its temporary file
STOPPED_MIDWAY = """
import os, signal, sys
import lab.learners as learners
whole = learners.write_atomically
def halfway(path, text):
    def fill(tmp):
        tmp.write_text(text[:100])
        os.kill(os.getpid(), signal.SIGTERM)
    whole(path, fill)
learners.write_atomically = halfway
learners.main([sys.argv[1]])
"""


def test_a_sigterm_is_a_clean_stop_that_leaves_no_temporary_file(horizon):
    """It ended the process where it stood, leaving .SUMMARY.md.<pid>-<hex>.tmp; now it stops as Ctrl-C does."""
    p = subprocess.run([sys.executable, "-c", STOPPED_MIDWAY, str(horizon)], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert p.returncode == 130 and p.stderr.strip() == "interrupted: the files written so far are whole", \
        (p.returncode, p.stderr[-2000:])
    assert not (horizon / "SUMMARY.md").exists()
    assert not [f for f in horizon.iterdir() if f.name.endswith(".tmp")]


@pytest.mark.parametrize("damage,says", [
    (lambda doc: 7, "runs.json holds a JSON number, not the runner's record"),
    (lambda doc: {**doc, "invocations": [1, 2]}, "runs.json's invocations are not a list of objects"),
    (lambda doc: {**doc, "invocations": {"command": "x"}}, "runs.json's invocations are not a list of objects"),
    (lambda doc: {**doc, "runs": {"ppo/seed_0": "finished"}},
     "runs.json's run 'ppo/seed_0' is a JSON string, not a run's record"),
])
def test_a_runs_json_of_another_shape_is_named_not_used(horizon, damage, says):
    """Its invocations were read as records (a traceback); now it is named in the notes, as the report names it."""
    doc = json.loads((horizon / "runs.json").read_text())
    (horizon / "runs.json").write_text(json.dumps(damage(doc)))
    summary = build_summary(horizon).read_text()
    assert says in summary and "Runs: " not in summary
