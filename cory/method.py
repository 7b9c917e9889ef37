"""Which method a run plays, known in one place: the single-agent PPO baseline or CORY's two agents.

A training script's config class says its method (``PPOArgs.method``, ``CoryArgs.method``); everything that
differs between the methods is read from the ``Method`` here: the agents' names (which also name their
checkpoint files and final models) and whether a second agent's prompt holds the first agent's answer. The
iteration each method plays is ``cory.game.ITERATIONS[method.name]`` (the game loads torch; a method is known to the
config checks and ``--help`` long before).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str                 # "ppo" | "cory": the scripts' names (<task>_train/<name>.py) and the run manifests'
    agents: tuple[str, ...]   # the trained models, in the order they act (CORY: LLM1 starts as the pioneer)
    has_observer: bool        # a second agent answers after the first (CORY's observer)

    def observer_reads_pioneer(self, cfg) -> bool:
        """Whether a prompt holds another agent's answer: CORY's knowledge transfer, unless its ablation is on."""
        return self.has_observer and bool(getattr(cfg, "knowledge_transfer", False))


PPO = Method("ppo", ("policy",), has_observer=False)
CORY = Method("cory", ("llm1", "llm2"), has_observer=True)
METHODS = {m.name: m for m in (PPO, CORY)}
AGENT_NAMES = tuple(a for m in METHODS.values() for a in m.agents)  # every agent name a run folder may hold


def method_of(cfg) -> Method:
    """The method of a config or config class (its ``method`` attribute)."""
    return METHODS[cfg.method]
