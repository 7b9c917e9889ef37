"""CORY: sequential cooperative two-agent PPO fine-tuning of LLMs (Ma et al., NeurIPS 2024, arXiv 2410.06101).

The method is two files: ``game`` (the paper's game: roles, collective reward, the PPO and CORY iterations) and
``ppo`` (one agent's PPO update, top to bottom). The package map, its levels (imports run one way, down them) and how
a config travels: docs/developers.md.
"""

__version__ = "0.1.0"
