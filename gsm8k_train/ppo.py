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
    # ---- the paper's model and reward (arXiv 2410.06101, Table 2)
    task: str = "gsm8k"                    # one worked example, then "Question: <q>\nAnswer:"; reward and data
    model_name: str = "meta-llama/Llama-2-7b-chat-hf"  # policy and frozen reference pi0
    load_in_4bit: bool = True              # the authors' QLoRA setting: a 7B base fits one GPU
    use_peft: bool = True                  # LoRA adapters (bias none) on the 4-bit base, and the value head
    lora_r: int = 16                       # LoRA rank (the authors' LoRA config)
    lora_alpha: int = 16                   # LoRA scaling alpha (the authors' LoRA config)
    reward_model: str = "correctness"      # 1 if the final number equals the reference answer, else 0
    output_dir: str = "runs/gsm8k_ppo"     # the run's folder: config, metrics, samples, checkpoints, final model
    steps: int = 100                       # PPO iterations, one batch each
    # ---- PPO: the paper's Table 2
    learning_rate: float = 1e-5            # CORY's is ten times this (gsm8k_train/cory.py)
    batch_size: int = 32                   # questions per iteration
    mini_batch_size: int = 2               # questions per mini-batch; 16 add up to one optimizer step
    gradient_accumulation_steps: int = 16  # 2 x 16 = one optimizer step per epoch, as the whole batch
    ppo_epochs: int = 4
    init_kl_coef: float = 0.01             # small against the 0/1 reward: a correct answer earns 100 nats' worth
    adap_kl_ctrl: bool = True
    target: float = 6.0                    # the adaptive controller's target KL; not in Table 2: trl's default
    horizon: float = 10000.0               # the adaptive controller's horizon; not in Table 2: trl's default
    gamma: float = 1.0                     # the 0/1 score comes once, at the answer's end: no discount
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_penalty: str = "full"               # per-token KL estimate: the full-vocabulary KL(pi || pi0)
    # ---- answers end at EOS or at a new "Question:" the model starts, else at 256 tokens
    response_length_min: int = 256         # shortest answer, in tokens (= longest: no length is drawn)
    response_length_max: int = 256
    allow_early_eos: bool = True           # EOS (or the task's stop string) may end an answer sooner


if __name__ == "__main__":
    main(Hyperparameters)
