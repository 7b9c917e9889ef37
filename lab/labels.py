"""The names a report, a summary and a figure give what ran, and the number formats they share: the methods, the
agents, the learner where it is not GAE ("GRPO, K = 4"), 3 significant digits. ``lab.results`` builds a run
group's name from these (``Group.name``: "PPO (GRPO, K = 4)", "CORY-LLM1 (RLOO, K = 4, η=0.01)") and re-exports
them."""
from __future__ import annotations

import math

from cory.method import CORY, PPO

POLICY = PPO.agents[0]
LLM1, LLM2 = CORY.agents
AGENT_NAMES = {POLICY: "", LLM1: "-LLM1", LLM2: "-LLM2"}
METHOD_NAMES = {
    "ppo": "PPO",
    "cory": "CORY",
    "cory_no_kt": "CORY w/o knowledge transfer",
    "cory_no_swap": "CORY w/o role exchange",
    "ppo_2x": "PPO, 2x model",
    "ppo_norm": "PPO with score normalisation",
    "cory_authors": "CORY with the authors' resets",
    "cory_norm": "CORY with score normalisation",
}
# the advantage estimators (cory.config's advantage_estimator) as a report names them
LEARNER_NAMES = {"gae": "GAE", "rloo": "RLOO", "grpo": "GRPO"}
VARIES = "varies by seed"  # what Group.config_value gives for a field the seeds disagree on


def learner_name(estimator, k) -> str | None:
    """The learner as a name gives it, "GRPO, K = 4"; None for GAE with one answer per prompt, the default and
    every run from before the switch (no such fields): a GAE report reads as it always has."""
    estimator = "gae" if estimator is None else estimator
    k = 1 if k is None else k
    if estimator == VARIES or k == VARIES:
        return "learner varies by seed"
    if estimator == "gae" and k == 1:
        return None
    return f"{LEARNER_NAMES.get(str(estimator), str(estimator))}, K = {k}"


def fmt(x: float, digits: int = 3) -> str:
    """A number in the report: 3 significant digits, "n/a" for None or not finite."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"

