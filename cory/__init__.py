"""CORY: sequential cooperative two-agent PPO fine-tuning of LLMs (Ma et al., NeurIPS 2024, arXiv 2410.06101).

The package, from the top level down; imports run one way, down this list (the README has the same map):

    cli           the command line shared by the training scripts (imdb_train/, gsm8k_train/); exit codes
    lab/          the lab bench: the experiment runner, evaluation, reports, searches (no training code imports it)
    train         a run: load, loop over the game's iterations, log, checkpoint, resume, stop cleanly
    preflight     every check before a model loads, made once
    agent         one trainable LLM: a trl PPOTrainer with its optimizer, KL controller, score normaliser
    heldout       answers to held-out prompts: reward, KL to the base model, degeneration (eval_every, evaluate)
    game          the paper's game, top to bottom: roles, collective reward, the PPO and CORY iterations
    ppo           one agent's PPO update, top to bottom: rewards, GAE, clipped losses, statistics, η's update
    rollout       prompts -> sampled answers -> task rewards
    models        policies, the shared frozen reference, tokenizers, from a resolved ModelSpec
    tasks/        the task registry; each task's prompts, data, reward, prompt budget, stop string, evaluation
    outputs       the run folder: config, metrics, samples, evaluations, checkpoints
    final         the final models, written whole; which weights an evaluation scored (torch-free)
    config        the fields: documented and checked; their paper values live in the scripts
    method        which method a config plays: its agents, whether an observer reads the pioneer
    metrics       distinct-n and repeated tokens: a collapsing policy in numbers
    assets        model specs (ModelSpec) and the offline models
    errors        the project's errors, and the lab commands' one-line argparse
    passes        PPO's forward passes: the response window, the token budget (max_pass_tokens), the full KL
    packing       padding-free forward passes (every sequence of a pass in one row)
    patches       process-wide patches: glibc's allocator, accelerate's frozen models, CUDA's allocator
    parallel      accelerate's collectives for data-parallel runs
    memory        peak memory
"""

__version__ = "0.1.0"
