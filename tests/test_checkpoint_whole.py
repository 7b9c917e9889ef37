"""A checkpoint is one thing (hardening round 6): its state.pt records the sha256 of every agent file beside it, and
its step is its folder's. A state copied from another step, or an agent file copied from another checkpoint, seed or
method, is refused by --resume in one line naming the file and saying to move the checkpoint aside, before any
model loads; so a resume never trains an iteration twice. A file-size limit at a checkpoint is a full disk's stop."""
import errno
import shutil

import pytest
from conftest import IMDB_PPO, rejected
from cory.run.final import file_digest
from cory.run.outputs import latest_checkpoint, load_checkpoint_file, read_jsonl
from cory.run.run_rules import check_one_checkpoint
from cory.train import RunError, prepare_run
from test_faults import tiny


def copy_run(finished, tmp_path, method):
    run = tmp_path / method
    shutil.copytree(finished / method, run)
    return run


def test_state_pt_records_the_digest_of_each_agent_file(finished):
    for method, agents in (("ppo", ["policy"]), ("cory", ["llm1", "llm2"])):
        checkpoint = latest_checkpoint(finished / method)
        state = load_checkpoint_file(checkpoint / "state.pt")
        assert state["step"] == 2 and checkpoint.name == "step_000002"
        assert state["files"] == {f"{a}.pt": file_digest(checkpoint / f"{a}.pt") for a in agents}


def test_a_state_of_another_step_is_refused(finished, tmp_path):
    """The uninterrupted run's state after 2 iterations in the folder of step 1: resuming would start from 2 on
    weights that say 1, or train iteration 2 twice."""
    run = copy_run(finished, tmp_path, "ppo")
    checkpoint = latest_checkpoint(run)
    checkpoint.rename(checkpoint.with_name("step_000001"))
    line = rejected("imdb", "ppo", ["--resume", run, "--steps", "3"])
    assert f"{run / 'checkpoints' / 'step_000001' / 'state.pt'} is the state after 2 iterations, not after 1" in line
    assert "move" in line and "aside" in line


def test_agent_files_swapped_between_agents_are_refused(finished, tmp_path):
    run = copy_run(finished, tmp_path, "cory")
    checkpoint = latest_checkpoint(run)
    (checkpoint / "llm1.pt").rename(checkpoint / "x.pt")
    (checkpoint / "llm2.pt").rename(checkpoint / "llm1.pt")
    (checkpoint / "x.pt").rename(checkpoint / "llm2.pt")
    line = rejected("imdb", "cory", ["--resume", run, "--steps", "3"])
    assert f"{checkpoint / 'llm1.pt'} is not the file {checkpoint / 'state.pt'} was saved with" in line
    assert f"move {checkpoint} aside" in line


def test_an_agent_file_of_another_method_is_refused(finished, tmp_path):
    run = copy_run(finished, tmp_path, "ppo")
    checkpoint = latest_checkpoint(run)
    shutil.copy(latest_checkpoint(finished / "cory") / "llm1.pt", checkpoint / "policy.pt")
    line = rejected("imdb", "ppo", ["--resume", run, "--steps", "3"])
    assert f"{checkpoint / 'policy.pt'} is not the file" in line and "sha256 differs" in line


@pytest.mark.parametrize("drop", ["rng", "task", "rng.numpy"])
def test_a_state_missing_what_restores_the_run_is_refused(finished, tmp_path, drop):
    """A state.pt edited by hand (or damaged) without its random streams or data sampler: one line before any model
    loads, where restore() raised a KeyError after they had."""
    import torch

    run = copy_run(finished, tmp_path, "ppo")
    checkpoint = latest_checkpoint(run)
    state = load_checkpoint_file(checkpoint / "state.pt")
    if "." in drop:
        del state["rng"][drop.split(".")[1]]
    else:
        del state[drop]
    torch.save(state, checkpoint / "state.pt")
    line = rejected("imdb", "ppo", ["--resume", run, "--steps", "3"])
    assert f"{checkpoint / 'state.pt'} holds no {drop!r}" in line and f"move {checkpoint} aside" in line


