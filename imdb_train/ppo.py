"""Single-agent PPO on IMDB: make GPT-2 continue movie-review openings positively.

    python imdb_train/ppo.py                                   # the paper's setting (GPU)
    python imdb_train/ppo.py --config configs/imdb/ppo_cpu.yaml   # embedded SmolLM2 + VADER, CPU
    python imdb_train/ppo.py --help                             # every field; --field value overrides
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python puts this script's folder first on sys.path, and the folder holds a script named cory.py that would
# shadow the `cory` package: put the repository root there instead (`cory`, `imdb_train.ppo` import by name).
_HERE = Path(__file__).resolve().parent
sys.path = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

from cory.cli import main  # noqa: E402
from cory.config import PPOArgs  # noqa: E402


@dataclass
class Hyperparameters(PPOArgs):
    # ---- the paper's model and reward (arXiv 2410.06101, Section 5.1)
    task: str = "imdb"                     # prompts: the first 2-7 tokens of an IMDB review; reward and data
    model_name: str = "gpt2-large"         # policy and frozen reference pi0 (the authors' own ppo.py loads gpt2-medium)
    reward_model: str = "distilbert-imdb"  # raw POSITIVE logit of lvwerra/distilbert-imdb; "vader" offline
    output_dir: str = "runs/imdb_ppo"      # the run's folder: config, metrics, samples, checkpoints, final model
    steps: int = 100                       # PPO iterations, one batch each
    # ---- PPO: the paper's Table 1 (trl's PPOConfig defaults)
    learning_rate: float = 1.41e-5         # trl's default, which Table 1 keeps
    batch_size: int = 256                  # review openings per iteration
    mini_batch_size: int = 256             # the whole batch: one optimizer step per epoch
    ppo_epochs: int = 4
    init_kl_coef: float = 0.3              # eta, the KL penalty's starting coefficient (the authors' cory.py: 0.4)
    adap_kl_ctrl: bool = True              # eta moves towards a KL of 6 nats per answer, slowly (horizon 10,000)
    target: float = 6.0
    horizon: float = 10000.0
    gamma: float = 1.0                     # the score comes once, at the answer's last token: no discount
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1                   # the value head shares the policy's body: its loss is kept small
    kl_penalty: str = "full"               # per-token KL estimate: the full-vocabulary KL(pi || pi0)
    # ---- answers: one length per batch, uniform in [4, 15] (trl's LengthSampler(4, 16)), sampled as drawn: GPT-2
    # practically never ends so short an answer with EOS
    response_length_min: int = 4
    response_length_max: int = 15
    allow_early_eos: bool = False          # EOS masked until the drawn length
    repetition_penalty: float = 1.1        # the authors' generation (Harry67Hu/CORY imdb_train/ppo.py); 1 = off


if __name__ == "__main__":
    main(Hyperparameters)
