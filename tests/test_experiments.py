"""The experiment runner: planning (no training), and skip/resume on the tiny preset (real runs)."""
import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from lab import experiments
from lab.experiments import build_parser, plan
from lab.runs import command, pair_state
from cory.run.outputs import read_jsonl


def planned(*argv):
    return plan(build_parser().parse_args(list(argv)))


def by_key(pairs):
    return {p.key: p for p in pairs}


def test_plan_maps_methods_to_scripts_and_flags(tmp_path):
    pairs, spec = planned("--task", "imdb", "--preset", "tiny", "--methods", "ppo,cory,cory_no_kt,cory_no_swap",
                          "--seeds", "0,1", "--steps", "3", "--out", str(tmp_path / "x"),
                          "--set", "learning_rate=5e-5", "--set", "swap_period=3")
    assert len(pairs) == 8
    p = by_key(pairs)
    assert p["ppo/seed_1"].script == "imdb_train/ppo.py" and p["ppo/seed_1"].preset == "configs/imdb/ppo_tiny.yaml"
    # swap_period is not a PPO field: it only reaches the CORY runs; the ablations' own flags come last and win
    assert p["ppo/seed_0"].flags == ["--learning_rate", "5e-5"]
    assert p["cory/seed_0"].flags == ["--learning_rate", "5e-5", "--swap_period", "3"]
    assert p["cory_no_kt/seed_0"].flags[-2:] == ["--knowledge_transfer", "false"]
    assert p["cory_no_swap/seed_0"].flags[-2:] == ["--swap_period", "0"]
    assert p["cory_no_swap/seed_0"].intended["swap_period"] == 0
    cmd = command(p["cory/seed_1"], "new")
    assert cmd[1:] == ["imdb_train/cory.py", "--config", "configs/imdb/cory_tiny.yaml", "--learning_rate", "5e-5",
                       "--swap_period", "3", "--seed", "1", "--steps", "3", "--output_dir",
                       str(tmp_path / "x" / "runs" / "cory" / "seed_1")]
    assert command(p["ppo/seed_0"], "resume")[-2:] == ["--resume", str(p["ppo/seed_0"].run_dir)]
    assert command(p["ppo/seed_0"], "overwrite")[-2:] == ["--overwrite", "true"]
    # the preset's steps when --steps is not given
    pairs, _ = planned("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--out", str(tmp_path / "y"))
    assert pairs[0].steps == 3
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_plan_kl_sweep_folders(tmp_path):
    pairs, spec = planned("--task", "imdb", "--preset", "tiny", "--methods", "ppo,cory", "--seeds", "0", "--kl_coefs", "0.01,1e-5",
                          "--out", str(tmp_path))
    assert sorted(p.key for p in pairs) == ["cory_kl0.01/seed_0", "cory_kl1e-05/seed_0", "ppo_kl0.01/seed_0",
                                            "ppo_kl1e-05/seed_0"]
    p = by_key(pairs)["ppo_kl1e-05/seed_0"]
    assert p.flags == ["--init_kl_coef", "1e-05"] and p.intended["init_kl_coef"] == 1e-5
    assert p.run_dir == tmp_path / "runs" / "ppo_kl1e-05" / "seed_0"


