"""What the benchmarks write beside every timing (the commit, the CPU), and a stop signal that comes while a
child process starts."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import harness  # noqa: E402


def git(tree, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=tree, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_the_commit_says_dirty_only_when_a_tracked_file_differs(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-qm", "a")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")
    assert harness.git_commit(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("not the benchmark's code\n")
    assert harness.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert harness.git_commit(tmp_path) == head + "+dirty"


def test_outside_a_git_tree_the_commit_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert harness.git_commit(tmp_path) == "?"


def test_the_cpu_info_names_the_vector_flags_and_the_load():
    info = harness.cpu_info()
    assert set(info) == {"model", "cores", "flags", "load"}
    assert all(f.startswith(("avx", "fma", "amx")) for f in info["flags"])
    assert len(info["load"]) == 3 and info["cores"] >= 1


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _popen_then(monkeypatch, module, then):
    """Popen that calls ``then()`` before it returns: a signal there comes as one between Popen's fork and its
    return, where an exception raised leaves the child running with no one holding its pid."""
    real, made = subprocess.Popen, []

    def popen(*args, **kwargs):
        made.append(real(*args, **kwargs))
        then()
        for _ in range(3):  # a few bytecodes, where the interpreter runs the signal's handler
            pass
        return made[-1]

    monkeypatch.setattr(module.subprocess, "Popen", popen)
    return made


def test_a_stop_signal_while_a_benchmark_starts_a_child_stops_that_child(monkeypatch):
    made = _popen_then(monkeypatch, harness, lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        with harness.stopped_by_signals(), harness.running(SLEEPER) as proc:
            proc.wait()  # not reached: the signal is raised as the block starts
        raise AssertionError("no Stopped")
    except harness.Stopped as e:
        assert e.exit_status == 128 + signal.SIGTERM
    assert made[0].poll() == -signal.SIGTERM  # stopped and waited for, not left running


def test_a_stop_signal_while_the_runner_starts_a_run_reaches_that_run(monkeypatch):
    """The runner's handler runs in the main thread, which may be inside ``Children.start`` (held-out evaluations
    start there): it must neither wait on the lock its own thread holds nor miss the run being started."""
    from lab import runs

    children = runs.Children()
    made = _popen_then(monkeypatch, runs, lambda: children.stop(signal.SIGTERM))  # the handler, in this thread
    started = []
    thread = threading.Thread(target=lambda: started.append(children.start(SLEEPER)), daemon=True)
    thread.start()
    thread.join(30)
    try:
        assert not thread.is_alive(), "Children.start deadlocked on its own lock"
        assert started == made and children.stopped_by == signal.SIGTERM
        assert made[0].wait(30) == -signal.SIGTERM
        assert children.start(SLEEPER) is None  # and no run starts after the signal
    finally:
        for proc in made:
            proc.kill()
