"""CORY on IMDB: a pioneer and an observer (two copies of GPT-2) trained with PPO on their
collective sentiment reward, exchanging roles every few iterations.

    python imdb_train/cory.py                                     # the paper's setting (GPU)
    python imdb_train/cory.py --config configs/imdb/cory_cpu.yaml   # embedded SmolLM2 + VADER, CPU
    python imdb_train/cory.py --help                               # every field; --field value overrides

Every PPO hyperparameter is the baseline's (imdb_train/ppo.py); this file states what CORY adds or changes.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python puts this script's folder first on sys.path, and the folder holds this very file, cory.py, which would
# shadow the `cory` package: put the repository root there instead (`cory`, `imdb_train.ppo` import by name).
_HERE = Path(__file__).resolve().parent
sys.path = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

from cory.cli import main  # noqa: E402
from cory.config import CoryArgs  # noqa: E402
from imdb_train import ppo  # noqa: E402


@dataclass
class Hyperparameters(ppo.Hyperparameters, CoryArgs):
    # ---- CORY's own knobs (the paper: T_REx = 5, collective reward r1 + r2)
    swap_period: int = 5                   # T_REx, iterations between role exchanges; 0 = never (ablation)
    other_reward_coef: float = 1.0         # reward = own + coef * partner's; 0 independent, -1 competitive
    knowledge_transfer: bool = True        # the observer reads the pioneer's answer; False = only the query (ablation)
    # ---- the one change to PPO's settings: the authors' CORY run normalises its scores (use_score_scaling and
    # use_score_norm in Harry67Hu/CORY imdb_train/cory.py), their PPO run does not. An asymmetry: dividing by the sd
    # of r1 + r2 roughly doubles CORY's KL coefficient relative to its reward, so part of "lower KL" may be this
    # alone; the cpu preset turns it off for a like-for-like comparison (configs/imdb/cory_cpu.yaml)
    score_norm: bool = True                # (r1 + r2 - running mean) / running sd, as the authors' CORY run
    output_dir: str = "runs/imdb_cory"     # the run's folder: config, metrics, samples, checkpoints, final models


if __name__ == "__main__":
    main(Hyperparameters)
