"""An experiment folder's design, fixed before its runs: ``design.yaml`` beside its DESIGN.md, read by the report.

``endpoint`` names the primary test: ``reward_at_matched_kl`` (``lab.matched_kl``: CORY's held-out reward
against PPO's at the same held-out KL) or ``collapse`` (``lab.collapse``: do the final models' answers
degenerate?). A folder without the file, such as a user's own experiment, gets ``Design()``'s values and the report
says it used them.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab.errors import ReportError

DESIGN_FILE = "design.yaml"
# in runs.json: the sha256 of design.yaml when the runner first ran in the folder (None: there was none), so that a
# design edited after the runs started (a margin moved to change a verdict) is named wherever the design is
DESIGN_DIGEST = "design_sha256"
ENDPOINTS = ("reward_at_matched_kl", "collapse")
DEFAULTS = "the report's defaults"
# where the matched-KL reading asks "did PPO learn?": its final models, or its held-out path at the KL grid (a run
# that learned and then collapsed past the grid, as PPO did at the paper's batch on a GPU, learned what is compared)
LEARNED_AT = ("final", "kl_grid")
# which CORY agents the matched-KL claim tests: those shown to learn (an agent that did not is left out of the tests
# and of the folder's answer), or every agent whether it learned or not (its learning shown beside; Holm is then over
# both agents always, and the folder reads "no" only if every agent's answer is "no")
AGENTS_TESTED = ("learned", "all")


@dataclass(frozen=True)
class Design:
    endpoint: str = "reward_at_matched_kl"
    # KL 2-6 nats is where a CPU run's held-out path spends its first tens of iterations
    kl_grid: tuple[float, ...] = (2.0, 4.0, 6.0)
    # held-out reward units: 2.5% of VADER's [-1, 1], about 1.5 times one 110-prompt evaluation's sampling error
    margin: float = 0.05
    alpha: float = 0.05     # one-sided, Holm over the CORY agents
    min_seeds: int = 3
    # a final model has collapsed when its held-out distinct-2 is under this share of the base model's
    collapse_share: float = 0.5
    learned_at: str = "final"
    agents_tested: str = "learned"
    # independent sampled draws of the base model's held-out reward the learning checks read (their mean, and its
    # error): the runner's evaluation, and base_draws/*.json beside it for the rest (lab.evaluate --seed S)
    base_draws: int = 1
    source: str = DEFAULTS

    def text(self) -> str:
        grid = ", ".join(f"{k:g}" for k in self.kl_grid)
        learned = "; learning read along the path at the KL grid" if self.learned_at == "kl_grid" else ""
        tested = "; every CORY agent tested, learned or not" if self.agents_tested == "all" else ""
        draws = f"; the base model's reward from {self.base_draws} sampled draws" if self.base_draws > 1 else ""
        return (f"KL grid {grid} nats, margin {self.margin:g} reward units, α = {self.alpha:g} one-sided with Holm "
                f"over the CORY agents, at least {self.min_seeds} paired seeds{learned}{tested}{draws} (from "
                f"{self.source})")


def design_digest(folder: str | Path) -> str | None:
    """sha256 of the folder's design.yaml; None when there is none."""
    try:
        return hashlib.sha256((Path(folder) / DESIGN_FILE).read_bytes()).hexdigest()
    except OSError:
        return None


def amendment(folder: str | Path) -> str | None:
    """How the folder's design.yaml differs from the one its first run started with (runs.json's record), in
    words; None when it is the same, or when nothing was recorded (a folder the runner wrote before it did)."""
    try:
        recorded = json.loads((Path(folder) / "runs.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or DESIGN_DIGEST not in recorded:
        return None
    was, now = recorded[DESIGN_DIGEST], design_digest(folder)
    if was == now:
        return None
    if was is None:
        return f"{DESIGN_FILE} was written after the folder's first run started: an amendment, not a prior design"
    if now is None:
        return f"{DESIGN_FILE}, recorded when the folder's first run started, has since been removed"
    return (f"{DESIGN_FILE} was changed after the folder's first run started (sha256 {str(was)[:12]} then, "
            f"{now[:12]} now): an amendment, not the prior design")


def load_design(folder: str | Path) -> Design:
    """The folder's ``design.yaml``, checked (one line naming the file and the bad value); ``Design()`` without.
    Its ``source`` names an amendment since the first run (``amendment``)."""
    path = Path(folder) / DESIGN_FILE
    changed = amendment(folder)
    if not path.exists():
        return Design(source=f"{DEFAULTS}; {changed}") if changed else Design()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); save it as "
                          "UTF-8") from None
    except (OSError, yaml.YAMLError) as e:
        raise ReportError(f"{path}: cannot be read as YAML ({type(e).__name__}); fix or remove it") from None
    keys = ("endpoint", "kl_grid", "margin", "alpha", "min_seeds", "collapse_share", "learned_at", "agents_tested",
            "base_draws")
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: must be a mapping of {', '.join(keys)}")
    unknown = sorted(set(map(str, doc)) - set(keys))
    if unknown:
        raise ReportError(f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(keys)}")
    default = Design()
    endpoint = doc.get("endpoint", default.endpoint)
    if endpoint not in ENDPOINTS:
        raise ReportError(f"{path}: endpoint {endpoint!r} is not one of {', '.join(ENDPOINTS)}")
    learned_at = doc.get("learned_at", default.learned_at)
    if learned_at not in LEARNED_AT:
        raise ReportError(f"{path}: learned_at {learned_at!r} is not one of {', '.join(LEARNED_AT)}")
    agents_tested = doc.get("agents_tested", default.agents_tested)
    if agents_tested not in AGENTS_TESTED:
        raise ReportError(f"{path}: agents_tested {agents_tested!r} is not one of {', '.join(AGENTS_TESTED)}")

    def number(key, ok, allowed):
        v = doc.get(key, getattr(default, key))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            raise ReportError(f"{path}: {key} {v!r} is not allowed; {allowed}")
        return v

    grid = doc.get("kl_grid", list(default.kl_grid))
    if (not isinstance(grid, list) or not grid
            or any(isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0
                   for k in grid)):
        raise ReportError(f"{path}: kl_grid {grid!r} is not allowed; a non-empty list of KL values > 0 (nats)")
    draws = int(number("base_draws", lambda v: int(v) == v and v >= 1, "an integer >= 1"))
    if draws > 1 and learned_at != "kl_grid":
        raise ReportError(f"{path}: base_draws {draws} is read by the learning check along the path; it needs "
                          "learned_at: kl_grid")
    return Design(endpoint, tuple(sorted(float(k) for k in grid)),
                  float(number("margin", lambda v: v >= 0, "a number >= 0 (reward units)")),
                  float(number("alpha", lambda v: 0 < v < 1, "a number in (0, 1)")),
                  int(number("min_seeds", lambda v: int(v) == v and v >= 2, "an integer >= 2")),
                  float(number("collapse_share", lambda v: 0 < v <= 1, "a number in (0, 1]")),
                  learned_at, agents_tested, draws, f"{DESIGN_FILE}; {changed}" if changed else DESIGN_FILE)
