"""Single-agent PPO on IMDB: make GPT-2 continue movie-review openings positively.

    python imdb_train/ppo.py                                   # the paper's setting (GPU)
    python imdb_train/ppo.py --config configs/imdb/ppo_cpu.yaml   # embedded SmolLM2 + VADER, CPU
    python imdb_train/ppo.py --help                             # every field; --field value overrides
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python searches a script's own folder first, and this folder holds a script named cory.py that would
# shadow the installed `cory` package: look for imports past it.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from cory.cli import main  # noqa: E402
from cory.config import PPOArgs  # noqa: E402


@dataclass
class Hyperparameters(PPOArgs):
    # the paper's Table 1 (trl defaults) and model
    task: str = "imdb"
    model_name: str = "gpt2-large"
    reward_model: str = "distilbert-imdb"  # raw POSITIVE logit of lvwerra/distilbert-imdb; "vader" offline
    dataset: str = "auto"                  # stanfordnlp/imdb when reachable, else built-in openings
    output_dir: str = "runs/imdb_ppo"
    seed: int = 0
    steps: int = 100
    learning_rate: float = 1.41e-5
    batch_size: int = 256
    mini_batch_size: int = 256
    gradient_accumulation_steps: int = 1
    ppo_epochs: int = 4
    init_kl_coef: float = 0.3
    adap_kl_ctrl: bool = True
    target: float = 6.0
    horizon: float = 10000.0
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_penalty: str = "full"               # full-vocabulary KL(pi || pi0) per token
    response_length_min: int = 4           # one length per batch, uniform in [min, max]
    response_length_max: int = 15
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.1
    score_norm: bool = False

    # speed: TF32 matmuls on a GPU (2.3x faster than fp32 for PPO at the paper's IMDB shapes); fp32 for exact runs
    precision: str = "tf32"                # fp32 | tf32 | bf16


if __name__ == "__main__":
    main(Hyperparameters, method="ppo")
