"""CORY on GSM8K: pioneer and observer copies of Llama-2-7b-chat (4-bit, LoRA), each rewarded with
the sum of both agents' 0/1 correctness (so {0, 1, 2}), exchanging roles every few iterations.

    python gsm8k_train/cory.py                                        # the paper's setting (GPU)
    python gsm8k_train/cory.py --config configs/gsm8k/cory_cpu.yaml      # embedded SmolLM2 + LoRA, CPU
    python gsm8k_train/cory.py --dataset_path ../gsm8k                # GSM8K from train.jsonl/test.jsonl
"""
import sys
from dataclasses import dataclass
from pathlib import Path

# Python searches a script's own folder first, and this folder holds a script named cory.py that would
# shadow the installed `cory` package: look for imports past it.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from cory.cli import main  # noqa: E402
from cory.config import CoryArgs  # noqa: E402


@dataclass
class Hyperparameters(CoryArgs):
    # CORY: the method's own knobs (paper: T_REx = 5, collective reward r1 + r2)
    swap_period: int = 5                   # iterations between role exchanges; 0 = never (ablation)
    other_reward_coef: float = 1.0         # reward = own + coef * partner's; 0 independent, -1 competitive
    knowledge_transfer: bool = True        # False: the observer sees only the question (ablation)
    reset_on_swap: bool = False            # True: fresh optimizer/KL/score stats at each exchange (authors' code)
    # the paper's Table 2
    task: str = "gsm8k"
    model_name: str = "meta-llama/Llama-2-7b-chat-hf"
    load_in_4bit: bool = True              # bitsandbytes, CUDA only
    use_peft: bool = True                  # LoRA r 16, alpha 16, bias none
    lora_r: int = 16
    lora_alpha: int = 16
    reward_model: str = "correctness"      # 1 if the final number equals the reference answer, else 0
    dataset: str = "auto"                  # openai/gsm8k, or --dataset_path DIR, else generated stand-in
    output_dir: str = "runs/gsm8k_cory"
    seed: int = 0
    steps: int = 100
    learning_rate: float = 1e-4
    batch_size: int = 32
    mini_batch_size: int = 2
    gradient_accumulation_steps: int = 16
    ppo_epochs: int = 4
    init_kl_coef: float = 0.01
    adap_kl_ctrl: bool = True
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_penalty: str = "full"
    response_length_min: int = 256         # answers stop at a new "Question:" or at 256 tokens
    response_length_max: int = 256
    allow_early_eos: bool = True           # an answer ends at EOS or a new "Question:"
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    # speed: TF32 matmuls on a GPU (2.3x faster than fp32 for PPO at the paper's IMDB shapes); fp32 for exact runs
    precision: str = "tf32"                # fp32 | tf32 | bf16


if __name__ == "__main__":
    main(Hyperparameters, method="cory")
