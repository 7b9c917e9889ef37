"""A run folder is the run's alone: --overwrite deletes only what a run wrote (down to each file), only the
project's own checkpoint names are checkpoints, a checkpoint never runs code when loaded, and one run writes a
folder at a time. Real entry points on the tiny presets throughout."""
import shutil

import pytest
import yaml

from conftest import TINY, rejected, run_script
from cory.run.outputs import latest_checkpoint, read_jsonl


def copy_run(finished, tmp_path, method="ppo"):
    run = tmp_path / method
    shutil.copytree(finished / method, run)
    return run


# ----------------------------------------------------------------------------- --overwrite

# a user's file, and what the refusal names (a folder no run writes is named whole)
USER_FILES = [("final/NOTES.md", "final/NOTES.md"), ("final/my_best_model/model.safetensors", "final/my_best_model"),
              ("final/policy/README.md", "final/policy/README.md"), ("checkpoints/keep_me.txt", "checkpoints/keep_me.txt"),
              ("checkpoints/step_000002/notes.txt", "checkpoints/step_000002/notes.txt"),
              ("checkpoints/step_best/state.pt", "checkpoints/step_best"), ("eval_my_notes.json", "eval_my_notes.json"),
              ("metrics.jsonl.bak", "metrics.jsonl.bak")]


@pytest.mark.parametrize("user_file,named", USER_FILES)
def test_overwrite_refuses_a_user_file_anywhere_in_the_run(finished, tmp_path, user_file, named):
    run = copy_run(finished, tmp_path)
    (run / user_file).parent.mkdir(parents=True, exist_ok=True)
    (run / user_file).write_text("mine")
    line = rejected("imdb", "ppo", TINY + ["--output_dir", run, "--overwrite"])
    assert f"({named})" in line and "--overwrite would delete" in line
    assert (run / user_file).read_text() == "mine" and latest_checkpoint(run) is not None


@pytest.mark.slow
def test_overwrite_deletes_what_runs_wrote_and_nothing_else(tmp_path):
    run = tmp_path / "ppo"  # made here: a copy's files are not this folder's to replace (test_runs_read_only)
    p = run_script("imdb_train/ppo.py", *TINY, "--steps", "2", "--output_dir", run)
    assert p.returncode == 0, p.stderr[-2000:]
    (run / "eval_imdb.json").write_text("{}")  # lab.evaluate's results for this run: a run's file too
    old = read_jsonl(run / "metrics.jsonl")
    p = run_script("imdb_train/ppo.py", *TINY, "--steps", "1", "--output_dir", run, "--overwrite")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (run / "eval_imdb.json").exists()
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0] and read_jsonl(run / "metrics.jsonl") != old
    assert [c.name for c in (run / "checkpoints").iterdir()] == ["step_000001"]


# ----------------------------------------------------------------------------- checkpoint names

