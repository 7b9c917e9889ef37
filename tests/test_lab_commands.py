"""The lab's commands (the experiment runner, the report, evaluate) lose nothing and state nothing a run did not do:
the runner never shortens a finished run nor takes a training run's folder as its own, a verdict pools only runs of
the same settings, a figure is written whole or not at all, and Ctrl-C ends each command with exit status 130 and
one line. Each case through its real entry point."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, one_line


def run(*args, cwd=REPO, timeout=900):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def runner(*args, timeout=900):
    return run("-m", "lab.experiments", *args, timeout=timeout)


# ----------------------------------------------------------------------------- the runner loses nothing

@pytest.mark.slow
def test_the_runner_never_shortens_a_finished_run(tmp_path):
    out = tmp_path / "exp"
    base = ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0", "--out", out, "--no_eval",
            "--no_report"]
    assert runner(*base, "--steps", "2").returncode == 0
    run_dir = out / "runs" / "ppo" / "seed_0"
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    line = one_line(runner(*base, "--steps", "1"), 2)
    assert "runs/ppo/seed_0" in line and "2 iterations, more than --steps 1" in line
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
    # the same folder shaped as a committed results/ folder: metrics, samples, config; no weights
    shutil.rmtree(run_dir / "final")
    shutil.rmtree(run_dir / "checkpoints")
    metrics = (run_dir / "metrics.jsonl").read_text()
    line = one_line(runner(*base, "--steps", "1"), 2)
    assert "2 iterations, more than --steps 1" in line
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def test_the_runner_refuses_a_training_run_as_its_out_folder(finished):
    before = sorted(p.name for p in (finished / "ppo").iterdir())
    line = one_line(runner("--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0",
                           "--out", finished / "ppo"), 2)
    assert "is a training run's folder" in line
    assert sorted(p.name for p in (finished / "ppo").iterdir()) == before


# ----------------------------------------------------------------------------- the report

def test_a_verdict_pools_only_runs_of_the_same_settings(tmp_path):
    from test_report import cory_rows, ppo_rows, write_run
    import numpy as np

    t = np.arange(12)
    for seed in (0, 1, 2):
        write_run(tmp_path, "ppo", seed, ppo_rows(0.1 * t, t), {"learning_rate": 1e-4 if seed < 2 else 3e-5})
        write_run(tmp_path, "cory", seed, cory_rows(0.1 * t, 0.5 * t, 0.1 * t, 0.5 * t))
    p = run("-m", "lab.report", tmp_path)
    assert p.returncode == 0, p.stderr
    report = (tmp_path / "REPORT.md").read_text()
    assert "**not decided** — PPO's runs were made with different settings (learning_rate 0.0001 (seeds 0, 1), " \
           "3e-05 (seed 2))" in report


def test_figures_and_reports_are_written_whole(tmp_path, monkeypatch):
    from lab import figures

    class Broken:
        def savefig(self, path, format=None, metadata=None):
            with open(path, "wb") as f:
                f.write(b"half")
            raise KeyboardInterrupt

    target = tmp_path / "fig.png"
    fig, ax = figures._axes("old", "x", "y")
    ax.plot([0, 1], [1, 0])
    figures.save_figure(fig, target)  # the lab's own figure, which a new one may replace
    old = target.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        figures.save_figure(Broken(), target)
    assert target.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]


# ----------------------------------------------------------------------------- Ctrl-C

def _output_until(proc, marker: str, timeout: float) -> tuple[list[str], threading.Thread]:
    """Collect the process's output in a thread (it ends with the output); return once ``marker`` shows (the
    command is at work, past its imports: a signal during an import can be swallowed by library code, so a fixed
    sleep is flaky on a busy machine) or the timeout passes."""
    chunks: list[str] = []

    def read():
        for chunk in iter(lambda: proc.stdout.read(64), ""):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while marker not in "".join(chunks) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    return chunks, reader


@pytest.mark.slow
@pytest.mark.parametrize("module,args,marker", [
    ("lab.evaluate", ["--task", "imdb", "--model", "tiny", "--max_new_tokens", "400"], "prompt/s"),
    ("lab.experiments", ["--task", "imdb", "--preset", "tiny", "--methods", "ppo", "--seeds", "0",
                              "--steps", "50", "--no_eval"], "start"),
])
def test_ctrl_c_exits_130_with_one_line(tmp_path, module, args, marker):
    args = args + (["--out", str(tmp_path / "exp")] if module.endswith("experiments") else
                   ["--json", str(tmp_path / "e.json")])
    # a suite started in the background by a non-interactive shell runs with SIGINT ignored, which children
    # inherit, and Python then installs no KeyboardInterrupt handler: give the command a terminal's default
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    chunks, reader = _output_until(proc, marker, timeout=300)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=600)
    reader.join(timeout=60)  # the last of the output
    err = "".join(chunks)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted" in err.strip().splitlines()[-1]


def test_report_ctrl_c_exits_130(tmp_path, monkeypatch, capsys):
    from lab import report

    def interrupted(path):
        raise KeyboardInterrupt
    monkeypatch.setattr(report, "build_report", interrupted)
    with pytest.raises(SystemExit) as e:
        report.main([str(tmp_path)])
    assert e.value.code == 130 and "interrupted" in capsys.readouterr().err


def test_evaluate_help_says_what_its_docstring_says():
    """lab.evaluation_plan keeps lab.evaluate's first paragraph for --help without importing the model stack; the two
    copies stay one text."""
    import lab.evaluate
    from lab.evaluation_plan import DESCRIPTION, build_parser

    assert DESCRIPTION == lab.evaluate.__doc__.split("\n\n")[0]
    assert " ".join(DESCRIPTION.split()) in " ".join(build_parser().format_help().split())
