"""The test sessions' own disk use: a passed test's ``tmp_path`` is deleted when the test ends (pyproject.toml's
``tmp_path_retention_policy``). The slow set trains real models that save checkpoints; kept until the session ends,
they filled CI's disk. A failed test keeps its folder for the person reading the failure."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
def test_passes(tmp_path):
    (tmp_path / "checkpoint.bin").write_bytes(b"x" * 1024)
    (tmp_path.parent.parent / "passed_at").write_text(str(tmp_path))

def test_fails(tmp_path):
    (tmp_path / "checkpoint.bin").write_bytes(b"x" * 1024)
    (tmp_path.parent.parent / "failed_at").write_text(str(tmp_path))
    assert False
'''


def test_a_passed_tests_folder_is_deleted_and_a_failed_ones_kept(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    base = tmp_path / "base" / "temp"
    base.parent.mkdir()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), f"--basetemp={base}",
                          str(tmp_path / "test_inner.py")], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    passed = Path((tmp_path / "base" / "passed_at").read_text())
    failed = Path((tmp_path / "base" / "failed_at").read_text())
    assert not passed.exists()
    assert (failed / "checkpoint.bin").is_file()
