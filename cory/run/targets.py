"""The files a command writes whole where the user names them or beside the user's files (an evaluation's or a
benchmark's ``--json``, the report's REPORT.md and figures): a temporary file of its own beside the target,
renamed over it once complete, so that a full disk or a stop leaves the file before, never a cut one.

A rename replaces whatever has the name: a named pipe, a socket, a device (run as root, ``--json /dev/null``
replaced the machine's /dev/null), or the link ``/dev/stdout``. So a target that exists and is not a regular file
(or is a symbolic link, whose target would stay stale) is refused in one line before any work (``check_target``,
from each command's checks) and again at the rename
(``write_whole``), which is then the only way these files are written. The other checks of a path to be
written, made before any work: its name is text (``check_text_path``), its folder can be written in
(``check_writable``), and a file there is one the command wrote, not a user's (``check_output_file``).

And the other way, for reading: opening a named pipe waits for a writer, so a pipe where a command expects a log or
a metrics file hangs it. A file a command reads that it did not write is opened only when it is a regular file
(``open_regular``: without waiting, then checked on what was opened), and a folder read whole (a lab command's
experiment folder) is first searched for special files (``special_file_refusal``), refused in one line naming one.
Torch-free, and below every other module.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import signal
import stat
import threading
from pathlib import Path
from typing import Callable

from cory.errors import ConfigError, text_refusal

# the system's own files: /dev/stdout is a link to a pipe, a terminal or the file the shell redirected to, and
# renaming onto it would replace the link in /dev, never write into the output
_SYSTEM = (Path("/dev"), Path("/proc"))
# write_whole's temporary file for the target <name>: .<name>.<pid>-<8 hex>.tmp
TEMPORARY = re.compile(r"\.(?P<name>.+)\.\d+-[0-9a-f]{8}\.tmp")
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file a rename may replace; None when it is one or is not there."""
    try:
        mode = os.stat(path).st_mode  # through a link: a link to a pipe is as much a pipe
    except (OSError, ValueError):
        return None  # not there (or unreadable: the writability check says so)
    for test, kind in _KINDS:
        if test(mode):
            return kind
    if not stat.S_ISREG(mode):
        return "a special file"
    for where in (path.absolute(), Path(os.path.realpath(path))):
        root = next((r for r in _SYSTEM if r in where.parents), None)
        if root is not None:
            return f"a system file (under {root})"
    return None


def target_refusal(path: str | os.PathLike, name: str) -> str | None:
    """Why ``path`` may not be replaced by a file written whole (one line naming ``name``, the flag or file to
    blame, and what is allowed), or None when it may: it is not there, or it is a regular file and not a symbolic
    link (a link to a pipe or a device is judged by its target; a link to a file is refused as a link, since the
    rename would replace the link and leave its target stale). The one check of every output target: each
    command's ``--json`` (``check_output_file``, ``cory.run.run_rules.check_output_json``) and the lab's documents and
    figures (``lab.figures.check_targets``)."""
    path = Path(path)
    kind = _kind(path)
    if kind is None and path.is_symlink():  # a link to a regular file, or to nothing: the rename would replace it
        return (f"{name} {path} is a symbolic link; give the file itself (the file would replace the link, and what "
                "it points to would stay as it was)")
    if kind is None:
        return None
    if kind == "a folder":
        return f"{name}: {path} is a folder; give a file name, e.g. {path / 'results.json'}"
    return (f"{name}: {path} exists and is {kind}, not a regular file; it would be replaced, not written into, so it "
            "is refused: give the name of a new file or of a regular file (the results are printed anyway)")


def check_target(path: str | os.PathLike, name: str) -> None:
    """``target_refusal`` as a ConfigError, for the checks a command makes before any work."""
    refusal = target_refusal(path, name)
    if refusal:
        raise ConfigError(refusal)


def check_text_path(path, name: str = "output_dir") -> None:
    """A path a run writes into its files (config.yaml, the manifest, runs.json) must be text
    (``text_refusal``): refused at the start, in one line, not after the run has trained."""
    refusal = text_refusal(path, name)
    if refusal:
        raise ConfigError(refusal)


