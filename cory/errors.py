"""The errors the package raises, in one place. Each message is one line a user can act on; the entry points print it
as ``error: ...`` and exit with status 2 (a mistake in what was asked) or 1 (a run that cannot go on).

Every layer can raise these and imports them from here (no other module re-exports them), and the one-line
messages every layer words alike: a file-system fault (``file_fault``), a path whose name is not text
(``text_refusal``). The lab commands' own errors are in ``lab.errors``.
"""
import errno
import os
import sys


class ConfigError(ValueError):
    """A user mistake in a config file or a flag; the message is one line."""


class AssetError(Exception):
    """A model, dataset or package is missing or unusable; the message is one line for users."""


class RunError(RuntimeError):
    """A training run cannot go on (non-finite reward or loss, a reward that raised); the message is one line."""


class NonFinite(Exception):
    """A reward or a PPO loss that is not a finite number; the run decides what to save and says so."""

    def __init__(self, step: int, agent: str, what: str, where: str = ""):
        super().__init__(f"step {step}: non-finite {what} for {agent}{f' ({where})' if where else ''}")
        self.what = what


class Stopped(Exception):
    """A run stopped by a signal (Ctrl-C, SIGTERM): the message says what was saved; ``exit_status`` is the
    shell's 128 + the signal's number (130 for Ctrl-C), which the entry points exit with."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_status = 128 + int(signum)


def file_fault(e: OSError, where) -> str:
    """One line for a file-system fault met while a command read or wrote ``where`` (a full or read-only disk, a
    folder without permission): the path (the error's own when it names one), the system's reason, what to do."""
    path = e.filename if e.filename is not None else where
    reason = e.strerror or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = "free space, then rerun"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = "make it writable or choose another place, then rerun"
    else:
        advice = "fix it, then rerun"
    return f"{path}: {reason}; {advice}"


def text_refusal(path: str | os.PathLike, name: str) -> str | None:
    """Why ``path`` cannot be written into a UTF-8 file (a config, a manifest, runs.json, a report), in one line
    naming ``name`` with advice that fits the locale; None when it can. Python reads a name whose bytes are not
    text in its encoding as surrogates, which no UTF-8 file holds: the command would fail (or crash) later."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError:
        pass
    encoding = sys.getfilesystemencoding()
    if encoding.lower().replace("-", "") == "utf8":  # the bytes themselves are not UTF-8: no setting helps
        return (f"{name}: {ascii(text)} is not UTF-8 text (its name holds bytes that are not UTF-8); rename it with "
                "UTF-8 or ASCII characters")
    return (f"{name}: {ascii(text)} is not text in this process's encoding ({encoding}: a C locale without UTF-8 "
            "mode); name it in ASCII, or run with PYTHONUTF8=1")
