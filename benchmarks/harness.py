"""What every benchmark does as a user program (issue 48): its ``--json`` is checked before any work and written
whole, a child process's one-line error comes back as that line, and a signal (Ctrl-C, SIGTERM, SIGHUP) stops what
the benchmark started and removes its temporary folder before it exits with the shell's 128 + the signal's number.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cory.errors import ConfigError, Stopped, file_fault  # noqa: E402  (light: no torch)
from cory.device.memory import cpu_info  # noqa: E402,F401  (the benchmarks' own: beside every timing)
from cory.run.run_rules import check_output_json  # noqa: E402
from cory.run.targets import write_whole  # noqa: E402
from lab.runs import git_state  # noqa: E402  (one reading of the commit, the runner's)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class UsageError(ValueError):
    """A flag the benchmark cannot take: its one line, said before any work (exit 2)."""


def add_json_flags(p: argparse.ArgumentParser, what: str = "also write the results here") -> None:
    """``--json PATH`` (``what``) and ``--force``, as every benchmark takes them; check them with
    ``check_json_flags``."""
    p.add_argument("--json", default=None, help=f"{what} (a file this benchmark did not write is refused unless "
                   "--force)")
    p.add_argument("--force", action="store_true", help="replace the --json file even if this benchmark did not "
                   "write it")


def check_json_flags(args: argparse.Namespace, program: str, key: str = "command", force: bool = False) -> None:
    """``UsageError`` with ``json_refusal``'s line when ``args.json`` is given and cannot be written (a file another
    program wrote is replaced only with ``--force``, or ``force``: the caller knows the file for one of its own)."""
    if args.json is not None:
        refusal = json_refusal(args.json, program, args.force or force, key)
        if refusal:
            raise UsageError(refusal)


def json_refusal(path: str | os.PathLike, program: str, force: bool, key: str = "command") -> str | None:
    """Why ``--json PATH`` cannot be written (one line), checked before any work: a folder, a folder that does not
    exist, a path inside a run folder, a file ``program`` did not write (unless ``force``), or no permission.
    None when it can."""
    try:
        check_output_json(path, "--json", program, force, key)
    except ConfigError as e:
        return str(e)
    return None


def git_commit(tree: str | os.PathLike = REPO) -> str:
    """The short commit a timing was taken at, ``+dirty`` when tracked files differ from it, "?" without git."""
    commit, dirty = git_state(tree)
    return commit[:7] + ("+dirty" if dirty else "") if commit else "?"


def write_json(path: str | os.PathLike, doc) -> str | None:
    """``doc`` into ``path`` whole (``cory.run.targets.write_whole``), so an earlier file stays whole when the disk
    fills, and a target that is no regular file (a pipe, a device) is never replaced; the one-line reason when it
    cannot be written, else None."""
    try:
        write_whole(path, json.dumps(doc, indent=1) + "\n", "--json")
    except ConfigError as e:
        return str(e)
    except OSError as e:
        return file_fault(e, path)
    return None


def child_error(output: str) -> str | None:
    """A child's one-line refusal: its output's last line when that is an "error: ..." line and no traceback
    came before it, else None (a crash, whose lines say more than one)."""
    lines = [ln for ln in re.split(r"[\r\n]", output) if ln.strip()]
    if lines and lines[-1].startswith("error: ") and "Traceback (most recent call last)" not in output:
        return lines[-1]
    return None


class ChildError(Exception):
    """A child's one-line error (``message``, as ``child_error`` reads it), passed on as that line with its status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _stopped(signum: int) -> Stopped:
    return Stopped(f"stopped by {signal_name(signum)}", signum)


# the signal stopped_by_signals caught, if any, and whether ``running`` is starting a process (a signal then waits)
_caught: list[int] = []
_starting = False


@contextlib.contextmanager
def stopped_by_signals():
    """Within it, the first Ctrl-C, SIGTERM or SIGHUP raises ``Stopped`` in the main thread, so that the ``finally``
    blocks that stop the benchmark's children and remove its temporary folder run; later signals are ignored while
    they do (each wait there is bounded). Any error raised after the signal is taken for the stop: a library may
    have caught the ``Stopped`` and raised its own (torch.compile raises BackendCompilerFailed)."""
    _caught.clear()

    def handle(signum, frame):
        if _caught:
            return
        _caught.append(signum)
        if not _starting:  # else ``running`` raises it, once the process it starts can be stopped
            raise _stopped(signum)

    previous = {s: signal.signal(s, handle) for s in SIGNALS}
    try:
        yield
    except Stopped:
        raise
    except BaseException:
        if _caught:  # raised inside a library that wrapped the Stopped in its own error (torch.compile's workers do)
            raise _stopped(_caught[0]) from None
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def running(cmd: list[str], *, group: bool = False, grace: float = 30.0, **popen):
    """``subprocess.Popen(cmd, **popen)`` for the block, ended by ``stop`` (``group``, ``grace``) however the block
    ends. A stop signal that comes while the process starts is raised once it can be stopped: a ``Stopped`` raised
    inside Popen, between its fork and its return, would leave the child running with no one holding its pid."""
    global _starting
    _starting = True
    try:
        proc = subprocess.Popen(cmd, **popen)
    finally:
        _starting = False
    try:
        if _caught:
            raise _stopped(_caught[0])
        yield proc
    finally:
        stop(proc, group=group, grace=grace)


def stop(proc: subprocess.Popen, *, group: bool = False, grace: float = 30.0) -> None:
    """End ``proc`` (with ``group``: its whole process group, started with ``start_new_session``): SIGTERM, then
    SIGKILL after ``grace`` seconds (at once when ``grace`` is 0); returns once it has ended."""
    def send(sig):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, sig)
            elif proc.poll() is None:
                proc.send_signal(sig)

    if grace > 0 and proc.poll() is None:
        send(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    send(signal.SIGKILL)  # a group: what the leader left running too
    proc.wait()


@contextlib.contextmanager
def temporary_folder(prefix: str):
    """A folder of the benchmark's own under the system's temporary folder, removed when the block ends however
    it ends (a signal included, through ``stopped_by_signals``)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report_stop(e: Stopped, what: str) -> int:
    """The one line a benchmark stopped by a signal ends with (``what``: what it did about it); its exit status."""
    print(f"{e}: {what}", file=sys.stderr)
    return e.exit_status


def run_main(parse, measure, argv=None, stopped: str = "nothing written") -> int:
    """A benchmark's ``main``: ``parse(argv)`` (a ValueError: its one line, exit 2), then ``measure(args, argv)``
    under the stop signals (a stop: one line saying ``stopped``, what was done about it; the signal's status)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        with stopped_by_signals():
            return measure(args, argv)
    except Stopped as e:
        return report_stop(e, stopped)


def save_json(path: str | os.PathLike, doc) -> int:
    """``doc`` into ``path`` as ``write_json`` writes it; the exit status: 0, or 1 after the fault's one line."""
    fault = write_json(path, doc)
    if fault:
        print(f"error: {fault}", file=sys.stderr)
        return 1
    return 0
