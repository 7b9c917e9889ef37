"""Evidence is what it says (hardening round 6): an evaluation counts for the final weights whose contents it scored
(a digest, not an id drawn at save time), never for a run another process is training; the report reads a run
only where its manifest and config agree with its place (method, task, seed) and names those that do not; a design
edited after the folder's first run started is named wherever the report cites it."""
import json
import shutil

import pytest
import yaml

from cory.run.final import MARKER, RECORD, final_weights_id, stale, write_final
from lab.design import DESIGN_DIGEST, design_digest, load_design
from lab.report import build_report
from lab.results import load_experiment
from lab.runs import Record
from cory.run.outputs import MANIFEST, RunLock
from test_report import synthetic


def _models(folder):
    (folder / "policy").mkdir()
    (folder / "policy" / "config.json").write_text("{}")
    (folder / "policy" / "model.safetensors").write_bytes(bytes(range(200)))


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_other_weights_of_the_same_size_under_the_same_marker_are_other_weights(tmp_path):
    write_final(tmp_path, 2, _models)
    scored = final_weights_id(tmp_path)
    marker = (tmp_path / "final" / MARKER).read_text()
    assert scored.startswith("sha256:") and json.loads(marker)["id"] == scored
    assert not stale(tmp_path, {RECORD: scored})
    flip_last_byte(tmp_path / "final" / "policy" / "model.safetensors")
    assert (tmp_path / "final" / MARKER).read_text() == marker  # the marker does not tell
    assert final_weights_id(tmp_path) != scored and stale(tmp_path, {RECORD: scored})
    flip_last_byte(tmp_path / "final" / "policy" / "model.safetensors")
    assert final_weights_id(tmp_path) == scored


def test_an_evaluation_recorded_with_the_old_id_is_checked_as_it_was(tmp_path):
    write_final(tmp_path, 2, _models)
    marker = tmp_path / "final" / MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "id": "0" * 32}))  # as written before digests
    assert not stale(tmp_path, {RECORD: "0" * 32}) and stale(tmp_path, {RECORD: "1" * 32})


def test_evaluating_a_run_that_is_training_is_refused(finished, tmp_path, monkeypatch, capsys):
    from lab import evaluate

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    monkeypatch.setattr(evaluate, "load_causal_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    lock = RunLock(run).acquire()  # as a --resume extending it holds it
    try:
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--task", "imdb", "--model", str(run), "--limit", "2", "--max_new_tokens", "2"])
    finally:
        lock.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --model: {run} is being written by another run"), err
    assert not (run / "eval_imdb.json").exists()


def _manifest(run, method, task="imdb"):
    (run / MANIFEST).write_text(json.dumps({"project": "cory", "method": method, "task": task}))


def test_the_report_leaves_out_and_names_a_run_whose_manifest_or_seed_disagrees_with_its_place(tmp_path):
    synthetic(tmp_path, cory_wins=True, seeds=(0, 1, 2), steps=6)
    for method in ("ppo", "cory"):
        for seed in (0, 1, 2):
            _manifest(tmp_path / "runs" / method / f"seed_{seed}", method)
    _manifest(tmp_path / "runs" / "cory" / "seed_0", "ppo")  # a PPO run copied under runs/cory/
    config = tmp_path / "runs" / "ppo" / "seed_2" / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "seed": 7}))
    exp = load_experiment(tmp_path)
    assert sorted(exp.groups["cory"].runs) == [1, 2] and sorted(exp.groups["ppo"].runs) == [0, 1]
    report = build_report(tmp_path).read_text()
    assert "`cory/seed_0` holds a ppo run (cory_run.json), not a cory run as its folder says; left out" in report
    assert "`ppo/seed_2` holds a run of seed 7 (its config.yaml), not of seed 2 as its folder says" in report


def test_the_report_names_a_run_of_another_task_and_leaves_it_out(tmp_path):
    synthetic(tmp_path, cory_wins=True, seeds=(0, 1, 2), steps=6)
    run = tmp_path / "runs" / "ppo" / "seed_1"
    _manifest(run, "ppo", task="arithmetic")
    config = run / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "task": "arithmetic", "lr": 1}))
    exp = load_experiment(tmp_path)
    assert sorted(exp.groups["ppo"].runs) == [0, 2] and exp.groups["ppo"].differing_settings() is None
    assert any("`ppo/seed_1` holds a arithmetic run, not a imdb run" in n for n in exp.notes), exp.notes


