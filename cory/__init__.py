"""CORY: sequential cooperative two-agent PPO fine-tuning of LLMs (Ma et al., NeurIPS 2024, arXiv 2410.06101).

Reading order, one CORY iteration in five files:

1. ``game``: the paper's game (roles, the collective reward, the swap, the PPO and CORY iterations);
2. ``ppo``: one agent's PPO update, top to bottom (rewards, advantages, clipped losses, η's update);
3. ``agent``: an agent, one PPOTrainer with its optimizer and KL controller;
4. ``rollout``: prompts to sampled answers to rewards;
5. ``train``: the loop that plays ``game.ITERATIONS[method]`` once per batch.

Then, as needed: ``config`` (every field, checked), ``tasks/`` (the tasks and their registry), ``heldout`` (the
held-out evaluation). A researcher may skip ``run/`` (the run folder's guard: what may start, resume or be
overwritten, checkpoints, final models), the machine (``device/``: precision, memory, the GPU pass budget, the
patches) and the speed-ups and plumbing beneath (``passes``, ``packing``, ``generation``, ``parallel``, ``assets``). The package map, its levels and how a config travels: docs/developers.md.
"""

__version__ = "0.1.0"
