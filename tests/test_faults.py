"""Faults never cost a run: a kill (even mid-save), Ctrl-C, a non-finite or raising reward, an empty answer.

Real tiny runs throughout; the bad rewards and empty answers are injected in-process into a prepared run.
"""
import math
import signal
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from conftest import IMDB_CORY, IMDB_PPO, REPO, run_script, start_script, wait_for_rows
from cory.config import build, load_yaml
from cory.run.outputs import RunDir, latest_checkpoint, read_jsonl
from cory.run.run_rules import check_output_dir
from cory.train import RunError, prepare_run


def tiny(cls, method, out, **over):
    base = load_yaml(REPO / "configs" / "imdb" / f"{method}_tiny.yaml")
    base.update(output_dir=str(out), **over)
    return build(cls, base)


def start(method, out, *args):
    return start_script(f"imdb_train/{method}.py", "--config", f"configs/imdb/{method}_tiny.yaml", "--output_dir",
                        out, *args)


def write_checkpoint(files):
    def write(folder):
        for name, data in files.items():
            (folder / name).write_bytes(data)
    return write


def test_resume_ignores_half_written_checkpoints(tmp_path):
    run = RunDir(tmp_path / "run")
    run.start({"steps": 10}, resume_step=None, overwrite=False)
    run.save_checkpoint(2, write_checkpoint({"llm1.pt": b"a", "state.pt": b"2"}), keep=5)
    run.save_checkpoint(4, write_checkpoint({"llm1.pt": b"b", "state.pt": b"4"}), keep=5)

    def dies_midway(folder):  # an exception while saving: nothing half-written becomes a checkpoint
        (folder / "llm1.pt").write_bytes(b"partial")
        raise OSError("disk full")
    with pytest.raises(OSError):
        run.save_checkpoint(6, dies_midway, keep=5)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_000002", "step_000004"]

    # what a kill leaves: a temporary folder mid-write, and a newer folder without its state file
    leftover = root / ".tmp_step_000006_x1y2"
    leftover.mkdir()
    (leftover / "llm1.pt").write_bytes(b"partial")
    (root / "step_000008").mkdir()
    (root / "step_000008" / "llm1.pt").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path / "run") == root / "step_000004"
    check_output_dir(str(tmp_path / "run"), resume=True, overwrite=False)
    assert (root / "step_000004" / "state.pt").read_bytes() == b"4"
    # the resumed run clears the dead save's temporary folder
    RunDir(tmp_path / "run").start({"steps": 10}, resume_step=4, overwrite=False)
    assert not leftover.exists() and (root / "step_000004").is_dir()


@pytest.mark.slow
def test_sigkill_mid_iteration_then_resume(tmp_path):
    out = tmp_path / "run"
    proc = start("cory", out, "--steps", "4", "--save_every", "1")
    wait_for_rows(proc, out / "metrics.jsonl", 3)
    proc.kill()  # SIGKILL: no handler runs, possibly in the middle of writing checkpoint 3
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    before = read_jsonl(out / "metrics.jsonl")
    done = int(latest_checkpoint(out).name.split("_")[1])
    assert done >= 2
    # and a newer save that never completed, as a kill during it would leave
    (out / "checkpoints" / ".tmp_step_000099_zz").mkdir()
    (out / "checkpoints" / "step_000099").mkdir()

    p = run_script("imdb_train/cory.py", "--resume", out, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # as many rows as an uninterrupted run, none twice
    assert rows[:done] == before[:done]  # rows up to the checkpoint are kept as written
    assert [s["step"] for s in read_jsonl(out / "samples.jsonl")] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert not (out / "checkpoints" / ".tmp_step_000099_zz").exists()
    assert (out / "final" / "llm1").is_dir() and (out / "final" / "llm2").is_dir()


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    proc = start("ppo", out, "--steps", "4", "--save_every", "100")
    wait_for_rows(proc, out / "metrics.jsonl", 1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and f"continue with --resume {out}" in stderr
    # the iteration under way when Ctrl-C came is finished and saved, nothing half done
    done = len(read_jsonl(out / "metrics.jsonl"))
    assert 1 <= done < 4
    state = torch.load(latest_checkpoint(out) / "state.pt", weights_only=False)
    assert state["step"] == done and state["task"]["batches"] == done
    assert not (out / "final").exists()


def nan_reward_at(run, call, index):
    """The task's real reward, with text ``index`` of its ``call``-th batch (0-based) made NaN."""
    score, calls = run.task.score, []

    def scored(examples, responses):
        out = score(examples, responses)
        calls.append(1)
        if len(calls) == call + 1:
            out[index] = math.nan
        return out
    run.task.score = scored


@pytest.mark.slow
def test_nonfinite_reward_stops_after_saving_the_last_good_state(tmp_path):
    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_CORY, "cory", out, steps=2, save_every=100))
    # CORY scores pioneer then observer answers in one call: text 4 + 1 is the observer's text 1
    nan_reward_at(run, call=0, index=run.cfg.batch_size + 1)
    with pytest.raises(RunError, match=r"step 0: non-finite reward for llm2 \(text 1\).*step_000000"):
        run.fit()
    assert not (out / "metrics.jsonl").exists()
    state = torch.load(latest_checkpoint(out) / "state.pt", weights_only=False)
    # the state before the iteration drew its batch: a resumed run redoes that iteration exactly
    assert state["step"] == 0 and state["task"]["batches"] == 0


