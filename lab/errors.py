"""The lab commands' errors, and how a command ends on one. Each message is one line a user can act on; a command
prints it as ``error: ...`` and exits with status 2 (a mistake in what was asked) or 1 (what was asked cannot be
done). The errors a training run raises too (ConfigError, AssetError, RunError) and ``file_fault`` stay in
``cory.errors``.
"""
import argparse
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from cory.errors import file_fault


class EvalError(ValueError):
    """A user mistake on ``lab.evaluate``'s command line; the message is one line."""


class ExperimentError(Exception):
    """A user mistake in the experiment runner's arguments; the message is one line."""


class ReportError(Exception):
    """The folder is not an experiment folder; the message is one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse for the lab's commands (``lab.evaluate``, ``lab.experiments``, ...): a mistake raises the
    command's own one-line ``error`` with argparse's message, instead of printing argparse's usage block."""

    def __init__(self, error: type[Exception], **kwargs):
        super().__init__(**kwargs)
        self._error = error

    def error(self, message: str):
        raise self._error(message)


@contextmanager
def exit_on_error(mistakes: tuple[type[Exception], ...], *, failures: tuple[type[Exception], ...] = (),
                  files: Callable[[], object] | None = None, interrupted: str | None = None) -> Iterator[None]:
    """A lab command's end on an error, as one line on stderr: a user's mistake (``mistakes``) exits with status 2,
    a failure of what was asked (``failures``) with 1, a file-system fault (a full or read-only disk) with 1,
    naming the path (``files()``: where the command was writing, asked only then) and what to do; Ctrl-C with 130,
    saying ``interrupted`` (what was left written). A command that gives no ``files`` or ``interrupted`` lets
    those propagate as Python's own."""
    try:
        yield
    except mistakes as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except failures as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as e:
        if files is None:
            raise
        print(f"error: {file_fault(e, files())}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"interrupted: {interrupted}", file=sys.stderr)
        raise SystemExit(130) from None
