"""An evaluation records which final weights it scored (``final_weights`` in ``eval_<task>.json``, see cory.run.final):
one of weights a resume has since replaced is stale, and the runner evaluates again what the report leaves out
(named). An evaluation that records none (the committed ones) or a run without final/ cannot be checked: trusted."""
import json
import shutil

import pytest

from conftest import run_script
from cory.run.final import RECORD, final_weights_id
from entry_points import lab, succeeded, tree

EVAL_FAST = ["--limit", "4", "--max_new_tokens", "5"]


def other_weights(path):
    """Other weights of the same size in ``path`` (its last byte, a weight's, changed), final/'s marker kept."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def trained(run, steps=2, *more):
    succeeded(run_script("imdb_train/ppo.py", "--config", "configs/imdb/ppo_tiny.yaml", "--steps", steps,
                         "--output_dir", run, *more))


@pytest.mark.slow
def test_an_evaluation_made_stale_by_a_resume_is_named_and_left_out(tmp_path):
    exp = tmp_path / "exp"
    run = exp / "runs" / "ppo" / "seed_0"
    trained(run)
    succeeded(lab("evaluate", "--task", "imdb", "--model", run, *EVAL_FAST))
    result = run / "eval_imdb.json"
    scored = json.loads(result.read_text())[RECORD]
    assert scored == final_weights_id(run)
    succeeded(lab("report", exp))
    report = (exp / "REPORT.md").read_text()
    assert "## Held-out evaluation" in report and "left out as stale" not in report

    # the evaluation ends while a resume extends the run: it lies beside newer final weights than it scored
    old = result.read_bytes()
    trained(run, 3, "--resume", run)
    assert final_weights_id(run) != scored
    result.write_bytes(old)
    before = tree(run)
    succeeded(lab("report", exp))
    report = (exp / "REPORT.md").read_text()
    assert ("`ppo/seed_0/eval_imdb.json` scored other weights than `ppo/seed_0/final/` holds now (the run was "
            "continued after it); left out as stale") in report
    assert "## Held-out evaluation" not in report
    assert tree(run) == before  # the report only reads the run


@pytest.mark.slow
def test_the_runner_evaluates_a_stale_evaluation_again(tmp_path):
    out = tmp_path / "exp"
    args = ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--steps", "1", "--out", out,
            "--eval_args", " ".join(EVAL_FAST), "--no_report"]
    succeeded(lab("experiments", *args))
    run = out / "runs" / "ppo" / "seed_0"
    result = run / "eval_imdb.json"
    doc = json.loads(result.read_text())
    assert doc[RECORD] == final_weights_id(run)
    base = (out / "eval_base_imdb.json").read_bytes()
    result.write_text(json.dumps({**doc, RECORD: "weights of an earlier final/"}))
    p = succeeded(lab("experiments", *args))
    assert "skip   ppo/seed_0" in p.stdout and "eval   ppo/seed_0" in p.stdout, p.stdout
    assert "eval   base model" not in p.stdout  # the base model's result is still its own
    assert json.loads(result.read_text())[RECORD] == final_weights_id(run)
    assert (out / "eval_base_imdb.json").read_bytes() == base
    # current now: a third run does nothing
    p = succeeded(lab("experiments", *args))
    assert "eval   " not in p.stdout, p.stdout


@pytest.mark.slow
def test_an_evaluation_whose_models_are_replaced_meanwhile_writes_nothing(finished, tmp_path, monkeypatch, capsys):
    """``--resume`` replaces final/ while ``lab.evaluate`` scores it: the results are of weights that are gone,
    so nothing is written (exit 1, one line), rather than an evaluation that reads as the new models'."""
    from lab import evaluate

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    real = evaluate.evaluate_reward

    replaced = []

    def then_replaced(*args, **kwargs):
        res = real(*args, **kwargs)
        if not replaced:  # once: the base model's evaluation, then the run's
            other_weights(run / "final" / "policy" / "model.safetensors")
            replaced.append(True)
        return res

    monkeypatch.setattr(evaluate, "evaluate_reward", then_replaced)
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--task", "imdb", "--model", str(run), *EVAL_FAST])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]  # after the progress bars
    assert e.value.code == 1 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert errors[0].startswith(f"error: {run / 'final'} was replaced while it was evaluated"), errors
    assert not (run / "eval_imdb.json").exists()


@pytest.mark.slow
def test_an_evaluation_that_records_no_weights_is_trusted(tmp_path):
    """Evaluations written before they recorded their weights (every committed one) still count, with final/
    beside them or not."""
    exp = tmp_path / "exp"
    run = exp / "runs" / "ppo" / "seed_0"
    trained(run)
    succeeded(lab("evaluate", "--task", "imdb", "--model", run, *EVAL_FAST))
    doc = json.loads((run / "eval_imdb.json").read_text())
    del doc[RECORD]
    (run / "eval_imdb.json").write_text(json.dumps(doc))
    for keep_final in (True, False):
        if not keep_final:
            shutil.rmtree(run / "final")
        succeeded(lab("report", exp))
        report = (exp / "REPORT.md").read_text()
        assert "## Held-out evaluation" in report and "left out as stale" not in report
