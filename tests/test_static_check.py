"""The static check: mypy (pinned in requirements.txt, configured in pyproject.toml) over the whole tree fails on a
call with the wrong arguments and on a name or attribute that no longer exists, so code no test runs here (the GPU
tests, GPU-only paths, the benchmarks) cannot go stale unseen."""
import subprocess
import sys

from conftest import REPO


def _mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=900)


def test_the_tree_passes_the_static_check():
    p = _mypy()
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_the_check_fails_on_a_stale_call_and_a_vanished_name(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text("from cory.train import prepare_run\n"
                     "from cory.heldout import no_such_function\n"
                     "from cory.run import checkpoint\n\n\n"
                     "def use(cfg):\n"
                     "    prepare_run(cfg, 'cory')\n"
                     "    checkpoint.rng_state()\n"
                     "    return no_such_function\n")
    p = _mypy(str(stale))
    assert p.returncode == 1
    assert 'Too many arguments for "prepare_run"' in p.stdout
    assert 'Missing positional argument "length_rng" in call to "rng_state"' in p.stdout
    assert 'Module "cory.heldout" has no attribute "no_such_function"' in p.stdout
