"""A full or read-only disk under the report, the search, an evaluation or the runner is one line naming the path
(exit 1), and what was there before stays whole: every file is written under a temporary name and renamed.

The faults are simulated in the command's own process (``os.replace`` failing as on a full or read-only disk), since
a test may run as root, for whom a read-only folder (chmod) is writable; where it is not, the real thing is tried."""
import errno
import os
import shutil

import pytest

from conftest import REPO
from cory.run.outputs import LOCK
from entry_points import lab, refused, tree

COMMITTED = REPO / "results" / "imdb_cpu_learning"
FAULTS = [(errno.ENOSPC, "No space left on device", "free space, then rerun"),
          (errno.EROFS, "Read-only file system", "make it writable or choose another place, then rerun")]


@pytest.fixture
def exp(tmp_path):
    out = tmp_path / "imdb_cpu_learning"
    shutil.copytree(COMMITTED, out)
    return out


def failing_writes(monkeypatch, under, code, reason):
    """Every rename into ``under`` fails as it would on a full (or read-only) disk, without a file name (a write
    that fills the disk names none); elsewhere, as usual."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).startswith(str(under)):
            raise OSError(code, reason)
        return real(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "replace", replace)


def one_error_line(capsys, code):
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    return errors[0]


@pytest.mark.parametrize("code,reason,advice", FAULTS)
def test_the_report_onto_a_faulty_disk(exp, monkeypatch, capsys, code, reason, advice):
    from lab import report

    before = tree(exp)
    failing_writes(monkeypatch, exp, code, reason)
    with pytest.raises(SystemExit) as e:
        report.main([str(exp)])
    assert e.value.code == 1
    assert one_error_line(capsys, code) == f"error: {exp}: {reason}; {advice}"
    assert tree(exp) == before  # the committed report and figures are whole, no temporary file is left


@pytest.mark.parametrize("code,reason,advice", FAULTS)
def test_the_search_onto_a_faulty_disk(tmp_path, monkeypatch, capsys, code, reason, advice):
    from lab import search

    out = tmp_path / "search"
    out.mkdir()
    shutil.copytree(REPO / "results" / "imdb_cpu_search" / "lr1e-4", out / "lr1e-4")
    before = tree(out)
    failing_writes(monkeypatch, out, code, reason)
    with pytest.raises(SystemExit) as e:
        search.main([str(out)])
    assert e.value.code == 1 and one_error_line(capsys, code) == f"error: {out}: {reason}; {advice}"
    assert tree(out) == before


@pytest.mark.parametrize("code,reason,advice", FAULTS)
def test_an_evaluation_onto_a_faulty_disk(finished, tmp_path, monkeypatch, capsys, code, reason, advice):
    from lab import evaluate

    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    before = tree(run)
    failing_writes(monkeypatch, run, code, reason)
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--task", "imdb", "--model", str(run), "--limit", "2", "--max_new_tokens", "3"])
    assert e.value.code == 1
    assert one_error_line(capsys, code) == f"error: {run / 'eval_imdb.json'}: {reason}; {advice}"
    assert tree(run) == before


@pytest.mark.parametrize("code,reason,advice", FAULTS)
def test_the_runner_onto_a_faulty_disk(exp, monkeypatch, capsys, code, reason, advice):
    """The runner on its own experiment (every run finished: skipped) cannot record the command in runs.json."""
    from lab import experiments

    before = tree(exp)
    failing_writes(monkeypatch, exp, code, reason)
    with pytest.raises(SystemExit) as e:
        experiments.main(["--task", "imdb", "--preset", "cpu", "--methods", "ppo", "--seeds", "0", "--steps", "20",
                          "--out", str(exp), "--no_eval"])
    assert e.value.code == 1
    assert one_error_line(capsys, code) == f"error: {exp}: {reason}; {advice}"
    assert {k: v for k, v in tree(exp).items() if k != LOCK} == before


def test_the_report_into_a_read_only_folder(exp):
    """The real thing, where the file system enforces it (not for root)."""
    exp.chmod(0o555)
    try:
        if os.access(exp, os.W_OK):
            pytest.skip("this user may write in a read-only folder (root)")
        before = tree(exp)
        refused(lab("report", exp), f"{exp}", "Permission denied", "make it writable", status=1)
        assert tree(exp) == before
    finally:
        exp.chmod(0o755)


@pytest.mark.slow
def test_an_output_dir_that_is_not_text_here_is_refused_before_anything_runs(tmp_path):
    """Under a C locale without UTF-8 mode, "run_café" reaches Python as undecodable bytes that no UTF-8 file can
    hold: the run once trained whole and then crashed writing its final models. Now: one line, before anything."""
    import os
    import subprocess
    import sys

    from conftest import REPO, one_line

    env = dict(os.environ, LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    p = subprocess.run([sys.executable, str(REPO / "imdb_train" / "ppo.py"), "--config",
                        str(REPO / "configs" / "imdb" / "ppo_tiny.yaml"), "--steps", "1", "--output_dir", "run_café"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    line = one_line(p, 2)
    assert "output_dir: 'run_caf\\udcc3\\udca9' is not text in this process's encoding" in line, line
    assert "PYTHONUTF8=1" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_runner_out_that_is_not_text_here_is_refused_before_anything_is_written(tmp_path):
    """The runner writes --out into runs.json and its logs: under a C locale without UTF-8 mode, one line first."""
    import os
    import subprocess
    import sys

    from conftest import REPO, one_line

    env = dict(os.environ, LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "lab.experiments", "--task", "imdb", "--preset", "tiny",
                        "--methods", "ppo", "--seeds", "0", "--steps", "1", "--out", "exp_café"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    line = one_line(p, 2)
    assert "--out: 'exp_caf\\udcc3\\udca9' is not text in this process's encoding" in line, line
    assert list(tmp_path.iterdir()) == []
