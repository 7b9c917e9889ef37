"""lab.collect brings finished runs made in a clone into the repository's folder of the same experiment: the files and
logs copied, runs.json merged (runs, invocations, methods, seeds), and nothing written where the two are not one
experiment, a run has not finished, or a file is already there."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import REPO
from entry_points import lab, refused, succeeded, tree
from lab.collect import collect

HORIZON = REPO / "results" / "arithmetic_cpu_horizon"


def record(keys: list[str]) -> dict:
    """The committed runs.json as a runner that ran only ``keys`` ("ppo/seed_0", ...) would have written it."""
    doc = json.loads((HORIZON / "runs.json").read_text())
    pairs = [k.split("/") for k in keys]
    return {**doc, "methods": list(dict.fromkeys(m for m, _ in pairs)), "seeds": sorted({int(s[5:]) for _, s in pairs}),
            "invocations": [i for i in doc["invocations"]
                            if any(f"--methods {m} --seeds {s[5:]} " in i["command"] for m, s in pairs)],
            "runs": {k: doc["runs"][k] for k in keys}}


def clone_of(folder, key: str):
    """A clone's experiment folder holding ``folder``'s run ``key`` alone, as its own runner would have left it."""
    method, seed = key.split("/")
    folder.mkdir(parents=True)
    (folder / "runs.json").write_text(json.dumps(record([key]), indent=2))
    shutil.copytree(HORIZON / "runs" / key, folder / "runs" / key)
    (folder / "runs" / key / "checkpoints").mkdir()  # not kept by the repository: not collected
    (folder / "runs" / key / "checkpoints" / "step_10.pt").write_bytes(b"weights")
    for log in (f"logs/{method}/{seed}.log", f"logs/eval/{method}_{seed}.log"):
        (folder / log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HORIZON / log, folder / log)
    shutil.copy(HORIZON / "eval_base_arithmetic.json", folder / "eval_base_arithmetic.json")
    return folder


@pytest.fixture
def repo_folder(tmp_path):
    """The repository's folder with PPO seed 0 only (CORY seed 0 is to be collected)."""
    out = tmp_path / "repo"
    shutil.copytree(HORIZON, out, ignore=shutil.ignore_patterns("cory", "cory_seed_*.log"))
    (out / "runs.json").write_text(json.dumps(record(["ppo/seed_0"]), indent=2) + "\n")
    return out


def test_a_clones_run_is_collected_whole(repo_folder, tmp_path):
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    runs, notes = collect(source, repo_folder)
    assert runs == ["cory/seed_0"] and notes == []
    for name in ("runs/cory/seed_0/metrics.jsonl", "runs/cory/seed_0/samples.jsonl", "runs/cory/seed_0/eval.jsonl",
                 "runs/cory/seed_0/config.yaml", "runs/cory/seed_0/final_evaluation.json", "logs/eval/cory_seed_0.log",
                 "logs/cory/seed_0.log"):
        assert (repo_folder / name).read_bytes() == (HORIZON / name).read_bytes(), name
    assert not (repo_folder / "runs/cory/seed_0/checkpoints").exists()
    # the two runners' records, as the folder that ran both holds them
    merged = json.loads((repo_folder / "runs.json").read_text())
    assert merged == record(["ppo/seed_0", "cory/seed_0"])
    assert list(merged["runs"]) == ["ppo/seed_0", "cory/seed_0"] and merged["methods"] == ["ppo", "cory"]


def test_the_copies_a_killed_collect_left_are_removed_by_the_next(repo_folder, tmp_path):
    """SIGKILL runs no handler: the temporary folder of copies stays; the next collect there (under the lock, so no
    collect is at work) removes it and says so. A link of that name, or another dotted folder, is left alone."""
    left = repo_folder / ".collect.4242-0123abcd.tmp"
    (left / "0").mkdir(parents=True)
    (left / "0" / "metrics.jsonl").write_text("{}\n")
    mine = repo_folder / ".collect.notes"
    mine.mkdir()
    link = repo_folder / ".collect.4243-0123abcd.tmp"
    link.symlink_to(mine)
    runs, notes = collect(clone_of(tmp_path / "clone" / "horizon", "cory/seed_0"), repo_folder)
    assert runs == ["cory/seed_0"]
    assert notes == [f"removed {left}, the copies of a collect that was killed before it finished"]
    assert not left.exists() and mine.is_dir() and link.is_symlink()