def test_a_checkpoint_saved_before_digests_resumes_with_a_warning(finished, tmp_path):
    """Older checkpoints recorded no digest: accepted (they were whole when saved), said once, step still checked."""
    run = copy_run(finished, tmp_path, "ppo")
    checkpoint = latest_checkpoint(run)
    state = load_checkpoint_file(checkpoint / "state.pt")
    del state["files"]
    with pytest.warns(UserWarning, match="records no digest of its agent files"):
        check_one_checkpoint(checkpoint, state, ["policy"])


@pytest.mark.slow
def test_a_file_size_limit_at_a_checkpoint_is_one_line_and_keeps_the_older_one(tmp_path):
    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=2, save_every=1))
    save = run.run_dir.save_checkpoint

    def limit_from_step_2(step, write, keep):
        def over_the_limit(folder):
            raise OSError(errno.EFBIG, "File too large")
        return save(step, write if step < 2 else over_the_limit, keep)
    run.run_dir.save_checkpoint = limit_from_step_2
    with pytest.raises(RunError) as e:
        run.fit()
    message = str(e.value)
    assert "checkpoint 2: a file of it would be larger than this process may write" in message
    assert "ulimit -f" in message and "step_000001, is kept" in message and "--resume" in message
    assert "\n" not in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    assert load_checkpoint_file(latest_checkpoint(out) / "state.pt")["step"] == 1
    resumed = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=2, save_every=1, resume=str(out)))
    assert resumed.start_step == 1
    resumed.fit()
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1] and (out / "final").is_dir()


@pytest.mark.slow
def test_precision_auto_resumed_on_a_cpu_of_another_kind_keeps_the_precision_it_started_in(tmp_path, monkeypatch,
                                                                                            capsys):
    """Started where auto is bf16 (AVX-512 BF16), resumed where it is fp32 (bf16 emulated): the run goes on in bf16,
    and says so, as a resume keeps an explicit precision."""
    from cory.device import precision as agent_module

    out = tmp_path / "run"
    monkeypatch.setattr(agent_module, "cpu_bf16_kernels", lambda: "avx512_bf16")
    prepare_run(tiny(IMDB_PPO, "ppo", out, steps=1, save_every=1, precision="auto")).fit()
    assert load_checkpoint_file(latest_checkpoint(out) / "state.pt")["precision"] == "bf16"
    monkeypatch.setattr(agent_module, "cpu_bf16_kernels", lambda: "emulated")
    capsys.readouterr()
    resumed = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=2, save_every=1, precision="auto", resume=str(out)))
    assert "precision: bf16 (auto, kept from the run's checkpoint: here auto would be fp32" in capsys.readouterr().out
    assert resumed.agents["policy"].precision == "bf16" and resumed.cfg.precision == "auto"


def test_an_output_dir_inside_another_runs_folder_is_refused_directly_or_through_a_link(finished, tmp_path):
    run = copy_run(finished, tmp_path, "ppo")
    (tmp_path / "link").symlink_to(run)
    for inner in (run / "final" / "inner", tmp_path / "link" / "inner"):
        line = rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_tiny.yaml", "--output_dir", inner])
        assert f"output_dir: {inner} is inside the run folder " in line and "choose a folder outside it" in line, line
        assert not inner.exists()


def test_a_checkpoint_without_an_agent_file_says_to_move_it_aside(finished, tmp_path):
    """Like every other damaged-checkpoint line: what is missing, what the method's checkpoint holds, and to move
    it aside (not a question about the method, which the manifest already answered)."""
    run = copy_run(finished, tmp_path, "ppo")
    checkpoint = latest_checkpoint(run)
    (checkpoint / "policy.pt").unlink()
    line = rejected("imdb", "ppo", ["--resume", run, "--steps", "3"])
    assert f"{checkpoint} has no policy.pt, which a ppo run's checkpoint holds (policy.pt)" in line
    assert f"move {checkpoint} aside to resume from an older checkpoint" in line and "is it a" not in line


def test_a_stop_before_any_checkpoint_says_none_was_saved(tmp_path):
    """A non-finite loss in the first iteration: no checkpoint yet, said so, never "the last good checkpoint is
    None"."""
    from types import SimpleNamespace

    from cory.errors import NonFinite
    from cory.train import Run

    run = SimpleNamespace(run_dir=SimpleNamespace(path=tmp_path))
    error = Run.stopped_by(run, NonFinite(0, "policy", "loss"), 0)
    assert str(error) == "step 0: non-finite loss for policy; no checkpoint was saved yet"