def test_a_run_of_another_task_and_another_seed_is_named_by_its_task(tmp_path):
    """Issue 75: a run copied from another task's experiment (its seed 7 at seed_1) was named by its seed only."""
    synthetic(tmp_path, cory_wins=True, seeds=(0, 1, 2), steps=6)
    run = tmp_path / "runs" / "ppo" / "seed_1"
    _manifest(run, "ppo", task="arithmetic")
    config = run / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "task": "arithmetic", "seed": 7}))
    exp = load_experiment(tmp_path)
    assert sorted(exp.groups["ppo"].runs) == [0, 2]
    assert any("`ppo/seed_1` holds a arithmetic run, not a imdb run" in n for n in exp.notes), exp.notes
    assert not any("seed 7" in n for n in exp.notes), exp.notes


def test_the_runner_records_the_design_at_the_first_run_and_the_report_names_a_later_edit(tmp_path):
    (tmp_path / "design.yaml").write_text("margin: 0.05\n")
    spec = {"task": "imdb", "methods": ["ppo", "cory"], "seeds": [0, 1, 2], "kl_coefs": None}
    record = Record(tmp_path, spec)
    assert record.data[DESIGN_DIGEST] == design_digest(tmp_path)
    record.data["runs"]["ppo/seed_0"] = {"status": "finished"}
    record.save()
    synthetic(tmp_path, cory_wins=True, seeds=(0, 1, 2), steps=6)
    assert load_design(tmp_path).source == "design.yaml"
    (tmp_path / "design.yaml").write_text("margin: 0\n")  # after the runs: the verdict's margin moved
    assert Record(tmp_path, spec).data[DESIGN_DIGEST] != design_digest(tmp_path)  # a later command keeps the first
    assert "design.yaml was changed after the folder's first run started" in load_design(tmp_path).source
    report = build_report(tmp_path).read_text()
    assert "design.yaml was changed after the folder's first run started" in report


def test_a_design_written_after_the_first_run_is_an_amendment(tmp_path):
    Record(tmp_path, {"task": "imdb", "methods": ["ppo"], "seeds": [0], "kl_coefs": None}).save()
    assert json.loads((tmp_path / "runs.json").read_text())[DESIGN_DIGEST] is None
    (tmp_path / "design.yaml").write_text("margin: 0\n")
    assert "written after the folder's first run started" in load_design(tmp_path).source


def test_an_evaluation_of_a_run_resumed_while_it_ran_writes_nothing(finished, tmp_path, monkeypatch, capsys):
    """A --resume that starts while the evaluation samples holds the run until it replaces final/: the result,
    written beside the new models, would read as theirs; one line, exit 1, nothing written."""
    from lab import evaluate

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    real, locks = evaluate.evaluate_reward, []

    def then_resumed(*args, **kwargs):
        res = real(*args, **kwargs)
        if not locks:
            locks.append(RunLock(run).acquire())
        return res

    monkeypatch.setattr(evaluate, "evaluate_reward", then_resumed)
    try:
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--task", "imdb", "--model", str(run), "--limit", "2", "--max_new_tokens", "2"])
    finally:
        locks[0].release()
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert e.value.code == 1 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: {run} was resumed while it was evaluated and is training"), errors
    assert not (run / "eval_imdb.json").exists()


def test_the_runner_names_a_run_of_another_method_or_task_in_its_folder(finished, tmp_path):
    """A copied run was refused for an incidental setting, its method or task never named."""
    from lab.errors import ExperimentError
    from lab.experiments import _states, build_parser, plan

    out = tmp_path / "exp"
    pairs, _ = plan(build_parser().parse_args(["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0",
                                          "--steps", "2", "--out", str(out)]))
    run = pairs[0].run_dir
    shutil.copytree(finished / "cory", run)
    with pytest.raises(ExperimentError, match=r"holds a run with method='cory' \(its cory_run.json; this command "
                                              r"asks for ppo\)"):
        _states(pairs)
    shutil.rmtree(run)
    shutil.copytree(finished / "ppo", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "task": "arithmetic", "learning_rate": 1.0}))
    with pytest.raises(ExperimentError, match=r"holds a run with task='arithmetic' \(this command asks for 'imdb'\)"):
        _states(pairs)
