"""No output flag replaces what is not a regular file (hardening round 6): a --json, a report's REPORT.md or figure
that names a named pipe, a socket or a device is refused in one line before any work, and stays what it was. A file
written whole goes through a temporary file of its own (two writers never share one) that no stop leaves behind.
Never tested on the machine's own /dev files: a pipe and a socket of the test's own stand for them."""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import REPO
from cory.errors import ConfigError
from cory.run.targets import check_target, stopped_as_interrupt, target_refusal, write_whole
from entry_points import lab, refused, tree
from test_benchmark_mistakes import SMALLEST, bench
from test_report import synthetic


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket(tmp_path):
    """A socket file in tmp_path (bound from inside it: a socket's path is limited to about 100 characters)."""
    s = socket.socket(socket.AF_UNIX)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        s.bind("results.sock")
    finally:
        os.chdir(here)
    yield tmp_path / "results.sock"
    s.close()


def still(path: Path, test) -> None:
    assert test(os.lstat(path).st_mode), f"{path} was replaced"


def test_the_guard_names_what_the_target_is(tmp_path, unix_socket):
    pipe = fifo(tmp_path / "pipe.json")
    (tmp_path / "link.json").symlink_to(pipe)
    assert "is a named pipe, not a regular file" in target_refusal(pipe, "--json")
    assert "is a named pipe" in target_refusal(tmp_path / "link.json", "--json")  # a link is judged by its target
    assert "is a socket, not a regular file" in target_refusal(unix_socket, "--json")
    assert "is a folder; give a file name" in target_refusal(tmp_path, "--json")
    # only read, never written: /dev/null and /dev/stdout are devices, pipes or links the rename would replace
    assert "is a character device" in target_refusal("/dev/null", "--json")
    assert target_refusal("/dev/stdout", "--json") is not None
    assert target_refusal(tmp_path / "new.json", "--json") is None
    (tmp_path / "old.json").write_text("{}")
    assert target_refusal(tmp_path / "old.json", "--json") is None


