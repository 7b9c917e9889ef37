"""What a run keeps on disk, in HF Trainer's terms (docs/configuration.md, "Disk"): ``save_total_limit`` checkpoints
kept, ``save_only_model`` (no optimizer state: a resume warns, and is not exact), ``final_dtype``, and a
finished run's checkpoint dropped unless ``keep_resume_checkpoint`` (the tiny presets keep it: tests extend runs). Tiny runs in-process; the checks of a value before any model loads through the command line."""
import pytest

from conftest import IMDB_CORY, IMDB_PPO, REPO, rejected
from cory.cli import parse
from cory.errors import ConfigError
from cory.run.outputs import RunDir, checkpoints, latest_checkpoint, load_checkpoint_file
from cory.train import prepare_run
from test_faults import tiny, write_checkpoint

PRESET = str(REPO / "configs" / "imdb" / "ppo_tiny.yaml")


def parsed(tmp_path, *flags):
    return parse(IMDB_PPO, ["--config", PRESET, "--output_dir", str(tmp_path / "run"), *flags], check=False)


def test_save_total_limit_from_flags_files_and_its_old_name(tmp_path):
    assert parsed(tmp_path).save_total_limit == 1  # what runs kept before the field had HF's name: the newest
    assert parsed(tmp_path, "--save_total_limit", "3").save_total_limit == 3
    assert parsed(tmp_path, "--save_total_limit", "none").save_total_limit is None  # HF's default: every one
    assert parsed(tmp_path, "--keep_checkpoints", "2").save_total_limit == 2  # the field's name before
    old = tmp_path / "old.yaml"
    old.write_text(f"{(REPO / 'configs' / 'imdb' / 'ppo_tiny.yaml').read_text()}\nkeep_checkpoints: 4\n")
    assert parse(IMDB_PPO, ["--config", str(old)], check=False).save_total_limit == 4
    old.write_text("keep_checkpoints: 4\nsave_total_limit: 2\n")
    with pytest.raises(ConfigError, match="keep_checkpoints: .* gives it and save_total_limit, its name now"):
        parse(IMDB_PPO, ["--config", str(old)], check=False)
    from lab.experiment_plan import _overrides

    assert _overrides(["keep_checkpoints=2"]) == {"save_total_limit": "2"}  # the runner's --set too


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_save_total_limit_below_one_is_one_line_before_any_model_loads(tmp_path, value):
    line = rejected("imdb", "ppo", ["--config", PRESET, "--output_dir", tmp_path / "run", "--save_total_limit", value])
    assert line == f"error: save_total_limit: must be >= 1 or none (none = keep every checkpoint), got {value}"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("keep,kept", [(1, [5]), (2, [4, 5]), (None, [1, 2, 3, 4, 5])])
def test_save_total_limit_keeps_exactly_the_newest_n(tmp_path, keep, kept):
    run = RunDir(tmp_path / "run")
    run.start({"steps": 10}, resume_step=None, overwrite=False)
    for step in range(1, 6):
        run.save_checkpoint(step, write_checkpoint({"policy.pt": b"w", "state.pt": b"s"}), keep=keep)
    assert [step for step, _ in checkpoints(run.path)] == kept


def test_a_run_keeps_its_newest_save_total_limit_checkpoints(tmp_path):
    out = tmp_path / "run"
    prepare_run(tiny(IMDB_PPO, "ppo", out, steps=3, save_every=1, save_total_limit=2)).fit()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002", "step_000003"]


def test_save_only_model_checkpoints_lack_the_optimizer_and_a_resume_says_it_is_not_exact(tmp_path, capsys):
    import io

    import torch

    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=2, save_every=1, save_only_model=True))
    run.fit()
    assert "checkpoints: the model only (save_only_model: true), no optimizer state" in capsys.readouterr().out
    checkpoint = latest_checkpoint(out)
    saved = load_checkpoint_file(checkpoint / "policy.pt")
    assert "optimizer" not in saved and {"params", "kl_coef", "normalizer"} <= saved.keys()
    assert load_checkpoint_file(checkpoint / "state.pt")["model_only"] is True
    whole = io.BytesIO()
    torch.save(run.agents["policy"].state_dict(), whole)  # what the checkpoint would hold with the optimizer
    assert (checkpoint / "policy.pt").stat().st_size < 0.4 * whole.getbuffer().nbytes  # Adam's two moments left out

    with pytest.warns(UserWarning, match=r"holds no optimizer state \(saved with save_only_model: true\): Adam's "
                                         "moments start afresh, so the resumed run is not the one an uninterrupted"):
        resumed = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=3, save_every=1, resume=str(out)))
    agent = resumed.agents["policy"]
    assert resumed.start_step == 2 and agent.trainer.optimizer.state_dict()["state"] == {}  # a fresh Adam
    params = dict(agent.policy.named_parameters())
    assert all(torch.equal(params[n], p) for n, p in saved["params"].items())  # the weights are back
    assert agent.trainer.kl_ctl.value == saved["kl_coef"]