def check_writable(path: Path, name: str = "output_dir") -> None:
    """``path`` (a file or folder to be written, created with its parents if need be) can be written: its
    nearest existing ancestor is a folder we may write in. ``name`` is the field or flag to blame."""
    check_text_path(path, name)
    path = Path(path).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if existing == path:  # already there: a file is replaced within its folder, a folder is written into
        folder = path if path.is_dir() else path.parent
    elif not existing.is_dir():
        raise ConfigError(f"{name}: {path} would be inside {existing}, which is a file, not a folder")
    else:
        folder = existing
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}: cannot write in {folder} (permission denied); choose another place")


def written_by(path: Path, program: str, key: str = "command") -> bool:
    """Whether ``path`` holds a JSON document that ``program`` wrote (its ``key``, "command", starts with
    ``program``)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get(key, "")).startswith(program)


def check_output_file(path: Path, name: str, program: str, force: bool = False, key: str = "command") -> None:
    """An output file flag (``--json``): a file already there that ``program`` did not write (a user's file) is
    refused in one line unless ``force``; then ``check_writable``. Before any work, so that nothing is lost.
    ``key``: the field of the JSON document that records the command which wrote it (``written_by``)."""
    path = Path(path)
    check_target(path, name)  # a pipe or a device would be replaced by the file, not written into
    if path.is_file() and not force and not written_by(path, program, key):
        raise ConfigError(f"{name}: {path} already exists and was not written by {program}; choose another file, or "
                          "pass --force to replace it")
    check_writable(path, name)


def write_whole(path: str | os.PathLike, content: str | Callable[[Path], None], name: str | None = None) -> None:
    """``content`` (text, written as UTF-8; or ``content(tmp)``, which fills the file ``tmp``) into ``path`` whole:
    into a temporary file beside it, of this call's own (two commands writing one folder at once never share
    one), renamed over ``path`` once complete, if ``path`` is still not there or a regular file (else a
    ConfigError naming ``name``, default the path). The temporary file is gone however the call ends, a
    KeyboardInterrupt included."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")  # TEMPORARY
    try:
        if isinstance(content, str):
            with open(tmp, "x", encoding="utf-8") as f:
                f.write(content)
        else:
            content(tmp)
        check_target(path, name or str(path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def stopped_as_interrupt():
    """Within it, SIGTERM and SIGHUP stop the main thread as Ctrl-C does (a KeyboardInterrupt), so that
    ``write_whole``'s temporary file is removed: by default they end the process where it stands, leaving it."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class NotRegularFile(OSError):
    """``open_regular``'s refusal: the path is there and is not a regular file (its ``strerror`` says what it is)."""


def open_regular(path: str | os.PathLike, mode: str = "r", **kwargs):
    """``open(path, mode, **kwargs)`` for reading (``mode`` "r" or "rb"), only when ``path`` is a regular file (through
    links): opened without blocking (``O_NONBLOCK``: a named pipe's open would wait for a writer), then checked on
    the open descriptor, so nothing can swap it in between; else NotRegularFile, an OSError, so that a reader which
    skips what it cannot read skips it too."""
    if mode not in ("r", "rb"):
        raise ValueError(f"open_regular reads: mode {mode!r}")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "a special file")
            raise NotRegularFile(errno.EINVAL, f"{kind}, not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return open(fd, mode, closefd=True, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is a named pipe, a socket or a device, through a link (a link to nothing: None)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def special_file_refusal(folder: str | os.PathLike) -> str | None:
    """The one line refusing ``folder`` when a file in it, at any depth, is a named pipe, a socket or a device (a
    link to one included; links to folders are not followed), which a command reading the folder would wait on or
    misread: it names the first such file and what to do; None when there is none. Nothing is opened."""
    for top, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            kind = special_kind(os.path.join(top, name))
            if kind is not None:
                path = Path(top) / name
                return (f"{path}: {kind}, not a regular file; a lab command reads only regular files (a pipe would "
                        f"keep it waiting): move it out of {folder}")
    return None