def test_a_second_collect_is_refused_and_changes_nothing(repo_folder, tmp_path):
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    collect(source, repo_folder)
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder), "cory/seed_0: the destination has it already")
    assert tree(repo_folder) == before


@pytest.mark.parametrize("damage,says", [
    (lambda doc: doc.update(steps=12), "steps: the source has 12, the destination 30"),
    (lambda doc: doc["runs"]["cory/seed_0"]["attempts"][-1].update(exit_status=143),
     "cory/seed_0: its last attempt did not finish (exit status 143)"),
    (lambda doc: doc["invocations"][-1].pop("finished"), "source: its runner has not finished"),
])
def test_what_cannot_be_merged_is_one_line_and_nothing_is_written(repo_folder, tmp_path, damage, says):
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    doc = json.loads((source / "runs.json").read_text())
    damage(doc)
    (source / "runs.json").write_text(json.dumps(doc))
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder), says)
    assert tree(repo_folder) == before


def test_a_base_draw_that_differs_is_named_and_the_first_kept(repo_folder, tmp_path):
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    base = json.loads((source / "eval_base_arithmetic.json").read_text())
    base["results"][0]["task_reward"] = 0.5
    (source / "eval_base_arithmetic.json").write_text(json.dumps(base))
    p = succeeded(lab("collect", source, repo_folder))
    assert "eval_base_arithmetic.json: the source's draw differs from the destination's" in p.stdout
    kept = repo_folder / "eval_base_arithmetic.json"
    assert kept.read_bytes() == (HORIZON / "eval_base_arithmetic.json").read_bytes()


def test_the_next_step_is_the_command_that_wrote_the_folders_document(repo_folder, tmp_path):
    """A comparison's REPORT.md, a learner pilot's SUMMARY.md (lab.learners, with its --against folders): the command
    each names, on the folder just collected into (it named the committed folder its document was written in, not a
    copy of it); a folder with neither, the report's; a document that is a pipe is not opened."""
    from lab.collect import next_step

    assert next_step(repo_folder) == f"python -m lab.report {repo_folder}"
    (repo_folder / "REPORT.md").unlink()
    assert next_step(repo_folder) == f"python -m lab.report {repo_folder}"
    (repo_folder / "SUMMARY.md").write_text(
        "# The pilot\n\nGenerated by `python -m cory.lab.learners results/p --against results/h` from the metrics.\n")
    assert next_step(repo_folder) == f"python -m lab.learners {repo_folder} --against results/h"
    p = succeeded(lab("collect", clone_of(tmp_path / "clone" / "horizon", "cory/seed_0"), repo_folder))
    assert p.stdout.strip().endswith(f"; next: python -m lab.learners {repo_folder} --against results/h")
    (repo_folder / "SUMMARY.md").unlink()
    os.mkfifo(repo_folder / "SUMMARY.md")
    assert next_step(repo_folder) == f"python -m lab.report {repo_folder}"


