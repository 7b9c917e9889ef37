"""A committed run is read-only to every command. Nothing restarts, overwrites, truncates or
deletes a run folder whose files no command wrote in this folder (a copy or a clone: a committed results/ folder),
nor a finished run's results without a checkpoint to resume from; ``--resume`` of a finished run changes nothing;
the runner's ``--out`` is never a user's folder nor inside a run. Each case through its real entry point: exit
status, one line, and the folder's files (contents and times) the same before and after."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, run_script
from cory.run.outputs import latest_checkpoint, read_jsonl

COMMITTED = REPO / "results" / "imdb_cpu_learning"  # 20 iterations of PPO and CORY: no checkpoints, no final/


def tree(folder):
    """Every file and folder under ``folder`` (hidden ones too) with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def refused(p, *named):
    """``p`` exited 2 with one line on stderr, naming each of ``named``; the line."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (p.returncode, p.stderr[-2000:])
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def runner(*args):
    return subprocess.run([sys.executable, "-m", "lab.experiments", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=900)


@pytest.fixture
def committed(tmp_path):
    """A copy of a committed experiment folder, as a clone has it."""
    out = tmp_path / "imdb_cpu_learning"
    shutil.copytree(COMMITTED, out)
    return out


# ----------------------------------------------------------------------------- the runner on a committed experiment

def test_the_runner_never_reruns_a_committed_run_to_extend_it(committed):
    before = tree(committed)
    line = refused(runner("--task", "imdb", "--preset", "cpu", "--methods", "ppo", "--seeds", "0", "--steps", "30",
                          "--out", committed),
                   f"{committed}/runs/ppo/seed_0 holds a run copied or cloned", "metrics.jsonl (20 rows)",
                   "eval_imdb.json", "rerun with --steps 30 into a new --out")
    assert "no checkpoint" in line
    assert tree(committed) == before


def test_the_runner_never_reruns_a_committed_run_missing_its_config(committed):
    (committed / "runs" / "ppo" / "seed_1" / "config.yaml").unlink()
    before = tree(committed)
    refused(runner("--task", "imdb", "--preset", "cpu", "--methods", "ppo", "--seeds", "0,1", "--steps", "20",
                   "--out", committed),
            f"{committed}/runs/ppo/seed_1 holds a run copied or cloned", "its config.yaml is missing")
    assert tree(committed) == before


def test_the_runner_names_a_committed_runs_config_that_is_not_utf8_as_such(committed):
    config = committed / "runs" / "ppo" / "seed_1" / "config.yaml"
    config.write_bytes(config.read_bytes() + b"# caf\xe9\n")  # a Latin-1 byte
    before = tree(committed)
    refused(runner("--task", "imdb", "--preset", "cpu", "--methods", "ppo", "--seeds", "0,1", "--steps", "20",
                   "--out", committed),
            f"{committed}/runs/ppo/seed_1 holds a run copied or cloned", "its config.yaml is unreadable (not UTF-8")
    assert tree(committed) == before


@pytest.mark.slow
def test_a_run_cut_off_elsewhere_is_set_aside_only_when_asked(tmp_path):
    """A run cut off in a lent GPU's call is committed as that call's record (metrics, no checkpoint): a later
    machine cannot resume it. The runner refuses to start it again, naming --restart_cut_off; with it, the run's
    folder moves under cut_off/1/ unchanged (nothing deleted) and the run starts anew; the finished run stays."""
    import json

    argv = ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0,1", "--steps", "2", "--no_eval",
            "--no_report"]
    made = tmp_path / "made"
    p = runner(*argv, "--out", made)
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "clone" / "exp"  # as a clone has it: no weights, seed 1 cut off after its first iteration
    shutil.copytree(made, out)
    for seed in (0, 1):
        run = out / "runs" / "ppo" / f"seed_{seed}"
        shutil.rmtree(run / "checkpoints")
        shutil.rmtree(run / "final")
    cut = out / "runs" / "ppo" / "seed_1"
    metrics = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text(metrics[0])
    record = json.loads((out / "runs.json").read_text())
    record["runs"]["ppo/seed_1"]["status"] = "interrupted"
    (out / "runs.json").write_text(json.dumps(record))
    before, kept = tree(cut), tree(out / "runs" / "ppo" / "seed_0")

    whole = tree(out)
    refused(runner(*argv, "--out", out), f"{cut} holds a run copied or cloned", "--restart_cut_off")
    assert tree(out) == whole

    p = runner(*argv, "--out", out, "--restart_cut_off")
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"set aside 1 run(s) cut off elsewhere: {out / 'cut_off' / '1'}" in p.stdout.replace(str(REPO) + "/", "")
    assert tree(out / "cut_off" / "1" / "ppo" / "seed_1") == before
    assert [r["step"] for r in read_jsonl(cut / "metrics.jsonl")] == [0, 1]
    assert tree(out / "runs" / "ppo" / "seed_0") == kept
    assert json.loads((out / "runs.json").read_text())["runs"]["ppo/seed_1"]["status"] == "finished"


# ----------------------------------------------------------------------------- a training script on a committed run

@pytest.mark.slow
def test_resume_of_a_committed_run_refuses_to_start_it_again(committed):
    run = committed / "runs" / "ppo" / "seed_0"
    before = tree(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run),
            f"resume: {run} holds a run copied or cloned", "no checkpoint to resume from",
            f"--config {run}/config.yaml --output_dir NEW")
    assert tree(run) == before


@pytest.mark.slow
def test_overwrite_refuses_a_copied_run(committed):
    run = committed / "runs" / "ppo" / "seed_0"
    before = tree(run)
    refused(run_script("imdb_train/ppo.py", "--config", "configs/imdb/ppo_tiny.yaml", "--output_dir", run,
                       "--overwrite"),
            f"output_dir: {run} holds a run copied or cloned", "another output_dir")
    assert tree(run) == before


@pytest.mark.slow
def test_a_copied_runs_evaluation_is_never_deleted_by_a_resume(finished, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)  # with its checkpoint: a resume may extend it
    (run / "eval_imdb.json").write_text("{}")
    before = tree(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3"),
            f"{run} holds eval_imdb.json", f"move it out of {run}")
    assert tree(run) == before


@pytest.mark.slow
def test_resume_of_a_finished_run_changes_nothing(finished, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    (run / "eval_imdb.json").write_text('{"results": []}')  # as lab.evaluate leaves it
    before = tree(run)
    for argv in ([], ["--steps", "2"], ["--eval_every", "1"]):
        p = run_script("imdb_train/ppo.py", "--resume", run, *argv)
        assert p.returncode == 0 and p.stdout.startswith(f"nothing to do: {run} has done its 2 iterations"), p.stderr
        assert tree(run) == before


@pytest.mark.slow
def test_resume_never_restarts_a_finished_run_whose_checkpoints_were_deleted(tmp_path):
    run = tmp_path / "run"
    p = run_script("imdb_train/ppo.py", "--config", "configs/imdb/ppo_tiny.yaml", "--steps", "2", "--output_dir", run)
    assert p.returncode == 0, p.stderr[-2000:]
    shutil.rmtree(run / "checkpoints")  # to save space; its metrics and final models stay
    before = tree(run)
    # its final models are whole, so it is finished: nothing to do (a run that dropped its checkpoint by design,
    # keep_resume_checkpoint: false, reads the same), and nothing is restarted or changed
    p = run_script("imdb_train/ppo.py", "--resume", run)
    assert p.returncode == 0 and "nothing to do" in p.stdout, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    assert tree(run) == before
    shutil.rmtree(run / "final")  # every iteration's row is the result now
    before = tree(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run), f"{run} holds a finished run's results")
    assert tree(run) == before
    # --overwrite, asked for, replaces a run made in this folder
    p = run_script("imdb_train/ppo.py", "--config", "configs/imdb/ppo_tiny.yaml", "--steps", "1", "--output_dir", run,
                   "--overwrite")
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0] and latest_checkpoint(run) is not None


# ----------------------------------------------------------------------------- the runner's --out

@pytest.mark.parametrize("linked", [True, False])
def test_the_runners_out_is_never_a_users_folder(tmp_path, linked):
    mine = tmp_path / "my_report"
    mine.mkdir()
    (mine / "REPORT.md").write_text("my notes")
    (mine / "fig_kl.png").write_bytes(b"my figure")
    out = tmp_path / "link"
    if linked:
        out.symlink_to(mine)
    before = tree(mine)
    refused(runner("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "1",
                   "--out", out if linked else mine),
            "holds files (REPORT.md, fig_kl.png) and no runs.json", "choose another --out")
    assert tree(mine) == before


def test_the_runners_out_is_never_inside_a_run(finished, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    before = tree(run)
    refused(runner("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "1",
                   "--out", run / "final" / "experiment"),
            f"is inside the training run {run}; choose a folder outside it")
    assert tree(run) == before


@pytest.mark.slow
def test_the_runner_writes_into_an_empty_folder_or_its_own_experiment(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    base = ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "1", "--out", out,
            "--no_eval", "--no_report"]
    p = runner(*base)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "runs.json").is_file() and (out / "runs" / "ppo" / "seed_0" / "final").is_dir()
    (out / "notes.md").write_text("mine")  # a user's notes beside the runner's own experiment
    p = runner(*base)
    assert p.returncode == 0 and "skip   ppo/seed_0" in p.stdout, p.stderr[-2000:]


@pytest.mark.slow
def test_the_runner_writes_into_a_folder_holding_only_its_design(tmp_path):
    """A design is committed before its runs (DESIGN.md, design.yaml, base_draws/): the runner starts there and keeps
    them."""
    out = tmp_path / "designed"
    out.mkdir()
    (out / "DESIGN.md").write_text("# written before the runs")
    (out / "design.yaml").write_text("endpoint: collapse\n")
    (out / "base_draws").mkdir()  # the base model sampled again before the runs (design.yaml's base_draws)
    (out / "base_draws" / "eval_base_seed1.json").write_text("{}")
    before = tree(out)
    p = runner("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "1", "--out", out,
               "--no_eval", "--no_report")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "runs.json").is_file() and {k: v for k, v in tree(out).items() if k in before} == before


# ----------------------------------------------------------------------------- a run stopped at once

def test_a_second_stop_during_the_base_models_evaluation_is_one_line(tmp_path, monkeypatch):
    """Ctrl-C twice while the run evaluates its base model, before its progress bar exists: a Stopped (130 and
    one line from the entry point), not an AttributeError."""
    from cory import heldout
    from cory.config import build, load_yaml
    from cory.errors import Stopped
    from cory.train import prepare_run
    from conftest import IMDB_PPO

    def interrupted(self, models, iterations):
        raise KeyboardInterrupt

    monkeypatch.setattr(heldout.PeriodicEvaluation, "__call__", interrupted)
    cfg = build(IMDB_PPO, {**load_yaml(REPO / "configs" / "imdb" / "ppo_tiny.yaml"), "steps": 2, "eval_every": 1,
                           "output_dir": str(tmp_path / "run")})
    with pytest.raises(Stopped) as e:
        prepare_run(cfg).fit()
    assert e.value.exit_status == 130 and "no checkpoint yet" in str(e.value)
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


# ----------------------------------------------------------------------------- what the runner passes on, checked first

@pytest.mark.parametrize("argv,message", [
    (["--eval_args", "--limit 0"], "--eval_args '--limit 0': argument --limit: must be >= 1, got 0"),
    (["--eval_args", "--k 4"], "--eval_args '--k 4': --k applies to pass@k tasks, not --task imdb"),
    (["--eval_args", "--json mine.json"], "--eval_args '--json mine.json': --json is set by the runner itself"),
    (["--eval_args", "'--limit"], "--eval_args: No closing quotation"),
    (["--seeds", "0,2147483648"], "--seeds: must be below 2**31, got 2147483648"),
])
def test_what_the_runner_passes_on_is_checked_before_the_first_run(tmp_path, capsys, argv, message):
    from lab import experiments

    out = tmp_path / "exp"
    with pytest.raises(SystemExit) as e:
        experiments.main(["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--out", str(out),
                          *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
