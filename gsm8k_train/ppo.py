"""Single-agent PPO on GSM8K: Llama-2-7b-chat (4-bit, LoRA) rewarded 1 for a correct final answer.

    python gsm8k_train/ppo.py                                        # the paper's setting (GPU)
    python gsm8k_train/ppo.py --config configs/gsm8k/ppo_cpu.yaml      # embedded SmolLM2 + LoRA, CPU
    python gsm8k_train/ppo.py --dataset_path ../gsm8k                # GSM8K from train.jsonl/test.jsonl
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python puts this script's folder first on sys.path, and the folder holds a script named cory.py that would
# shadow the `cory` package: put the repository root there instead (`cory`, `gsm8k_train.ppo` import by name).
_HERE = Path(__file__).resolve().parent
sys.path = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

from cory.cli import main  # noqa: E402
from cory.config import PPOArgs  # noqa: E402


@dataclass
class Hyperparameters(PPOArgs):
    # the paper's model and reward (arXiv 2410.06101, Table 2)
    task: str = "gsm8k"
    model_name: str = "meta-llama/Llama-2-7b-chat-hf"
    load_in_4bit: bool = True              # bitsandbytes, CUDA only
    use_peft: bool = True                  # LoRA adapters (bias none) on the 4-bit base
    lora_r: int = 16
    lora_alpha: int = 16
    reward_model: str = "correctness"      # 1 if the final number equals the reference answer, else 0
    output_dir: str = "runs/gsm8k_ppo"
    steps: int = 100
    # the paper's Table 2
    learning_rate: float = 1e-5
    batch_size: int = 32
    mini_batch_size: int = 2
    gradient_accumulation_steps: int = 16
    ppo_epochs: int = 4
    init_kl_coef: float = 0.01             # eta
    adap_kl_ctrl: bool = True
    target: float = 6.0                    # not in Table 2: trl's defaults, as for IMDB
    horizon: float = 10000.0
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_penalty: str = "full"
    # answers end at EOS or at a new "Question:" the model starts, else at 256 tokens
    response_length_min: int = 256
    response_length_max: int = 256
    allow_early_eos: bool = True


if __name__ == "__main__":
    main(Hyperparameters)