def test_the_first_run_comes_into_a_folder_that_holds_only_its_design(tmp_path):
    """A pilot's or a comparison's first collect: the folder holds DESIGN.md (and design.yaml), no runs.json yet."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    dest = tmp_path / "repo"
    dest.mkdir()
    shutil.copy(HORIZON / "DESIGN.md", dest / "DESIGN.md")
    shutil.copy(HORIZON / "design.yaml", dest / "design.yaml")
    assert collect(source, dest) == (["cory/seed_0"], [])
    assert json.loads((dest / "runs.json").read_text()) == record(["cory/seed_0"])
    assert (dest / "runs/cory/seed_0/metrics.jsonl").read_bytes() == (HORIZON / "runs/cory/seed_0/metrics.jsonl").read_bytes()
    assert (dest / "eval_base_arithmetic.json").is_file() and not (dest / "runs/cory/seed_0/checkpoints").exists()
    assert not (dest / "REPORT.md").exists()


@pytest.mark.parametrize("prepare,says", [
    (lambda d: (d / "runs" / "ppo").mkdir(parents=True), "has a runs/ folder but no runs.json"),
    (lambda d: (d / "design.yaml").write_text("kl_grid: [1, 2]\n"), "design.yaml: the destination's"),
    (lambda d: shutil.rmtree(d), "no such folder"),
])
def test_a_first_collect_is_refused_where_the_folder_is_not_the_experiments(tmp_path, prepare, says):
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    dest = tmp_path / "repo"
    dest.mkdir()
    shutil.copy(HORIZON / "design.yaml", dest / "design.yaml")
    prepare(dest)
    before = tree(dest) if dest.exists() else None
    refused(lab("collect", source, dest), says)
    assert (tree(dest) if dest.exists() else None) == before


@pytest.mark.parametrize("which", ["source", "destination"])
@pytest.mark.parametrize("damage,says", [
    (lambda doc: [doc], "runs.json holds a JSON list, not the runner's record"),
    (lambda doc: 3, "runs.json holds a JSON number, not the runner's record"),
    (lambda doc: {**doc, "runs": {k: "finished" for k in doc["runs"]}}, "is a JSON string, not a run's record"),
    (lambda doc: {**doc, "invocations": [None]}, "runs.json's invocations are not a list of objects"),
    (lambda doc: {**doc, "seeds": "0,1"}, "runs.json's seeds are not a list of whole numbers"),
    (lambda doc: {k: v for k, v in doc.items() if k != "runs"}, "runs.json has no runs"),
    (lambda doc: {**doc, "runs": {k: {**r, "attempts": []} for k, r in doc["runs"].items()}}, "records no attempt"),
])
def test_a_runs_json_of_another_shape_is_one_line_and_nothing_is_written(repo_folder, tmp_path, which, damage, says):
    """Each was a traceback (or, a runs.json with no attempts, read as cut off with exit status None)."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    path = (source if which == "source" else repo_folder) / "runs.json"
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder), f"{which} {path}", says)
    assert tree(repo_folder) == before


@pytest.mark.parametrize("which", ["source", "destination"])
def test_a_runs_json_that_is_a_pipe_is_refused_unopened(repo_folder, tmp_path, which):
    """It was opened, and a pipe waits for a writer: the collect hung."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    path = (source if which == "source" else repo_folder) / "runs.json"
    path.unlink()
    os.mkfifo(path)
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder, timeout=120), f"{which} {path}: a named pipe, not a regular file")
    assert tree(repo_folder) == before


@pytest.mark.parametrize("key", ["../../escaped/seed_0", "/tmp/abs/seed_0", "", "cory/seed_0/..", "cory", "cory/x/seed_0",
                                 "./seed_0", "cory/seed_١"])
def test_a_run_key_that_is_not_the_runners_is_refused(repo_folder, tmp_path, key):
    """The key is a path into the destination: one that walked out of it wrote files outside."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    doc = json.loads((source / "runs.json").read_text())
    doc["runs"] = {key: doc["runs"]["cory/seed_0"]}
    (source / "runs.json").write_text(json.dumps(doc))
    if key and not key.startswith("/"):  # the run's files where the key points, as a hostile clone would hold them
        (source / "runs" / key).mkdir(parents=True, exist_ok=True)
        shutil.copy(source / "runs/cory/seed_0/metrics.jsonl", source / "runs" / key / "metrics.jsonl")
    before, around = tree(repo_folder), tree(tmp_path / "clone")
    refused(lab("collect", source, repo_folder), f"the run key {key!r} is not one the runner writes")
    assert tree(repo_folder) == before and tree(tmp_path / "clone") == around
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clone", "repo"]


