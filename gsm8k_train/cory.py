"""CORY on GSM8K: pioneer and observer copies of Llama-2-7b-chat (4-bit, LoRA), each rewarded with
the sum of both agents' 0/1 correctness (so {0, 1, 2}), exchanging roles every few iterations.

    python gsm8k_train/cory.py                                        # the paper's setting (GPU)
    python gsm8k_train/cory.py --config configs/gsm8k/cory_cpu.yaml      # embedded SmolLM2 + LoRA, CPU
    python gsm8k_train/cory.py --dataset_path ../gsm8k                # GSM8K from train.jsonl/test.jsonl

Every PPO hyperparameter is the baseline's (gsm8k_train/ppo.py); this file states what CORY adds or changes.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python puts this script's folder first on sys.path, and the folder holds this very file, cory.py, which would
# shadow the `cory` package: put the repository root there instead (`cory`, `gsm8k_train.ppo` import by name).
_HERE = Path(__file__).resolve().parent
sys.path = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

from cory.cli import main  # noqa: E402
from cory.config import CoryArgs  # noqa: E402
from gsm8k_train import ppo  # noqa: E402


@dataclass
class Hyperparameters(ppo.Hyperparameters, CoryArgs):
    # ---- CORY's own knobs (the paper: T_REx = 5, collective reward r1 + r2, so {0, 1, 2} on GSM8K)
    swap_period: int = 5                   # T_REx, iterations between role exchanges; 0 = never (ablation)
    other_reward_coef: float = 1.0         # reward = own + coef * partner's; 0 independent, -1 competitive
    knowledge_transfer: bool = True        # the observer reads the pioneer's answer; False = only the question
    # ---- the one change to PPO's settings: the paper's Table 2 trains CORY at 1e-4 (PPO: 1e-5)
    learning_rate: float = 1e-4
    output_dir: str = "runs/gsm8k_cory"    # the run's folder: config, metrics, samples, checkpoints, final models


if __name__ == "__main__":
    main(Hyperparameters)
