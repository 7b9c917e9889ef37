"""Which method a run plays, known in one place: the single-agent PPO baseline or CORY's two agents.

A training script's config class says its method (``PPOArgs.method``, ``CoryArgs.method``); everything that
differs between the methods is read from the ``Method`` here: the agents' names (which also name their
checkpoint files and final models), the iteration the run loop plays (named in ``cory.game``), and whether a second
agent's prompt holds the first agent's answer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str                 # "ppo" | "cory": the scripts' names (<task>_train/<name>.py) and the run manifests'
    agents: tuple[str, ...]   # the trained models, in the order they act (CORY: LLM1 starts as the pioneer)
    has_observer: bool        # a second agent answers after the first (CORY's observer)
    iteration: str            # its iteration in ``cory.game``, ``(step, batch, agents, rollout, cfg) -> (row, samples)``,
    # by name: the game loads torch and imports this module, and a method is known (checks, --help) long before

    def observer_reads_pioneer(self, cfg) -> bool:
        """Whether a prompt holds another agent's answer: CORY's knowledge transfer, unless its ablation is on."""
        return self.has_observer and bool(getattr(cfg, "knowledge_transfer", False))



PPO = Method("ppo", ("policy",), has_observer=False, iteration="ppo_iteration")
CORY = Method("cory", ("llm1", "llm2"), has_observer=True, iteration="cory_iteration")
METHODS = {m.name: m for m in (PPO, CORY)}
AGENT_NAMES = tuple(a for m in METHODS.values() for a in m.agents)  # every agent name a run folder may hold


def method_of(cfg) -> Method:
    """The method of a config or config class (its ``method`` attribute)."""
    return METHODS[cfg.method]