@pytest.mark.parametrize("inside", ["source", "source's run", "destination's run", "a run's manifest"])
def test_a_destination_inside_the_source_or_a_run_is_refused(repo_folder, tmp_path, inside):
    """Each was accepted: the runs copied into the folder they were read from, or into another run's folder."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    dest = {"source": source / "copy", "source's run": source / "runs" / "cory" / "seed_0" / "copy",
            "destination's run": repo_folder / "runs" / "ppo" / "seed_0" / "copy",
            "a run's manifest": repo_folder / "runs" / "ppo" / "seed_0"}[inside]
    dest.mkdir(exist_ok=True)
    shutil.copy(HORIZON / "design.yaml", dest / "design.yaml")  # a first collect's folder, but for where it is
    before, theirs = tree(dest), tree(source)
    refused(lab("collect", source, dest), f"destination {dest}: ")
    assert tree(dest) == before and tree(source) == theirs


@pytest.mark.parametrize("damage,says", [
    (lambda run: (run / "metrics.jsonl").unlink(), "has no metrics.jsonl"),
    (lambda run: (run / "config.yaml").unlink(), "has no config.yaml"),
    (lambda run: (run / "metrics.jsonl").write_text(""), "has a metrics.jsonl with no rows"),
    (lambda run: (run / "metrics.jsonl").write_text('{"step": 0, "policy/task_re'), "has a metrics.jsonl with no rows"),
])
def test_a_run_folder_without_its_metrics_or_config_is_not_collected_as_finished(repo_folder, tmp_path, damage, says):
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    damage(source / "runs" / "cory" / "seed_0")
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder), f"cory/seed_0: runs.json says it finished, but "
                                                 f"{source / 'runs' / 'cory' / 'seed_0'} {says}",
            "not collected as finished")
    assert tree(repo_folder) == before


def _linked(path, to):
    """``path`` replaced by a symbolic link to ``to`` (a copy of what ``path`` held, kept outside the clone)."""
    if path.is_dir():
        shutil.copytree(path, to)
        shutil.rmtree(path)
    else:
        shutil.copy(path, to)
        path.unlink()
    path.symlink_to(to)
    return path


@pytest.mark.parametrize("where", ["runs/cory/seed_0/metrics.jsonl", "runs/cory/seed_0/samples.jsonl",
                                   "runs/cory/seed_0", "runs/cory", "runs", "logs/cory/seed_0.log", "logs/eval",
                                   "eval_base_arithmetic.json", "runs.json"])
def test_a_symbolic_link_in_the_source_is_refused_not_followed(repo_folder, tmp_path, where):
    """Each was followed without a word: a private file's content, another seed's run, came in as the run's."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    repo_folder.joinpath("eval_base_arithmetic.json").unlink()  # so that the source's would be copied
    link = _linked(source / where, tmp_path / "elsewhere")
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder), f"{link}: a symbolic link (to {tmp_path / 'elsewhere'})",
            "follows no link")
    assert tree(repo_folder) == before


@pytest.mark.parametrize("where", ["runs/cory", "logs/cory", "logs/eval", "runs.json"])
def test_a_symbolic_link_in_the_destination_is_not_written_through(repo_folder, tmp_path, where):
    """A link where the runs or logs go, or the record: the copy would land where it points, the record replace it."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    if not (repo_folder / where).exists():
        (repo_folder / where).mkdir(parents=True)
    link = _linked(repo_folder / where, tmp_path / "elsewhere")
    before = tree(repo_folder)
    theirs = tree(tmp_path / "elsewhere") if where != "runs.json" else (tmp_path / "elsewhere").read_bytes()
    refused(lab("collect", source, repo_folder), f"{link}: a symbolic link")
    assert tree(repo_folder) == before and link.is_symlink()
    assert (tree(tmp_path / "elsewhere") if where != "runs.json" else (tmp_path / "elsewhere").read_bytes()) == theirs


@pytest.mark.parametrize("where", ["runs/cory/seed_0/samples.jsonl", "runs/cory/seed_0/metrics.jsonl",
                                   "logs/cory/seed_0.log"])
def test_a_pipe_among_a_runs_files_is_refused_not_skipped(repo_folder, tmp_path, where):
    """A pipe among a run's files was left out without a word (and a log one, too)."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    (source / where).unlink()
    os.mkfifo(source / where)
    before = tree(repo_folder)
    refused(lab("collect", source, repo_folder, timeout=120), f"{source / where}: a named pipe, not a regular file")
    assert tree(repo_folder) == before


