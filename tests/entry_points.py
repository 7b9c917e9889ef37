"""The lab's commands as a user runs them (a fresh process each, from the repository root), and what a test checks
of their answer: the exit status, one line on stderr, and a folder's files unchanged."""
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def lab(module: str, *args, cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m lab.<module> ARGS``."""
    return subprocess.run([sys.executable, "-m", f"lab.{module}", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def tree(folder: Path) -> dict:
    """Every file and folder under ``folder`` (hidden ones too) with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def refused(p: subprocess.CompletedProcess, *named: str, status: int = 2) -> str:
    """``p`` exited with ``status`` and one line on stderr ("error: ..."), naming each of ``named``; the line."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == status and len(lines) == 1 and lines[0].startswith("error: "), \
        (p.returncode, p.stderr[-2000:])
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def succeeded(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    return p
