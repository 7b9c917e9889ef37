"""`make clean` removes what the Makefile made (the venv, the tools' caches) and never runs/, where the training
scripts write users' runs by default (hardening round 5)."""
import shutil
import subprocess

import pytest

from conftest import REPO


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_clean_leaves_users_runs_alone():
    p = subprocess.run(["make", "-n", "clean"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    removed = " ".join(p.stdout.split()).split("rm -rf", 1)[1].split()
    assert ".venv" in removed and "runs" not in removed and not any(r.startswith(("runs/", "results")) for r in removed)
