"""A resume whose inputs changed since the checkpoint (a task state of another format, a data file that lost a
record, a config field retired since), and an output_dir that cannot be made, are one line through the training
script (exit 2), and the run's folder is the same afterwards."""
import json
import shutil

import torch
import pytest

from conftest import TINY, rejected, run_script
from cory.run.outputs import LOCK
from entry_points import refused, tree


def files(run):
    """The run's files, but its lock (rewritten by every command that takes it, with its own pid)."""
    return {k: v for k, v in tree(run).items() if k != LOCK}


@pytest.mark.slow
def test_a_task_state_of_another_format_version(finished, tmp_path):
    from cory.run.outputs import load_checkpoint_file

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    state_file = run / "checkpoints" / "step_000002" / "state.pt"
    state = load_checkpoint_file(state_file)
    state["task"]["version"] = 2  # written by a later version of the sampler
    torch.save(state, state_file)
    before = files(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3"),
            f"resume: {state_file} holds a task imdb state this run cannot take (unsupported IMDB sampler state "
            "version 2)", "start again with --overwrite")
    assert files(run) == before


@pytest.mark.slow
def test_a_gsm8k_run_resumed_after_its_train_file_lost_a_record(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 8), ("test", 4)):
        (data / f"{split}.jsonl").write_text("".join(
            json.dumps({"question": f"Tom has {i} apples and buys {i + 2} more. How many apples has he?",
                        "answer": f"{i} + {i + 2} = {2 * i + 2}. #### {2 * i + 2}"}) + "\n" for i in range(n)))
    run = tmp_path / "run"
    p = run_script("gsm8k_train/ppo.py", "--config", "configs/gsm8k/ppo_tiny.yaml", "--steps", "1", "--dataset",
                   "local", "--dataset_path", data, "--output_dir", run)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = (data / "train.jsonl").read_text().splitlines(keepends=True)
    (data / "train.jsonl").write_text("".join(lines[:-1]))
    before = files(run)
    refused(run_script("gsm8k_train/ppo.py", "--resume", run, "--steps", "2"),
            "holds a task gsm8k state this run cannot take (GSM8K task state is for 8 training problems, this task "
            "has 7")
    assert files(run) == before


@pytest.mark.slow
def test_a_config_field_retired_since_is_not_called_another_methods(finished, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    with open(run / "config.yaml", "a") as f:
        f.write("kl_penalty_mode: full\n")  # a field no script has (any more)
    before = tree(run)
    line = refused(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3"),
                   f"resume: {run}/config.yaml holds fields no script has now (kl_penalty_mode): retired since the "
                   f"run was made, or added by hand; delete them from {run}/config.yaml")
    assert "another method" not in line
    assert tree(run) == before


def test_an_output_dir_that_is_a_dangling_link(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    line = rejected("imdb", "ppo", TINY + ["--output_dir", link])
    assert line == (f"error: output_dir: {link} is a symbolic link to {tmp_path / 'gone'}, which does not exist; "
                    "create that folder or choose another output_dir")
    assert link.is_symlink() and not (tmp_path / "gone").exists()


@pytest.mark.slow
def test_a_base_model_folder_changed_since_the_checkpoint(tmp_path):
    """The base model is the KL reference too: a resume from weights that are no longer those the run started
    from would go on against another reference. The checkpoint records a fingerprint, and the resume refuses."""
    from safetensors.torch import load_file, save_file

    from cory import assets

    base = tmp_path / "base"
    shutil.copytree(assets.tiny_model_dir(), base)
    run = tmp_path / "run"
    p = run_script("imdb_train/ppo.py", *TINY, "--model_name", base, "--steps", "1", "--output_dir", run)
    assert p.returncode == 0, p.stderr[-2000:]
    shutil.copytree(run, tmp_path / "same")  # the same base: resumes
    p = run_script("imdb_train/ppo.py", "--resume", tmp_path / "same", "--steps", "2")
    assert p.returncode == 0, p.stderr[-2000:]
    weights = base / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 0.01  # fine-tuned further in place, say
    save_file(tensors, weights, metadata={"format": "pt"})
    before = files(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "2"),
            f"resume: the base model {base} has changed since step_000001 was saved",
            "resume with the model it was trained from, or start again with --overwrite")
    assert files(run) == before


@pytest.mark.slow
def test_a_newest_checkpoint_that_is_a_symlink_is_refused_before_training(finished, tmp_path):
    """Issue 75: it was passed over, the run redid an iteration and then crashed saving over the link."""
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    link = run / "checkpoints" / "step_000003"
    link.symlink_to(run / "checkpoints" / "step_000002")
    before = files(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "4"),
            f"resume: {link} is a symbolic link", "never writes through a link", "move the link out of")
    assert files(run) == before and link.is_symlink()


@pytest.mark.slow
@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_a_hand_edited_task_position_is_refused_naming_it(finished, tmp_path, value):
    from cory.run.outputs import load_checkpoint_file

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    state_file = run / "checkpoints" / "step_000002" / "state.pt"
    state = load_checkpoint_file(state_file)
    state["task"]["pos"] = value
    torch.save(state, state_file)
    before = files(run)
    refused(run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3"),
            f"resume: {state_file}: its task pos {value!r} is not a whole number from 0", "edited by hand")
    assert files(run) == before


def test_a_task_state_count_is_a_whole_number_in_its_range():
    from cory.tasks.base import state_count

    assert state_count({"position": 3}, "position", 5) == 3
    for bad in (-1, 2.5, "3", None, True, 6):
        with pytest.raises(ValueError, match=r"task position .* is not a whole number from 0"):
            state_count({"position": bad}, "position", 5)