def test_final_dtype_bf16_writes_bfloat16_weights_that_load_as_the_trained_ones_cast(tmp_path):
    import json

    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=1, final_dtype="bf16", eval_every=1))
    run.fit()
    trained = run.agents["policy"].policy.pretrained_model
    trained.save_pretrained(tmp_path / "as_trained")  # what final_dtype training writes
    final = out / "final" / "policy"
    with safe_open(final / "model.safetensors", "pt") as f, \
            safe_open(tmp_path / "as_trained" / "model.safetensors", "pt") as g:
        assert sorted(f.keys()) == sorted(g.keys())  # tied weights stay one tensor
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        assert {g.get_tensor(k).dtype for k in g.keys()} == {torch.float32}
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    half = (final / "model.safetensors").stat().st_size / (tmp_path / "as_trained" / "model.safetensors").stat().st_size
    assert 0.45 < half < 0.55
    loaded = dict(AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).named_parameters())
    for name, p in trained.named_parameters():
        assert torch.equal(loaded[name], p.detach().to(torch.bfloat16).float()), name
    assert trained.dtype == torch.float32  # the run's own model was not cast
    # the run's last held-out evaluation scored the float32 weights, not the files: it is not offered as theirs
    assert (out / "eval.jsonl").is_file() and not (out / "final_evaluation.json").exists()


def test_by_default_a_finished_run_drops_its_checkpoint_and_keeps_its_final_models(tmp_path, capsys):
    from cory.run.final import final_complete
    from cory.run.run_rules import nothing_to_do

    from cory.config import PPOArgs, load_yaml

    assert PPOArgs.__dataclass_fields__["keep_resume_checkpoint"].default is False
    for preset in (REPO / "configs").glob("*/*.yaml"):  # the presets users run take the default; the tiny ones keep
        assert ("keep_resume_checkpoint" in load_yaml(preset)) == preset.name.endswith("_tiny.yaml"), preset
    out = tmp_path / "run"
    prepare_run(tiny(IMDB_CORY, "cory", out, steps=2, save_every=1, save_total_limit=2,
                     keep_resume_checkpoint=False)).fit()
    said = capsys.readouterr().out
    assert "checkpoint dropped (keep_resume_checkpoint: false): " in said and " MiB freed" in said, said
    assert not (out / "checkpoints").exists() and final_complete(out, ["llm1", "llm2"])
    assert "nothing to do" in nothing_to_do(tiny(IMDB_CORY, "cory", out, steps=2, resume=str(out)))
    line = rejected("imdb", "cory", ["--resume", out, "--steps", "3"])
    assert line == (f"error: resume: {out} finished its 2 iterations and kept no checkpoint (keep_resume_checkpoint: "
                    f"false), so it cannot go on to --steps 3; start a run of 3 iterations in another folder (--config "
                    f"{out / 'config.yaml'} --steps 3 --output_dir NEW), with --keep_resume_checkpoint true to "
                    "extend that one later")
    assert "a run cannot be shortened" in rejected("imdb", "cory", ["--resume", out, "--steps", "1"])


def test_dropping_checkpoints_deletes_only_the_runs_files_and_follows_no_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"  # a user's files, reached through links from inside the run
    (elsewhere / "step_000009").mkdir(parents=True)
    (elsewhere / "step_000009" / "state.pt").write_bytes(b"theirs")
    (elsewhere / "policy.pt").write_bytes(b"theirs too")
    run = RunDir(tmp_path / "run")
    run.start({"steps": 10}, resume_step=None, overwrite=False)
    for step in (1, 2):
        run.save_checkpoint(step, write_checkpoint({"policy.pt": b"w" * 100, "state.pt": b"s"}), keep=None)
    root = run.path / "checkpoints"
    (root / "step_000001" / "notes.txt").write_text("mine")  # a user's note in a checkpoint folder
    (root / "step_000002" / "policy.pt").unlink()
    (root / "step_000002" / "policy.pt").symlink_to(elsewhere / "policy.pt")  # a link under a checkpoint's name
    (root / "step_best").mkdir()  # a user's folder: not a checkpoint's name
    (root / "step_best" / "policy.pt").write_bytes(b"best")
    (root / "step_000009").symlink_to(elsewhere / "step_000009", target_is_directory=True)
    freed, left = run.drop_checkpoints()
    assert freed == 100 + 1 + 1  # step 1's two files, step 2's state.pt
    assert sorted(str(p.relative_to(root)) for p in left) == [
        "step_000001/notes.txt", "step_000002/policy.pt", "step_000009", "step_best"]
    assert (root / "step_000001" / "notes.txt").read_text() == "mine" and not (root / "step_000001" / "policy.pt").exists()
    assert (root / "step_000002" / "policy.pt").is_symlink() and not (root / "step_000002" / "state.pt").exists()
    assert (root / "step_best" / "policy.pt").read_bytes() == b"best"
    assert (elsewhere / "policy.pt").read_bytes() == b"theirs too"
    assert (elsewhere / "step_000009" / "state.pt").read_bytes() == b"theirs"
    linked = tmp_path / "linked"  # a checkpoints/ folder that is itself a link: nothing in it is touched
    other = RunDir(linked)
    other.start({"steps": 10}, resume_step=None, overwrite=False)
    (linked / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    assert other.drop_checkpoints() == (0, [linked / "checkpoints"])
    assert (elsewhere / "step_000009" / "state.pt").is_file() and (elsewhere / "policy.pt").is_file()
