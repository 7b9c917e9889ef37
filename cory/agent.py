"""An agent: one trainable LLM and everything that travels with it when roles are exchanged.

Each agent is one trl ``PPOTrainer`` with its own policy (and value head, for ``advantage_estimator: gae``), Adam
optimizer, adaptive KL controller and score normaliser. PPO trains one agent; CORY trains two that share one frozen
reference model, so nothing but the role changes at an exchange.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from trl import PPOTrainer

from cory import models, parallel
from cory.config import PPOArgs, has_critic
from cory.device.precision import precision_context, resolve_precision
from cory.generation import generate_from_shared_prefix, new_tokens
from cory.device.budget import trainable_state_bytes
from cory.device.patches import frozen_models_not_wrapped
from cory.ppo import AgentTrainer, ScoreNormalizer, StepStats, kl_controller, ppo_config


class Agent:
    """One trainable LLM: its policy, optimizer, KL controller and score normaliser in one trl PPOTrainer."""

    def __init__(self, name: str, cfg: PPOArgs, policy, ref_model, tokenizer):
        self.name = name
        self.cfg = cfg
        self.tokenizer = tokenizer
        self._policy = policy
        self.use_own_adapter()  # trl builds the optimizer from the parameters that require grad right now
        trainer_class, extra = self.trainer_class()
        if issubclass(trainer_class, AgentTrainer):  # our step reads cfg; trl's PPOConfig only sets trl's trainer up
            extra = {"args": cfg, **extra}
        with warnings.catch_warnings(), frozen_models_not_wrapped():
            warnings.simplefilter("ignore")  # deprecation and "no dataset" notices of the classic API
            # one trl PPOConfig per trainer: trl writes into its own
            self.trainer = trainer_class(config=ppo_config(cfg), model=policy, ref_model=ref_model,
                                         tokenizer=tokenizer, optimizer=self.make_optimizer(policy), **extra)
        self.normalizer = ScoreNormalizer()

    def trainer_class(self):
        """(the PPOTrainer class, its extra arguments): ``cory.ppo``'s step unless ``fast_ppo`` is off."""
        if not self.cfg.fast_ppo:
            return PPOTrainer, {}
        return AgentTrainer, {"max_pass_tokens": self.cfg.max_pass_tokens,
                              "compute": lambda cache: self.compute(training=not cache)}

    def reserve_for_training(self, reserve_bytes: float) -> None:
        """The memory every agent's gradients and Adam moments will take, kept out of an ``auto`` pass budget."""
        if hasattr(self.trainer, "reserve_bytes"):
            self.trainer.reserve_bytes = reserve_bytes

    def make_optimizer(self, policy):
        """trl's default optimizer (Adam at the configured rate); with ``fast_ppo`` in torch's fused form, the
        same update to float rounding and faster on CPU (`python benchmarks/levers.py`, its Adam lever, measures by
        how much on the machine at hand). None: trl builds it."""
        if not self.cfg.fast_ppo:
            return None
        trainable = [p for p in policy.parameters() if p.requires_grad]
        return torch.optim.Adam(trainable, lr=self.cfg.learning_rate, fused=True)

    @property
    def policy(self):
        """The unwrapped value-head model (DDP adds a wrapper in multi-process runs)."""
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def use_own_adapter(self) -> None:
        """On a LoRA base shared by both agents, make this agent's adapter the active (and only trainable) one;
        an agent with a model of its own has nothing to switch."""
        name = getattr(self._policy, "adapter_name", None)  # set by models.load_policies on a shared base
        if name is not None and self._policy.pretrained_model.active_adapter != name:
            self._policy.pretrained_model.set_adapter(name)

    @property
    def kl_coef(self) -> float:
        return float(self.trainer.kl_ctl.value)

    def compute(self, training: bool = False):
        """The precision PPO and generation compute in: with ``precision: bf16`` an autocast region (weights and
        Adam state stay float32), else nothing (TF32 is a process-wide switch, see ``set_precision``).

        Within one autocast region each weight is cast to bf16 once and the copy reused: right for a whole
        generation (one cast instead of one per token) and for one optimizer step's passes, wrong across optimizer
        steps (a stale copy): ``training`` casts afresh at every pass, for trl's stock step, which runs whole in
        one region; ``cory.ppo``'s step opens a cached region per optimizer step instead."""
        return precision_context(self.precision, self.trainer.accelerator.device.type, cache=not training)

    @property
    def precision(self) -> str:
        return resolve_precision(self.cfg.precision, self.trainer.accelerator.device.type)[0]

    @torch.inference_mode()
    def generate(self, prompts: list[torch.Tensor], **generation_kwargs) -> list[torch.Tensor]:
        """Sampled responses (without their prompts, cut after their first EOS), in one batched call for the whole
        batch (trl's default of 4 per call is several times slower). A beginning every prompt shares (a one-shot
        example) is read once for the batch, not once per prompt: trl's ``generate`` reads it for every row."""
        # trl leaves the model in train mode after step(), so its next generation would sample with dropout
        # on (GPT-2 has 0.1) while PPO scores those tokens with dropout off: sample in eval mode
        self.use_own_adapter()
        self.trainer.model.eval()
        with self.compute():
            out, width = generate_from_shared_prefix(self.policy.pretrained_model, [p.tolist() for p in prompts],
                                                     self.tokenizer.pad_token_id, **generation_kwargs)
        return new_tokens(out, width, self.tokenizer.eos_token_id)

    def step(self, queries, responses, scores: list[float]) -> StepStats:
        """One PPO update on (queries, responses, scores) (``cory.ppo``: the per-token KL penalty is added to the
        scores there); the scores normalised first with ``score_norm``."""
        self.use_own_adapter()
        if self.cfg.score_norm:
            # statistics over the whole data-parallel batch (as trl's own score scaling), so every
            # process holds the same normaliser and the checkpoint's copy is right for all of them
            everyone = parallel.gather_floats(scores)
            rank = parallel.rank()
            scores = self.normalizer(everyone)[rank * len(scores): (rank + 1) * len(scores)]
        # cory.ppo's step opens its own precision regions (a weight cast once per optimizer step); trl's stock step
        # runs whole in one region that casts afresh at every pass
        region = contextlib.nullcontext() if isinstance(self.trainer, AgentTrainer) else self.compute(training=True)
        with warnings.catch_warnings(), region:
            warnings.simplefilter("ignore", UserWarning)
            stats = self.trainer.step(queries, responses, [torch.tensor(s, dtype=torch.float32) for s in scores])
        return stats if isinstance(stats, StepStats) else StepStats.from_trl(stats)

    def reset_optimizer_state(self) -> None:
        """The authors' exchange reloads fresh PPOTrainers: new Adam moments, KL coefficient and score stats."""
        self.trainer.optimizer.state.clear()
        self.trainer.kl_ctl = kl_controller(self.cfg)
        self.normalizer = ScoreNormalizer()

    def state_dict(self, optimizer: bool = True) -> dict:
        """What a checkpoint saves of the agent; ``optimizer`` False (``save_only_model``) leaves out Adam's moments,
        two thirds of it."""
        self.use_own_adapter()  # "requires grad" marks this agent's own adapter on a shared base
        return {
            "params": {n: p.detach() for n, p in self.policy.named_parameters() if p.requires_grad},
            **({"optimizer": self.trainer.optimizer.state_dict()} if optimizer else {}),
            "kl_coef": self.trainer.kl_ctl.value,
            "normalizer": self.normalizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Put back what ``state_dict`` saved; without an optimizer state Adam starts afresh, as at iteration 0."""
        self.use_own_adapter()
        params = dict(self.policy.named_parameters())
        with torch.no_grad():
            for n, value in state["params"].items():
                params[n].copy_(value)
        if "optimizer" in state:
            self.trainer.optimizer.load_state_dict(state["optimizer"])
        self.trainer.kl_ctl.value = state["kl_coef"]
        self.normalizer.load_state_dict(state["normalizer"])


def make_agents(cfg: PPOArgs, spec, names: list[str], tokenizer, *, precision: str,
                shared_base: bool = True) -> tuple[dict, object]:
    """({name: Agent}, the frozen reference) of the model ``spec`` (a located ``cory.assets.ModelSpec``), computing
    in ``precision`` (``cfg.precision`` resolved for this machine: ``resolve_precision``): the reference is loaded
    once and shared by every agent; with LoRA (and ``shared_base``) the agents' adapters sit on one frozen base,
    which is then the reference."""
    # with LoRA the base is frozen (never updated), so under bf16 compute it is stored in bf16: half the memory;
    # the adapters and value heads, which train, stay float32
    frozen_bf16 = cfg.use_peft and precision == "bf16" and not cfg.load_in_4bit
    critic = has_critic(cfg)
    reference = models.load_reference(spec, use_peft=cfg.use_peft)
    policies = models.load_policies(spec, names, value_head=critic, use_peft=cfg.use_peft, shared_base=shared_base,
                                    lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                    load_in_4bit=cfg.load_in_4bit,
                                    torch_dtype=torch.bfloat16 if frozen_bf16 else None)
    if critic and cfg.value_head_init == "zero":  # before the trainers: a resume then loads the saved head over it
        for policy in policies.values():
            models.zero_value_head(policy)
    agents = {name: Agent(name, cfg, policies[name], reference, tokenizer) for name in names}
    reserve = sum(trainable_state_bytes(agent.policy) for agent in agents.values())
    for agent in agents.values():
        agent.reserve_for_training(reserve)
    return agents, reference