def test_write_whole_refuses_a_pipe_that_appeared_since_the_check(tmp_path):
    target = tmp_path / "out.json"

    def fill(tmp):
        tmp.write_text("{}")
        fifo(target)  # made between the command's check and the rename

    with pytest.raises(ConfigError, match="is a named pipe"):
        write_whole(target, fill, "--json")
    still(target, stat.S_ISFIFO)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    target = tmp_path / "fig_kl.png"
    names, barrier = [], threading.Barrier(2)

    def fill(tmp):
        names.append(tmp.name)
        tmp.write_text(tmp.name)
        barrier.wait(10)  # both temporary files exist at once

    writers = [threading.Thread(target=write_whole, args=(target, fill)) for _ in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(30)
    assert len(set(names)) == 2 and target.read_text() in names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig_kl.png"]


def test_a_sigterm_while_writing_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "REPORT.md"
    target.write_text("the report before")

    def fill(tmp):
        tmp.write_text("half")
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        with stopped_as_interrupt():
            write_whole(target, fill)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["REPORT.md"]
    assert target.read_text() == "the report before"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_check_target_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--out"):
        check_target(fifo(tmp_path / "p"), "--out")


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_a_benchmarks_json_onto_a_pipe_is_refused_before_any_work(name, tmp_path):
    pipe = fifo(tmp_path / "results.json")
    p = bench(name, *SMALLEST[name], "--json", pipe, cwd=tmp_path,
              timeout=180)  # a read of the pipe would hang
    refused(p, f"--json: {pipe} exists and is a named pipe, not a regular file")
    still(pipe, stat.S_ISFIFO)


def test_a_benchmarks_json_onto_a_socket_is_refused(tmp_path, unix_socket):
    p = bench("levers.py", *SMALLEST["levers.py"], "--json", unix_socket, cwd=tmp_path, timeout=180)
    refused(p, f"--json: {unix_socket} exists and is a socket")
    still(unix_socket, stat.S_ISSOCK)


def test_the_benchmarks_shared_writer_never_replaces_a_pipe(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from harness import save_json, write_json

    pipe = fifo(tmp_path / "results.json")
    assert "is a named pipe" in write_json(pipe, {"command": "x"})
    assert save_json(pipe, {"command": "x"}) == 1
    still(pipe, stat.S_ISFIFO)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    write_json(tmp_path / "ok.json", {"command": "x"})
    assert json.loads((tmp_path / "ok.json").read_text()) == {"command": "x"}


@pytest.mark.slow
def test_evaluate_refuses_a_pipe_a_socket_and_a_link_to_a_pipe_before_any_model_loads(tmp_path, unix_socket,
                                                                                       monkeypatch, capsys):
    from lab import evaluate

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(evaluate, "load_causal_lm", loaded)
    pipe = fifo(tmp_path / "results.json")
    (tmp_path / "link.json").symlink_to(pipe)
    args = ["--task", "imdb", "--model", "tiny", "--limit", "2", "--max_new_tokens", "2"]
    for target, kind in ((pipe, "a named pipe"), (unix_socket, "a socket"), (tmp_path / "link.json", "a named pipe")):
        with pytest.raises(SystemExit) as e:
            evaluate.main([*args, "--json", str(target)])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, err
        assert err[0].startswith(f"error: --json: {target} exists and is {kind}, not a regular file"), err
    still(pipe, stat.S_ISFIFO)
    still(tmp_path / "link.json", stat.S_ISLNK)
    still(unix_socket, stat.S_ISSOCK)


@pytest.mark.parametrize("name", ["REPORT.md", "fig_kl.png"])
def test_the_report_refuses_a_pipe_among_its_files_before_drawing_any(name, tmp_path):
    synthetic(tmp_path, cory_wins=False, seeds=(0, 1), steps=6)
    fifo(tmp_path / name)
    before = tree(tmp_path)
    p = lab("report", tmp_path, timeout=300)
    refused(p, f"{name}: {tmp_path / name} exists and is a named pipe")
    assert tree(tmp_path) == before
    still(tmp_path / name, stat.S_ISFIFO)


def test_the_report_never_replaces_a_report_md_it_did_not_write(tmp_path):
    synthetic(tmp_path, cory_wins=False, seeds=(0, 1), steps=6)
    (tmp_path / "REPORT.md").write_text("# My reading of these runs\n\nHand-written; lab.report replaced it.\n")
    before = tree(tmp_path)
    refused(lab("report", tmp_path, timeout=300),
            f"REPORT.md: {tmp_path / 'REPORT.md'} was not written by `python -m lab.report`", "move it away")
    assert tree(tmp_path) == before


def test_the_search_never_replaces_the_learner_summary(tmp_path):
    """lab.learners and lab.search both write SUMMARY.md: each replaces only its own."""
    synthetic(tmp_path / "base", cory_wins=False, seeds=(0, 1), steps=6)
    (tmp_path / "SUMMARY.md").write_text("# The learner pilot\n\nGenerated by `python -m lab.learners x` from ...\n")
    before = tree(tmp_path)
    p = subprocess.run([sys.executable, "-m", "lab.search", str(tmp_path)], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    refused(p, f"SUMMARY.md: {tmp_path / 'SUMMARY.md'} was not written by `python -m lab.search`")
    assert tree(tmp_path) == before


def test_the_search_summary_refuses_a_pipe_before_drawing(tmp_path):
    synthetic(tmp_path / "base", cory_wins=False, seeds=(0, 1), steps=6)
    fifo(tmp_path / "SUMMARY.md")
    before = tree(tmp_path)
    p = subprocess.run([sys.executable, "-m", "lab.search", str(tmp_path)], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    refused(p, f"SUMMARY.md: {tmp_path / 'SUMMARY.md'} exists and is a named pipe")
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_two_reports_at_once_on_one_folder_both_finish_and_leave_no_temporary_file(tmp_path):
    """They shared one temporary name per figure and collided (4 of 6 tries): now each writes its own."""
    synthetic(tmp_path, cory_wins=False, seeds=(0, 1), steps=6)
    procs = [subprocess.Popen([sys.executable, "-m", "lab.report", str(tmp_path)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert (tmp_path / "REPORT.md").is_file()


LINKED = "is a symbolic link; give the file itself"


def test_a_link_to_a_file_or_to_nothing_is_refused_as_a_link(tmp_path):
    (tmp_path / "mine.json").write_text('{"command": "python -m lab.evaluate --task imdb"}')
    (tmp_path / "link.json").symlink_to(tmp_path / "mine.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    for link in ("link.json", "dangling.json"):
        assert target_refusal(tmp_path / link, "--json") == f"--json {tmp_path / link} {LINKED} (the file would " \
            "replace the link, and what it points to would stay as it was)"
    (tmp_path / "dir_link").symlink_to(tmp_path)
    assert "is a folder" in target_refusal(tmp_path / "dir_link", "--json")  # a link is judged by its target first
    with pytest.raises(ConfigError, match=LINKED):
        write_whole(tmp_path / "link.json", "{}")
    still(tmp_path / "link.json", stat.S_ISLNK)
    assert (tmp_path / "mine.json").read_text() == '{"command": "python -m lab.evaluate --task imdb"}'


def _linked_output(tmp_path, program: str) -> Path:
    """A --json file that ``program`` wrote, and a link to it: what the command is given."""
    (tmp_path / "written.json").write_text(json.dumps({"command": f"python -m {program} --task arithmetic"}))
    (tmp_path / "out.json").symlink_to(tmp_path / "written.json")
    return tmp_path / "out.json"


def test_evaluate_refuses_a_json_link_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from lab import evaluate

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(evaluate, "load_causal_lm", loaded)
    link = _linked_output(tmp_path, "lab.evaluate")
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--task", "imdb", "--model", "tiny", "--limit", "2", "--max_new_tokens", "2", "--json",
                       str(link)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"error: --json {link} {LINKED} (the file would replace the link, and what "
                                         "it points to would stay as it was)"], err
    still(link, stat.S_ISLNK)


def test_transfer_check_and_a_benchmark_refuse_a_json_link(tmp_path):
    link = _linked_output(tmp_path, "lab.transfer_check")
    before = tree(tmp_path)
    refused(lab("transfer_check", "--task", "arithmetic", "--dataset", "sums_2x1", "--n", "8", "--json", link,
                timeout=300), f"--json {link} {LINKED}")
    p = bench("levers.py", *SMALLEST["levers.py"], "--json", link, cwd=tmp_path, timeout=180)
    refused(p, f"--json {link} {LINKED}")
    assert tree(tmp_path) == before
