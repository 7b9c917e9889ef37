"""CORY: sequential cooperative two-agent PPO fine-tuning of LLMs (Ma et al., NeurIPS 2024, arXiv 2410.06101).

The package, from the top level down; imports run one way, down this list (the README has the same map):

    cli           the command line shared by the training scripts (imdb_train/, gsm8k_train/)
    lab/          the lab bench: the experiment runner, evaluation, reports (no training code imports it)
    train         a run: load, loop over the game's iterations, log, checkpoint, resume, stop cleanly
    preflight     every check before a model loads, made once
    game          the paper's game, top to bottom: roles, collective reward, the PPO and CORY iterations
    agent         one trainable LLM: a trl PPOTrainer with its optimizer, KL controller, score normaliser
    rollout       prompts -> sampled answers -> task rewards
    models        policies, the shared frozen reference, tokenizers, from a resolved ModelSpec
    tasks/        each task's prompts, data, reward, prompt budget, stop string and evaluation (register_task)
    outputs       the run folder: config, metrics, samples, checkpoints
    config        the fields: documented and checked; their paper values live in the scripts
    assets        model specs (ModelSpec) and the offline models
    errors        the project's errors
    speedups/     optional speed and memory tricks behind the game (fast_ppo)
    parallel      accelerate's collectives for data-parallel runs
    memory        peak memory
"""

__version__ = "0.1.0"
