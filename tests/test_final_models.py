"""A run is finished only when its final models are whole: final/ is written under a temporary name beside it and
renamed into place (cory.run.final.write_final), so a save cut short (a full disk, a kill) leaves no final/ that the
runner skips as finished, the resume then writes it, and nothing reads a half-written one as the run's result."""
import errno
import json
import shutil

import pytest
import torch

from conftest import IMDB_PPO, REPO, run_script
from cory.run.final import MARKER, final_complete, final_weights_id
from entry_points import lab, refused, succeeded, tree


def full_disk(self, folder, *args, **kwargs):
    """save_pretrained on a disk that fills up: the model's config fits, its weights do not."""
    self.config.save_pretrained(folder)
    raise OSError(errno.ENOSPC, "No space left on device")


def full_disk_in_safetensors(self, folder, *args, **kwargs):
    """The same, as safetensors' writer reports it: its own error, not an OSError."""
    from safetensors import SafetensorError

    self.config.save_pretrained(folder)
    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                          'left on device" })')


@pytest.mark.slow
@pytest.mark.parametrize("fault", [full_disk, full_disk_in_safetensors])
def test_a_full_disk_while_writing_final_leaves_no_finished_run(fault, tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    from cory.config import build, load_yaml
    from cory.errors import RunError
    from cory.train import prepare_run

    out = tmp_path / "exp"  # a runner's experiment (its runs.json) whose run is cut off while it writes final/
    run = out / "runs" / "ppo" / "seed_0"
    run.mkdir(parents=True)
    (out / "runs.json").write_text(json.dumps({"task": "imdb", "preset": "tiny"}))
    cfg = build(IMDB_PPO, {**load_yaml(REPO / "configs" / "imdb" / "ppo_tiny.yaml"), "steps": 2, "seed": 0,
                           "output_dir": str(run)})
    with monkeypatch.context() as m:
        m.setattr(PreTrainedModel, "save_pretrained", fault)
        with pytest.raises(RunError) as e:
            prepare_run(cfg).fit()
    assert str(e.value).startswith(f"final models: cannot write them in {run} (No space left on device)")
    assert f"--resume {run}" in str(e.value)
    assert not (run / "final").exists() and not list(run.glob(".final_*"))  # nothing half-written is left
    assert (run / "checkpoints" / "step_000002" / "state.pt").is_file()  # the last iteration is saved

    # space freed, the same runner command finishes the run (it is not skipped as finished)
    p = succeeded(lab("experiments", "--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0",
                      "--steps", "2", "--out", out, "--no_eval", "--no_report"))
    assert "skip   ppo/seed_0" not in p.stdout and "resuming from checkpoint 2" in p.stdout, p.stdout
    assert final_complete(run, ["policy"]) and json.loads((run / "final" / MARKER).read_text())["iterations"] == 2


@pytest.mark.slow
def test_each_final_written_has_a_new_id_and_replaces_the_one_before(finished, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    first = final_weights_id(run)
    assert first is not None and not first.startswith("files:")  # the id written with the models
    succeeded(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3"))
    assert final_weights_id(run) not in (None, first)
    assert sorted(p.name for p in (run / "final").iterdir()) == [MARKER, "policy"]
    assert not list(run.glob(".final_*"))


@pytest.mark.slow
def test_a_half_written_final_from_before_is_not_a_finished_run(finished, tmp_path):
    """A final/ written before the rename (its save cut short left a model folder without weights): the resume
    writes it instead of saying there is nothing to do, and the evaluation refuses it in one line."""
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    (run / "final" / MARKER).unlink()
    (run / "final" / "policy" / "model.safetensors").unlink()
    before = tree(run)
    refused(lab("evaluate", "--task", "imdb", "--model", run, "--limit", "2"),
            f"--model {run}: {run / 'final'} is incomplete", f"finish the run with --resume {run}")
    assert tree(run) == before
    p = succeeded(run_script("imdb_train/ppo.py", "--resume", run))
    assert "nothing to do" not in p.stdout
    assert final_complete(run, ["policy"]) and (run / "final" / MARKER).is_file()


@pytest.mark.slow
def test_a_final_whose_weights_were_cut_short_since_is_rewritten_by_resume(finished, tmp_path):
    """final/'s marker lists the size of every file written: a weights file cut short afterwards (a copy that
    stopped, a disk fault) makes final/ incomplete, so the resume writes it again from the last checkpoint, with the
    same weights, instead of saying there is nothing to do."""
    from safetensors.torch import load_file

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    weights = run / "final" / "policy" / "model.safetensors"
    whole = {k: v.clone() for k, v in load_file(weights).items()}  # a copy: the file is memory-mapped
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    assert not final_complete(run, ["policy"])
    before = tree(run)
    refused(lab("evaluate", "--task", "imdb", "--model", run, "--limit", "2"),
            f"--model {run}: {run / 'final'} is incomplete", f"finish the run with --resume {run}")
    assert tree(run) == before
    p = succeeded(run_script("imdb_train/ppo.py", "--resume", run))
    assert "nothing to do" not in p.stdout
    assert final_complete(run, ["policy"])
    again = load_file(weights)
    assert sorted(again) == sorted(whole) and all(torch.equal(again[k], whole[k]) for k in whole)


@pytest.mark.slow
def test_the_leftovers_of_a_final_save_cut_short_are_the_runs_own(finished, tmp_path):
    """A kill while final/ is written leaves .final_tmp_*: the resume removes it, --overwrite may delete it."""
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    shutil.copytree(run / "final", run / ".final_tmp_k1ll3d")
    shutil.rmtree(run / "final")
    succeeded(run_script("imdb_train/ppo.py", "--resume", run))
    assert not (run / ".final_tmp_k1ll3d").exists() and final_complete(run, ["policy"])