@pytest.mark.slow
def test_nonfinite_reward_skip(tmp_path):
    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=2, on_nonfinite="skip"))
    nan_reward_at(run, call=0, index=3)
    with pytest.warns(UserWarning, match=r"step 0: non-finite reward for policy \(text 3\); batch skipped"):
        run.fit()
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert (out / "final" / "policy").is_dir()


@pytest.mark.slow
def test_raising_reward_names_the_reward_and_the_text(tmp_path):
    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=1))
    position = run.task.state_dict()
    queries = [ex.query for ex in run.task.sample(run.cfg.batch_size)]
    run.task.load_state_dict(position)
    bad = queries[2]
    vader = run.task.reward

    def reward(qs, responses):  # a reward that cannot score one particular text
        if bad in qs:
            raise ValueError("cannot score this text")
        return vader(qs, responses)
    run.task.reward = reward
    with pytest.raises(RunError) as e:
        run.fit()
    assert f"reward vader failed on text {queries.index(bad)} " in str(e.value)
    assert "ValueError: cannot score this text" in str(e.value) and "\n" not in str(e.value)
    assert not (out / "metrics.jsonl").exists() or not read_jsonl(out / "metrics.jsonl")


class EndAtOnce(LogitsProcessor):
    """Only end-of-sequence can be sampled, in every row or every other row."""

    def __init__(self, eos, rows):
        self.eos, self.rows = eos, rows

    def __call__(self, input_ids, scores):
        rows = torch.arange(scores.shape[0]) % (1 if self.rows == "every" else 2) == 0
        scores[rows] = -math.inf
        scores[rows, self.eos] = 0.0
        return scores


def ending_at_once(cls, method, tmp_path, which):
    """One iteration of a tiny run whose sampler ends ``which`` ("every" or "some") answer with EOS at once:
    (its metrics row, its samples)."""
    out = tmp_path / "run"
    run = prepare_run(tiny(cls, method, out, steps=1, samples_per_step=4, allow_early_eos=True))
    run.rollout.gen_kwargs["logits_processor"] = LogitsProcessorList([EndAtOnce(run.tokenizer.eos_token_id, which)])
    run.fit()
    [row] = read_jsonl(out / "metrics.jsonl")
    return row, read_jsonl(out / "samples.jsonl")


def test_cory_answers_that_all_end_at_once(tmp_path):
    row, samples = ending_at_once(IMDB_CORY, "cory", tmp_path, "every")
    for s in samples:  # the observer reads an empty pioneer answer
        assert s["pioneer_response"] == s["observer_response"] == ""
    for agent in ("llm1", "llm2"):
        assert math.isfinite(row[f"{agent}/kl"]) and math.isfinite(row[f"{agent}/policy_loss"])
        assert row[f"{agent}/response_length"] == 1.0  # the end-of-sequence token is the whole response


def test_ppo_some_answers_end_at_once(tmp_path):
    row, samples = ending_at_once(IMDB_PPO, "ppo", tmp_path, "some")
    assert [s["response"] == "" for s in samples] == [True, False, True, False]
    assert math.isfinite(row["policy/kl"]) and math.isfinite(row["policy/policy_loss"])
    assert 1 < row["policy/response_length"] < 8  # rows of 1 token beside rows of 4 to 8


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_named_and_keeps_the_older_one(tmp_path):
    out = tmp_path / "run"
    run = prepare_run(tiny(IMDB_PPO, "ppo", out, steps=2, save_every=1))
    save = run.run_dir.save_checkpoint

    def disk_full_from_step_2(step, write, keep):
        def onto_a_full_disk(folder):  # every write to /dev/full fails with ENOSPC, as on a full disk
            for name in ("policy.pt", "state.pt"):
                (folder / name).symlink_to("/dev/full")
            write(folder)
        return save(step, write if step < 2 else onto_a_full_disk, keep)
    run.run_dir.save_checkpoint = disk_full_from_step_2
    with pytest.raises(RunError) as e:
        run.fit()
    message = str(e.value)
    assert "checkpoint 2: no space left on the device holding" in message and "\n" not in message
    assert "the checkpoint needs about " in message and "step_000001, is kept" in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    assert torch.load(latest_checkpoint(out) / "state.pt", weights_only=False)["step"] == 1


def test_a_second_signal_during_a_checkpoint_write_stays_an_interrupt(tmp_path, monkeypatch):
    """The KeyboardInterrupt of a second stop signal arriving while torch writes a checkpoint through its file
    comes out as KeyboardInterrupt (the clean 'interrupted' exit), not as torch's zip writer's RuntimeError."""
    import io

    from cory.run import checkpoint

    class InterruptedFile(io.FileIO):
        def write(self, data):
            if self.tell() > 0:  # mid-file, as a signal arriving during the write
                raise KeyboardInterrupt
            return super().write(data)

    monkeypatch.setattr(checkpoint, "open", lambda path, mode: InterruptedFile(path, "w"), raising=False)
    with pytest.raises(KeyboardInterrupt):
        checkpoint._save({"w": torch.zeros(1000)}, tmp_path / "policy.pt")
