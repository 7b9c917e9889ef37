"""The project's errors, in one place. Each message is one line a user can act on; the entry points print it as
``error: ...`` and exit with status 2 (a mistake in what was asked) or 1 (a run that cannot go on).

This module imports nothing: every layer can raise these, and the modules that raise one also export it
(``from cory.config import ConfigError`` still works).
"""


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


class EvalError(ValueError):
    """A user mistake on ``cory.lab.evaluate``'s command line; the message is one line."""


class ExperimentError(Exception):
    """A user mistake in the experiment runner's arguments; the message is one line."""


class ReportError(Exception):
    """The folder is not an experiment folder; the message is one line."""
