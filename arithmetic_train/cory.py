"""CORY on small arithmetic problems: pioneer and observer copies of the embedded SmolLM2-135M, each rewarded with
the sum of both agents' 0/1 correctness (so {0, 1, 2}); the observer reads the pioneer's answer as a "Reference:".
NOT GSM8K: the paper's objective-reward regime at a size a 135M model can solve.

    python arithmetic_train/cory.py --config configs/arithmetic/cory_cpu.yaml

Every PPO hyperparameter is the baseline's (arithmetic_train/ppo.py); this file states what CORY adds.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python puts this script's folder first on sys.path, and the folder holds this very file, cory.py, which would
# shadow the `cory` package: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

from arithmetic_train import ppo  # noqa: E402
from cory.cli import main  # noqa: E402
from cory.config import CoryArgs  # noqa: E402


@dataclass
class Hyperparameters(ppo.Hyperparameters, CoryArgs):
    # ---- CORY's own knobs (the paper: T_REx = 5, collective reward r1 + r2)
    swap_period: int = 5                   # T_REx, iterations between role exchanges; 0 = never (ablation)
    other_reward_coef: float = 1.0         # reward = own + coef * partner's; 0 independent, -1 competitive
    knowledge_transfer: bool = True        # the observer reads the pioneer's answer; False = only the question
    output_dir: str = "runs/arithmetic_cory"


if __name__ == "__main__":
    main(Hyperparameters)