@pytest.mark.parametrize("argv,message", [
    (["--task", "mnist"], "--task: 'mnist' is not one of arithmetic, gsm8k, imdb"),
    (["--preset", "huge"], "--preset: 'huge' is not one of cpu, gpu, paper, tiny"),
    (["--methods", "ppo,dpo"], "--methods: 'dpo' is not one of ppo, cory, cory_no_kt, cory_no_swap, ppo_2x, "
                               "ppo_norm, cory_norm, cory_authors"),
    (["--seeds", "0,x"], "--seeds: expected an integer, got 'x'"),
    (["--steps", "0"], "--steps: must be >= 1, got 0"),
    (["--kl_coefs", "0.1,-1"], "--kl_coefs: must be finite and >= 0, got -1"),
    (["--set", "lr=1"], "--set lr: unknown field"),
    (["--set", "seed=3"], "--set seed: set by the runner itself"),
    (["--methods", "ppo", "--set", "swap_period=3"], "--set swap_period: not a field of any of the methods ppo"),
    (["--set", "batch_size=3"], "ppo: batch_size: 3 is not divisible"),
    (["--methods", "ppo_2x"], "--methods ppo_2x: no model twice the size of 'tiny' is known"),
    (["--jobs", "0"], "--jobs: must be >= 1, got 0"),
])
def test_user_mistakes_one_line_exit_2_nothing_written(tmp_path, capsys, argv, message):
    out = tmp_path / "exp"
    with pytest.raises(SystemExit) as e:
        experiments.main(["--task", "imdb", "--preset", "tiny", "--out", str(out), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_plan_confounds_score_norm_and_the_authors_resets(tmp_path):
    pairs, _ = planned("--task", "imdb", "--preset", "tiny", "--methods", "ppo,cory,ppo_norm,cory_authors", "--seeds", "0",
                       "--out", str(tmp_path / "x"))
    p = by_key(pairs)
    assert p["ppo_norm/seed_0"].script == "imdb_train/ppo.py" and p["ppo_norm/seed_0"].flags == ["--score_norm", "true"]
    assert p["ppo_norm/seed_0"].preset == "configs/imdb/ppo_tiny.yaml"
    assert p["ppo_norm/seed_0"].intended["score_norm"] is True and p["ppo/seed_0"].flags == []
    a = p["cory_authors/seed_0"]
    assert a.script == "imdb_train/cory.py" and a.preset == "configs/imdb/cory_tiny.yaml"
    assert a.flags == ["--reset_on_swap", "true", "--init_kl_coef", "0.4"]
    assert a.intended["reset_on_swap"] is True and a.intended["init_kl_coef"] == 0.4
    assert p["cory/seed_0"].flags == []
    cmd = command(a, "new")
    assert cmd[1:8] == ["imdb_train/cory.py", "--config", "configs/imdb/cory_tiny.yaml", "--reset_on_swap", "true",
                        "--init_kl_coef", "0.4"]
    # the method's own init_kl_coef comes last and wins over --kl_coefs and --set (as the help says)
    pairs, _ = planned("--task", "imdb", "--preset", "tiny", "--methods", "cory_authors", "--seeds", "0", "--kl_coefs", "0.01",
                       "--out", str(tmp_path / "y"))
    assert pairs[0].label == "cory_authors_kl0.01" and pairs[0].intended["init_kl_coef"] == 0.4
    assert pairs[0].flags == ["--init_kl_coef", "0.01", "--reset_on_swap", "true", "--init_kl_coef", "0.4"]
    pairs, _ = planned("--task", "imdb", "--preset", "tiny", "--methods", "cory_authors", "--seeds", "0", "--set", "init_kl_coef=0.2",
                       "--out", str(tmp_path / "z"))
    assert pairs[0].intended["init_kl_coef"] == 0.4
    assert "cory_authors" in build_parser().format_help() and "0.4" in experiments.__doc__
    assert not any((tmp_path / d).exists() for d in "xyz")


@pytest.mark.parametrize("out", ["", "   "])
def test_empty_out_refused_before_anything_is_written(tmp_path, monkeypatch, capsys, out):
    monkeypatch.chdir(tmp_path)  # an empty --out would resolve to the current folder
    with pytest.raises(SystemExit) as e:
        experiments.main(["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--out", out])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: --out: must name the experiment folder")
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("recorded, given, says", [
    ({}, ["--set", "advantage_estimator=rloo", "--set", "num_generations=2"],
     "--set advantage_estimator: this command has it 'advantage_estimator=rloo', but the runs in "),
    ({"advantage_estimator": "rloo"}, [], "--set advantage_estimator: this command has it not set, but the runs in "),
    ({"learning_rate": "1e-4"}, ["--set", "learning_rate=5e-5"],
     "--set learning_rate: this command has it 'learning_rate=5e-5', but the runs in "),
])
def test_a_second_command_with_other_set_values_into_one_folder_is_refused(tmp_path, capsys, recorded, given, says):
    """Issue 75: another learner's runs were added to a folder whose report then compared them with the first's,
    and runs.json's experiment-wide set was overwritten for the runs that did not use it."""
    out = tmp_path / "exp"
    out.mkdir()
    record = {"task": "imdb", "preset": "tiny", "set": recorded, "runs": {"ppo/seed_0": {"attempts": []}}}
    (out / "runs.json").write_text(json.dumps(record))
    before = (out / "runs.json").read_text()
    with pytest.raises(SystemExit) as e:
        experiments.main(["--task", "imdb", "--preset", "tiny", "--methods", "cory", "--seeds", "0", "--out", str(out),
                          "--no_eval", *given])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {says}") and len(err.strip().splitlines()) == 1, err
    assert "made with it" in err and "use a new --out folder" in err
    assert (out / "runs.json").read_text() == before and sorted(p.name for p in out.iterdir()) == ["runs.json"]
    # the same --set, in another order, is the same experiment
    args = build_parser().parse_args(["--task", "imdb", "--preset", "tiny", "--out", str(out)])
    experiments._check_experiment_folder(args, {"task": "imdb", "preset": "tiny", "set": dict(recorded)}, out)


def test_ppo_2x_without_a_larger_model_offline(tmp_path, capsys):
    # the cpu preset's larger sibling is a hub model: offline (conftest) it is unavailable, said in one line
    with pytest.raises(SystemExit) as e:
        experiments.main(["--task", "imdb", "--preset", "cpu", "--methods", "ppo,ppo_2x", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "ppo_2x" in err and "SmolLM2-360M" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text("{}")
    pairs, _ = planned("--task", "imdb", "--preset", "tiny", "--methods", "ppo_2x", "--model_2x", str(tmp_path / "big"),
                       "--seeds", "0", "--out", str(tmp_path / "y"))
    assert pairs[0].flags == ["--model_name", str(tmp_path / "big")] and pairs[0].script == "imdb_train/ppo.py"


def runner(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "lab.experiments", *map(str, argv)], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout)


def attempts(out):
    runs = json.loads((out / "runs.json").read_text())["runs"]
    return {k: [a["mode"] for a in r["attempts"]] for k, r in runs.items()}


@pytest.mark.slow
def test_runner_runs_skips_and_resumes(tmp_path, capsys):
    out = tmp_path / "exp"
    # a checkpoint every iteration (two kept), so a run cut off in its last iteration has one to resume from
    base = ["--task", "imdb", "--preset", "tiny", "--seeds", "0,1", "--steps", "2", "--out", out,
            "--set", "save_every=1", "--set", "keep_checkpoints=2", "--jobs", "2", "--no_eval"]
    p = runner(*base, "--methods", "ppo,cory")
    assert p.returncode == 0, p.stderr[-3000:]
    assert attempts(out) == {k: ["new"] for k in ("ppo/seed_0", "ppo/seed_1", "cory/seed_0", "cory/seed_1")}
    record = json.loads((out / "runs.json").read_text())
    assert record["invocations"][0]["ran"] == 4 and record["invocations"][0]["git_commit"]
    # the machine beside the wall times: the CPU kind decides which precision is fastest
    assert set(record["invocations"][0]["cpu"]) == {"model", "cores", "flags"}
    for r in record["runs"].values():
        a = r["attempts"][0]
        assert a["exit_status"] == 0 and a["wall_time_s"] > 0 and a["command"].startswith("python imdb_train/")
        assert r["status"] == "finished"
    for key in ("ppo/seed_0", "cory/seed_1"):
        assert [row["step"] for row in read_jsonl(out / "runs" / key / "metrics.jsonl")] == [0, 1]
    report = (out / "REPORT.md").read_text()
    assert "## Verdict" in report and (out / "fig_kl.png").stat().st_size > 0

    # again: everything is finished, nothing runs
    p = runner(*base, "--methods", "ppo,cory")
    assert p.returncode == 0, p.stderr[-3000:]
    assert attempts(out) == {k: ["new"] for k in ("ppo/seed_0", "ppo/seed_1", "cory/seed_0", "cory/seed_1")}
    assert json.loads((out / "runs.json").read_text())["invocations"][1]["skipped"] == 4
    assert p.stdout.count("skip ") == 4

    # a run made with other settings is not mixed in: one line, exit 2, nothing runs
    before = (out / "runs.json").read_text()
    with pytest.raises(SystemExit) as e:
        experiments.main([*map(str, base), "--methods", "ppo", "--set", "learning_rate=5e-5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "learning_rate" in err and len(err.strip().splitlines()) == 1
    assert (out / "runs.json").read_text() == before

    # cut one run off in its last iteration: no final/, no last row, no checkpoint after iteration 1
    cut = out / "runs" / "cory" / "seed_1"
    shutil.rmtree(cut / "final")
    shutil.rmtree(cut / "checkpoints" / "step_000002")
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1][:40])  # the kill cut the last line
    first_row = lines[0]
    # and add a method whose model cannot load: its runs fail, the resumed run still completes
    broken = tmp_path / "not_a_model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes the config check, fails to load
    p = runner(*base, "--methods", "ppo,cory,ppo_2x", "--model_2x", broken)
    assert p.returncode == 1, p.stderr[-3000:]
    assert attempts(out) == {"ppo/seed_0": ["new"], "ppo/seed_1": ["new"], "cory/seed_0": ["new"],
                             "cory/seed_1": ["new", "resume"], "ppo_2x/seed_0": ["new"], "ppo_2x/seed_1": ["new"]}
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert runs["cory/seed_1"]["attempts"][1]["command"].endswith(f"--resume {cut}")
    assert runs["cory/seed_1"]["status"] == "finished"
    assert runs["ppo_2x/seed_0"]["status"] == "failed" and runs["ppo_2x/seed_0"]["attempts"][0]["exit_status"] != 0
    assert "FAILED ppo_2x/seed_0" in p.stderr and "2 of 6 run(s) failed" in p.stderr
    assert [row["step"] for row in read_jsonl(cut / "metrics.jsonl")] == [0, 1]
    assert (cut / "metrics.jsonl").read_text().splitlines()[0] == first_row  # resumed, not redone
    assert (cut / "final" / "llm1").is_dir()
    assert "ppo_2x" in (out / "REPORT.md").read_text()

    # the states the runner reads, on the folders it wrote (no training)
    pairs = by_key(planned(*map(str, base), "--methods", "ppo,cory")[0])
    assert pair_state(pairs["cory/seed_1"])[0] == "finished"
    shutil.rmtree(cut / "final")
    assert pair_state(pairs["cory/seed_1"])[0] == "resume"
    shutil.rmtree(cut / "checkpoints")
    # every row and no weights at all, as a committed results folder: its metrics are kept, not redone
    assert pair_state(pairs["cory/seed_1"]) == ("finished", "finished (2 iterations; weights not kept)")
    rows = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text(rows[0] + "\n")
    assert pair_state(pairs["cory/seed_1"])[0] == "overwrite"
    # asking for more iterations continues a finished run from its last checkpoint
    longer = planned("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "5", "--out", str(out),
                     "--set", "save_every=1", "--set", "keep_checkpoints=2")[0][0]
    assert pair_state(longer)[0] == "resume"


def test_runs_json_lists_the_methods_and_seeds_of_every_command(tmp_path):
    """A second command adding methods to a folder (e.g. the confounds after the main comparison) keeps the
    first command's methods, seeds and KL coefficients in runs.json's summary, in the order they came."""
    spec = {"task": "imdb", "preset": "tiny", "methods": ["ppo", "cory"], "seeds": [0, 1], "steps": 2,
            "kl_coefs": None, "set": {}, "jobs": 1, "out": tmp_path}
    experiments.Record(tmp_path, spec).save()
    record = experiments.Record(tmp_path, {**spec, "methods": ["cory", "ppo_norm"], "seeds": [2],
                                           "kl_coefs": [0.1]})
    assert record.data["methods"] == ["ppo", "cory", "ppo_norm"]
    assert record.data["seeds"] == [0, 1, 2]
    assert record.data["kl_coefs"] == [0.1]
    assert experiments.Record(tmp_path, spec).data["kl_coefs"] is None  # never saved: nothing to keep


def _runner_with_a_logged_row(out, stdout):
    """(the runner, its run's pid): a tiny 500-iteration PPO run started by the runner into ``out``, once the run
    has logged its first metrics row."""
    import time

    proc = subprocess.Popen([sys.executable, "-m", "lab.experiments", "--task", "imdb", "--preset", "tiny",
                             "--methods", "ppo", "--seeds", "0", "--steps", "500", "--set", "save_every=1000",
                             "--out", str(out)], cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True)
    metrics = out / "runs" / "ppo" / "seed_0" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    return proc, json.loads((out / "runs.json").read_text())["runs"]["ppo/seed_0"]["attempts"][0]["pid"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_sigterm_to_the_runner_reaches_its_run_and_is_recorded(tmp_path, capsys, signum):
    """SIGTERM (a scheduler, ``kill``), or SIGHUP (the terminal or ssh session closed), to the runner alone: its run
    saves a checkpoint and stops (as on SIGTERM), no orphan goes on training, and the run is recorded as cut off."""
    import os
    import signal
    import time

    from cory.run.outputs import latest_checkpoint

    out = tmp_path / "exp"
    proc, child = _runner_with_a_logged_row(out, stdout=subprocess.PIPE)
    with pytest.raises(SystemExit) as e:  # a second runner into the same experiment folder
        experiments.main(["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "500",
                          "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"being written by another experiment runner (pid {proc.pid} on " in err and len(err.strip().splitlines()) == 1
    proc.send_signal(getattr(signal, signum))  # to the runner alone
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    with pytest.raises(ProcessLookupError):  # the run stopped too: no orphan left training
        os.kill(child, 0)
    run = json.loads((out / "runs.json").read_text())["runs"]["ppo/seed_0"]
    assert run["status"] == "interrupted" and run["attempts"][0]["exit_status"] == 128 + signal.SIGTERM
    assert latest_checkpoint(out / "runs" / "ppo" / "seed_0") is not None  # it saved before stopping


@pytest.mark.slow
def test_runner_evaluates_finished_runs_and_the_base_model_once(tmp_path):
    out = tmp_path / "exp"
    base = ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "1", "--out", out]
    p = runner(*base)
    assert p.returncode == 0, p.stderr[-3000:]
    run = out / "runs" / "ppo" / "seed_0"
    doc = json.loads((run / "eval_imdb.json").read_text())
    assert [r["name"] for r in doc["results"]] == ["seed_0/policy"]
    assert doc["command"] == f"python -m lab.evaluate --task imdb --model {run} --no_base --json {run}/eval_imdb.json"
    base_doc = json.loads((out / "eval_base_imdb.json").read_text())
    assert [r["name"] for r in base_doc["results"]] == ["base"] and base_doc["settings"]["dataset"] == "builtin"
    assert base_doc["results"][0]["kl"] == 0 and base_doc["results"][0]["reward_sd"] > 0
    report = (out / "REPORT.md").read_text()
    assert "fig_heldout_reward.png" in report and "| base model | 1 |" in report
    # again: nothing to train, nothing to evaluate
    p = runner(*base)
    assert p.returncode == 0 and "eval " not in p.stdout, p.stdout[-2000:]


def test_runner_evaluates_pass_at_k_tasks_only_with_a_budget(tmp_path):
    from lab import heldout_runs

    assert heldout_runs.wanted("imdb", []) is None
    why = heldout_runs.wanted("gsm8k", [])
    assert "pass@k" in why and "--eval_args" in why
    assert heldout_runs.wanted("gsm8k", ["--limit", "20", "--n", "2"]) is None


@pytest.mark.slow
def test_a_runner_killed_outright_takes_its_run_down_checkpointed(tmp_path):
    """SIGKILL cannot be caught, so the runner cannot pass it on: its run sees at the end of its iteration that its
    parent is no longer the runner, and saves a checkpoint and stops instead of training on with nobody watching."""
    import os
    import signal
    import time

    from cory.run.outputs import latest_checkpoint

    out = tmp_path / "exp"
    proc, child = _runner_with_a_logged_row(out, stdout=subprocess.DEVNULL)
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 300
    while True:  # the run finishes its iteration, saves and exits
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the run went on training after its runner was killed"
        time.sleep(0.2)
    assert latest_checkpoint(out / "runs" / "ppo" / "seed_0") is not None
    log = (out / "logs" / "ppo" / "seed_0.log").read_text()
    assert "Traceback" not in log and "is gone: stopping after this iteration" in log, log[-2000:]
    assert "stopped (its experiment runner, pid " in log and "checkpoint of" in log, log[-2000:]


def test_the_runner_bar_shows_each_running_run_s_iteration_and_eta(tmp_path, monkeypatch):
    from lab.runs import Pair, Progress
    run_dir = tmp_path / "runs" / "ppo" / "seed_0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(2)))
    pair = Pair(method="ppo", seed=0, kl_coef=None, script="x.py", preset=None, flags=[], run_dir=run_dir,
                steps=10, intended={})
    clock = iter([100.0, 160.0])
    monkeypatch.setattr("lab.runs.time.monotonic", lambda: next(clock))
    progress = Progress()
    progress.start(pair)  # resumed at 2 of 10: those two do not count towards the rate
    assert progress.line() == "ppo/seed_0 2/10"
    (run_dir / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(4)))
    assert progress.line() == "ppo/seed_0 4/10 ETA 3m"  # 2 iterations in 60 s, 6 to go: 180 s
    progress.end(pair)
    assert progress.line() == ""