@pytest.mark.slow
def test_a_user_named_checkpoint_is_neither_resumed_nor_pruned(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    best = run / "checkpoints" / "step_best"
    shutil.copytree(latest_checkpoint(run), best)  # sorts after step_000002
    (best / "state.pt").write_bytes(b"not a state")  # resuming from it would fail loudly
    p = run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3")
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    # keep_checkpoints 1: pruning removed step_000002, not the user's folder
    assert sorted(c.name for c in (run / "checkpoints").iterdir()) == ["step_000003", "step_best"]
    assert (best / "state.pt").read_bytes() == b"not a state" and (best / "policy.pt").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["steps"] == 3


# ----------------------------------------------------------------------------- no code from a checkpoint

class Planted:
    """What a crafted checkpoint holds: an object whose unpickling runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("method,name", [("ppo", "state.pt"), ("cory", "llm2.pt")])
def test_resume_never_runs_code_from_a_checkpoint(finished, tmp_path, method, name):
    import torch

    run = copy_run(finished, tmp_path, method)
    marker = tmp_path / "pwned"
    target = latest_checkpoint(run) / name
    torch.save({"step": 2, "params": {}, "payload": Planted(marker)}, target)
    line = rejected("imdb", method, ["--resume", run, "--steps", "3"])
    assert name in line and "system" in line and "not loaded" in line
    assert not marker.exists()
    with pytest.raises(Exception):  # the same file is refused by a weights-only load itself
        torch.load(target, weights_only=True)
    assert not marker.exists()


def test_an_empty_weights_file_is_called_empty(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    (latest_checkpoint(run) / "policy.pt").write_bytes(b"")
    line = rejected("imdb", "ppo", ["--resume", run, "--steps", "3"])
    assert "policy.pt is empty (0 bytes" in line and "another model" not in line


# ----------------------------------------------------------------------------- one writer

@pytest.mark.slow
def test_one_writer_per_run_folder_and_a_killed_run_leaves_no_lock(tmp_path):
    import json

    from conftest import start_script, wait_for_rows

    out = tmp_path / "run"
    proc = start_script("imdb_train/ppo.py", *TINY, "--steps", "500", "--save_every", "1000", "--output_dir", out)
    try:
        wait_for_rows(proc, out / "metrics.jsonl", 1)
        assert json.loads((out / ".cory.lock").read_text())["pid"] == proc.pid
        for argv in ([], ["--overwrite"], ["--resume", out]):  # a second run of any kind, into the same folder
            line = rejected("imdb", "ppo", (TINY if argv[:1] != ["--resume"] else []) + ["--output_dir", out, *argv])
            assert f"being written by another run (pid {proc.pid} on " in line and "imdb_train/ppo.py" in line
    finally:
        proc.kill()  # SIGKILL: nothing of the run's own runs, the system drops its lock
        proc.communicate()
    line = rejected("imdb", "ppo", TINY + ["--output_dir", out])
    assert "another run" not in line



@pytest.mark.slow
def test_two_runs_started_into_one_folder_at_once(tmp_path):
    from conftest import start_script

    out = tmp_path / "run"
    procs = [start_script("imdb_train/ppo.py", *TINY, "--steps", "2", "--output_dir", out) for _ in range(2)]
    results = [(p.communicate(timeout=600)[1], p)[::-1] for p in procs]
    results = [(p.returncode, err) for p, err in results]
    assert sorted(code for code, _ in results) == [0, 2], [err[-1000:] for _, err in results]
    refusal = next(err for code, err in results if code == 2).strip().splitlines()
    assert len(refusal) == 1 and refusal[0].startswith("error: output_dir:"), refusal
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1]


def test_probes_of_a_folder_at_once_are_not_writers(tmp_path):
    """A data-parallel run's processes each probe the folder as they start (CI saw one probe read the other as
    another run): probes take the lock shared, and taking it for a run waits out a probe; a run's lock refuses."""
    import fcntl
    import os
    import threading

    from cory.errors import ConfigError
    from cory.run.outputs import LOCK, RunLock, in_use

    (tmp_path / LOCK).write_text('{"pid": 1, "host": "h", "started": "s", "command": "an earlier run"}\n')
    probe = os.open(tmp_path / LOCK, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another process's probe, caught mid-way
        assert in_use(tmp_path) is None
        threading.Timer(0.2, fcntl.flock, (probe, fcntl.LOCK_UN)).start()  # the probe ends
        lock = RunLock(tmp_path).acquire()
    finally:
        os.close(probe)
    try:
        refusal = in_use(tmp_path)
        assert refusal and f"another run (pid {os.getpid()} " in refusal
        with pytest.raises(ConfigError, match=f"being written by another run \\(pid {os.getpid()} "):
            RunLock(tmp_path).acquire()
    finally:
        lock.release()
    assert in_use(tmp_path) is None


# ----------------------------------------------------------------------------- the rules judge one read
def test_the_rules_judge_what_read_folder_found_and_read_nothing_again(tmp_path):
    """A rule that read the folder again would raise here: the folder is gone once read."""
    from dataclasses import replace
    from types import SimpleNamespace

    from cory.run.run_rules import (Folder, copied_run, dropped_refusal, evaluation_refusal, read_folder,
                                    restart_refusal, run_finished)

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 2\ntask: imdb\n")
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (run / "eval_imdb.json").write_text("{}")
    read = read_folder(run, ("policy",))
    assert read == Folder(run, ("ppo", "imdb"), [], [], {"metrics.jsonl": 2}, True, ["eval_imdb.json"], False,
                          False, None, False)
    shutil.rmtree(run)
    assert copied_run(read) == (f"{run} holds a run copied or cloned from another folder (metrics.jsonl (2 rows), "
                                "eval_imdb.json)")
    assert restart_refusal(read) == copied_run(read) and run_finished(read)
    assert evaluation_refusal(read) == (f"{run} holds eval_imdb.json, the evaluation of a run copied or cloned "
                                        "from another folder")
    here = replace(read, written_here=True, evaluations=[], logged_all=False)
    assert (copied_run(here), restart_refusal(here), evaluation_refusal(here), run_finished(here)) == (
        None, None, None, False)  # a run cut off before its first checkpoint here: a restart redoes its rows
    done = replace(here, final=True, final_iterations=2, final_whole=True)
    assert restart_refusal(done) == f"{run} holds a finished run's results (metrics.jsonl (2 rows), final/)"
    assert dropped_refusal(done, SimpleNamespace(steps=1)).startswith(f"steps: {run} finished its 2 iterations and kept no checkpoint")
