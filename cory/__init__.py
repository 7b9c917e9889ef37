"""CORY: sequential cooperative two-agent PPO fine-tuning of LLMs (Ma et al., NeurIPS 2024)."""

__version__ = "0.1.0"
