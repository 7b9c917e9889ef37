"""Single-agent PPO on small arithmetic problems (reasoning-gym sums and products in GSM8K's one-shot form), rewarded
1 for a correct final number: the paper's objective-reward regime at a size a 135M model can solve. NOT GSM8K.

    python arithmetic_train/ppo.py --config configs/arithmetic/ppo_cpu.yaml      # embedded SmolLM2, CPU
    python arithmetic_train/ppo.py --config configs/arithmetic/ppo_cpu.yaml --dataset sums_3x1   # harder problems

Every PPO hyperparameter is GSM8K's (gsm8k_train/ppo.py, the paper's Table 2); this file states what the task changes.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python puts this script's folder first on sys.path: put the repository root there instead (`cory`,
# `gsm8k_train.ppo` import by name, and a script folder never shadows the package).
_HERE = Path(__file__).resolve().parent
sys.path = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

from cory.cli import main  # noqa: E402
from gsm8k_train import ppo as gsm8k  # noqa: E402


@dataclass
class Hyperparameters(gsm8k.Hyperparameters):
    # ---- the task: "Question: What is 4 - 9?\nAnswer:" after one worked example; the setting picks the difficulty
    task: str = "arithmetic"
    dataset: str = "auto"                  # a setting of cory.tasks.arithmetic (auto: the pilot's choice)
    # ---- no paper model for it: the embedded SmolLM2-135M, every weight trained (the held-out KL needs it)
    model_name: str = "embedded:smollm2-135m"
    load_in_4bit: bool = False
    use_peft: bool = False
    output_dir: str = "runs/arithmetic_ppo"
    # ---- answers are one line ("4 - 9 = -5. The answer is -5."): 20 tokens hold it, EOS or "Question:" end it
    response_length_min: int = 20
    response_length_max: int = 20
    eval_every: int = 3                    # held-out accuracy (sampled and greedy), KL and distinct-n to eval.jsonl


if __name__ == "__main__":
    main(Hyperparameters)