@pytest.mark.parametrize("which", ["destination", "source"])
def test_a_folder_another_writer_holds_is_refused(repo_folder, tmp_path, which):
    """Two collects into one folder at once could each merge its runs into the runs.json it read, and the second's
    rename lost the first's record: a run that could then never be collected again. A collect takes the runner's
    lock on the destination (a runner there, or another collect, holds it), and a runner at work in the source is
    waited for too."""
    from cory.run.outputs import RunLock

    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    held = RunLock(repo_folder if which == "destination" else source, "--out", "experiment runner").acquire()
    try:
        before = tree(repo_folder)
        refused(lab("collect", source, repo_folder),
                f"{which}: {repo_folder if which == 'destination' else source} is being written by another "
                f"experiment runner or collect (pid {os.getpid()}")
        assert tree(repo_folder) == before
    finally:
        held.release()
    succeeded(lab("collect", source, repo_folder))
    assert json.loads((repo_folder / "runs.json").read_text()) == record(["ppo/seed_0", "cory/seed_0"])


# a collect stopped by ``signal`` at the ``nth`` call of ``step`` (a copy halfway through a file, or a rename into
# place): what a SIGTERM from a scheduler, or Ctrl-C, does to a collect of a long run's files
STOPPED_AT = """
import os, shutil, signal, sys
# a suite started in the background by a non-interactive shell runs with SIGINT ignored, inherited here: a terminal's
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is what the test sends
import lab.collect
step, nth, signum = sys.argv[3], int(sys.argv[4]), getattr(signal, sys.argv[5])
calls = []
if step == "copy":
    real = shutil.copyfileobj
    def stopping(f, out, *args):
        calls.append(1)
        if len(calls) == nth:
            out.write(f.read(100))
            out.flush()
            os.kill(os.getpid(), signum)
        real(f, out, *args)
    shutil.copyfileobj = stopping
else:
    real = os.rename
    def stopping(a, b):
        real(a, b)
        calls.append(1)
        if len(calls) == nth:
            os.kill(os.getpid(), signum)
    os.rename = stopping
lab.collect.main(sys.argv[1:3])
"""


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("step,nth", [("copy", 1), ("copy", 4), ("rename", 1), ("rename", 5)])
def test_a_stop_mid_collect_removes_what_it_copied_and_the_rerun_collects(repo_folder, tmp_path, step, nth, signum):
    """A SIGTERM ended the collect where it stood: a cut file was left, and the rerun was refused ("already there")."""
    source = clone_of(tmp_path / "clone" / "horizon", "cory/seed_0")
    before = tree(repo_folder)
    p = subprocess.run([sys.executable, "-c", STOPPED_AT, str(source), str(repo_folder), step, str(nth), signum],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 130 and p.stderr.strip() == "interrupted: nothing was collected (runs.json unchanged)", \
        (p.returncode, p.stderr[-2000:])
    after = tree(repo_folder)
    # every file as it was, and nothing else but the lock's file (it stays, as the runner's does); the folders a stop
    # removed leave their parents' times changed
    assert sorted(after) == sorted([*before, ".cory.lock"])
    assert {k: v for k, v in after.items() if v[0] is not None and k != ".cory.lock"} == \
        {k: v for k, v in before.items() if v[0] is not None}
    succeeded(lab("collect", source, repo_folder))
    assert json.loads((repo_folder / "runs.json").read_text()) == record(["ppo/seed_0", "cory/seed_0"])
    assert (repo_folder / "runs/cory/seed_0/metrics.jsonl").read_bytes() == \
        (HORIZON / "runs/cory/seed_0/metrics.jsonl").read_bytes()
    assert not [p for p in repo_folder.rglob("*") if p.name.endswith(".tmp")]
