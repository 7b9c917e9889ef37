"""A training run: load everything, play the game's iterations, log, checkpoint, resume, stop cleanly.

``train(cfg)`` is what the training scripts call (the config's class says which method it plays, ``cory.method``). The iterations themselves are in
``cory.game``; this module is the loop around them: metrics and samples (``cory.run.outputs``), atomic
checkpoints every ``save_every`` iterations, ``--resume``, the stop signals (Ctrl-C, SIGTERM) that finish
the iteration and save, non-finite rewards, and the final models. What a checkpoint holds, and how it is saved
and put back, is ``cory.run.checkpoint``'s.
"""
from __future__ import annotations

import dataclasses
import os
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cory import game, models, parallel

from cory.device import memory

from cory.run import checkpoint, preflight, run_rules
from cory.agent import make_agents
from cory.device.precision import resolve_precision, set_precision
from cory.assets import locate
from cory.config import PPOArgs, to_dict
from cory.errors import NonFinite, RunError, Stopped
from cory.run.final import final_weights_id
from cory.heldout import PeriodicEvaluation
from cory.method import AGENT_NAMES, Method, method_of
from cory.run.outputs import RUNNER_PID, RunDir, RunLock, check_saveable, latest_checkpoint
from cory.rollout import Rollout
from cory.device.budget import cuda_share
from cory.device.patches import cuda_allocator_segments, return_freed_memory
from cory.tasks import make_task

__all__ = ["Run", "RunError", "prepare_run", "train"]


@dataclass
class Run:
    cfg: PPOArgs
    method: Method  # cory.method.PPO | CORY
    agents: dict  # name -> cory.agent.Agent: {"policy"} for PPO, {"llm1", "llm2"} for CORY
    rollout: Rollout
    run_dir: RunDir
    reference: Any = None  # the frozen model every agent's KL is measured against (None: LoRA's base)
    start_step: int = 0
    world_size: int = 1
    iteration_start: dict | None = None  # sampler_state() before the current iteration drew its batch
    lock: RunLock | None = None  # held by the main process from before the models load to the end of fit()
    base_fingerprint: str | None = None  # what the base model was (``cory.assets.weights_fingerprint``)

    @property
    def task(self):
        return self.rollout.task

    @property
    def tokenizer(self):
        return self.rollout.tokenizer

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> Path:
        """Play the iterations from ``start_step`` to ``cfg.steps``; between two iterations come the held-out
        evaluations, the checkpoints and a requested stop (``between_iterations``)."""
        cfg = self.cfg
        self.run_dir.start(to_dict(cfg), resume_step=self.start_step if cfg.resume is not None else None,
                           overwrite=cfg.overwrite, method=self.method.name)
        if cfg.save_only_model and self.run_dir.enabled:
            print("checkpoints: the model only (save_only_model: true), no optimizer state: a --resume from one starts "
                  "Adam afresh and is not exact", flush=True)
        self.heldout = self.heldout_evaluation()
        self.stop, self.logger = _StopSignals(verbose=self.run_dir.enabled), _Logger(cfg, self.run_dir.enabled)
        self.logged = 0  # iterations this invocation logged (a skipped batch logs none)
        self.bar: Any = None  # progress() makes it; a second stop signal can come before (the base model's evaluation)
        self.iteration = game.ITERATIONS[self.method.name]
        try:
            with self.stop, self.logger:
                if self.start_step == 0:
                    self.evaluate(0)  # the base model, before any update
                for step in self.progress():
                    self.log(step, *self.play(step))
                    self.between_iterations(step + 1)
                self.finish()
        except KeyboardInterrupt:
            raise self.stopped_at_once() from None
        finally:
            if self.lock is not None:
                self.lock.release()
        return Path(cfg.output_dir)

    def play(self, step: int) -> tuple[dict | None, list[dict], float]:
        """One iteration of the game on the next batch: (metrics row or None for a skipped batch, samples, start)."""
        t0 = time.perf_counter()
        memory.reset_peak()
        self.iteration_start = self.sampler_state()
        prompts = self.cfg.batch_size // self.cfg.num_generations  # the batch counts answers, K per prompt
        batch = self.task.sample(prompts)
        if len(batch) != prompts:
            raise RunError(f"task {self.cfg.task}: sample({prompts}) returned {len(batch)} examples "
                           f"({self.method.name} run); a task's sample(n) returns exactly n")
        batch = game.answers_per_prompt(batch, self.cfg.num_generations)
        try:
            row, samples = self.iteration(step, batch, self.agents, self.rollout, self.cfg)
        except NonFinite as e:
            raise self.stopped_by(e, step) from None
        return row, samples, t0

    def log(self, step: int, row: dict | None, samples: list[dict], t0: float) -> None:
        if row is None:  # a batch skipped for non-finite rewards
            return
        row = {"step": step, **row, "time/iteration_s": time.perf_counter() - t0,
               "memory/peak_gib": memory.peak_gib(), "world_size": self.world_size}
        row = parallel.mean_over_processes(row)
        self.run_dir.log_metrics(row)
        self.run_dir.log_samples(samples)
        self.logger.log(row, step)
        self.bar.set_postfix(_postfix(row))
        self.logged += 1

    def between_iterations(self, done: int) -> None:
        """After ``done`` iterations: the held-out evaluation, a stop that was asked for (saved first, so the
        checkpoint is a state the run really passed through), the periodic checkpoint."""
        cfg = self.cfg
        if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
            self.evaluate(done)
        if done < cfg.steps and parallel.any_process(self.stop.requested):
            self.save(done)
            self.bar.close()
            raise Stopped(f"{self.stop.why}: checkpoint of {done} iterations saved in {cfg.output_dir}; continue "
                          f"with --resume {cfg.output_dir}", self.stop.signum)
        if done % cfg.save_every == 0 and done < cfg.steps:
            self.save(done)

    def finish(self) -> None:
        self.bar.close()
        if not self.logged and self.start_step < self.cfg.steps:
            raise RunError(f"every one of the {self.cfg.steps - self.start_step} iterations was skipped for non-finite "
                           f"rewards (on_nonfinite: skip): nothing was trained, no final models written; "
                           f"metrics: none in {self.cfg.output_dir}")
        self.save(self.cfg.steps)
        checkpoint.save_final(self.run_dir, self.agents, self.tokenizer, self.cfg, self.world_size)
        if (self.heldout is not None and self.world_size == 1 and not self.cfg.use_peft
                and self.cfg.final_dtype == "training"):
            # the evaluation after the last iteration scored the final models as saved (LoRA's are merged first, and
            # a cast to final_dtype changes them): lab.evaluate reads it rather than sampling the same answers again
            own = self.heldout.own_final_evaluation(self.cfg.steps, final_weights_id(self.run_dir.path))
            if own is not None:
                self.run_dir.write_own_final_evaluation(own)
        if not self.cfg.keep_resume_checkpoint:  # the final models are whole: the checkpoint goes, as asked
            checkpoint.drop_resume_checkpoint(self.run_dir, self.cfg)

    def stopped_at_once(self) -> Stopped:
        """A second signal: the current iteration is half done, so nothing new is saved."""
        if self.bar is not None:
            self.bar.close()
        last = latest_checkpoint(self.run_dir.path) if self.run_dir.enabled else None
        advice = (f"the last checkpoint is {last}; continue with --resume {self.cfg.output_dir}" if last else
                  f"no checkpoint yet; start again with --resume {self.cfg.output_dir} (it restarts from "
                  "iteration 0) or --overwrite")
        return Stopped(f"interrupted: nothing saved; {advice}", self.stop.again or signal.SIGINT)

    def progress(self):
        from tqdm.auto import tqdm

        self.bar = tqdm(range(self.start_step, self.cfg.steps), initial=self.start_step, total=self.cfg.steps,
                        desc=f"{self.method.name} {self.cfg.task}", disable=not self.run_dir.enabled,
                        dynamic_ncols=True)
        return self.bar

    def heldout_evaluation(self) -> PeriodicEvaluation | None:
        """The run's own held-out evaluation (``eval_every``), from the main process only, else None."""
        if not self.cfg.eval_every or not self.run_dir.enabled:
            return None
        if self.reference is not None:
            return PeriodicEvaluation(self.cfg, self.tokenizer, self.reference.pretrained_model)
        # LoRA: the reference is the base with the adapters off, as trl's step reads it (one base for all agents)
        first = next(iter(self.agents.values()))
        return PeriodicEvaluation(self.cfg, self.tokenizer, models.AdapterView(first.policy.pretrained_model, None))

    def evaluated_models(self) -> dict:
        """Each agent's policy as the held-out evaluation reads it: with LoRA, its own adapter active."""
        if self.reference is not None:
            return {name: agent.policy.pretrained_model for name, agent in self.agents.items()}
        return {name: models.AdapterView(agent.policy.pretrained_model,
                                         getattr(agent.policy, "adapter_name", None) or "default")
                for name, agent in self.agents.items()}

    def evaluate(self, done: int) -> None:
        if self.heldout is not None:
            rows = self.heldout(self.evaluated_models(), done)
            self.run_dir.log_eval(rows)
            # the numbers where people look: one console line, and eval/ keys beside the training rows' (step: the
            # iteration just done, the base model's at 0)
            (self.bar.write if self.bar is not None else print)(eval_line(rows, done), file=sys.stderr)
            self.logger.log({f"eval/{r['agent']}/{k}": v for r in rows for k, v in r.items()
                             if k not in ("iterations", "agent")}, max(done - 1, 0))

    def stopped_by(self, e: NonFinite, step: int) -> RunError:
        if e.what == "reward":
            # no agent has taken this iteration's PPO step yet: save the state the iteration started from
            self.save(step, self.iteration_start)
            return RunError(f"{e}; the last good state is saved in {latest_checkpoint(self.run_dir.path)}; "
                            "use --on_nonfinite skip to skip such batches")
        latest = latest_checkpoint(self.run_dir.path)
        return RunError(f"{e}; " + (f"the last good checkpoint is {latest}" if latest is not None else
                                    "no checkpoint was saved yet"))

    # -- checkpoints (what they hold: cory.run.checkpoint) -------------------------------------------
    def sampler_state(self) -> dict:
        return checkpoint.sampler_state(self.task, self.rollout.length_rng)

    def save(self, step: int, sampler: dict | None = None) -> None:
        """Checkpoint after ``step`` completed iterations, of the data and random streams in ``sampler`` (default:
        where they stand now)."""
        checkpoint.save(self.run_dir, step, self.agents, sampler or self.sampler_state(), self.cfg,
                        self.base_fingerprint)


def prepare_run(cfg: PPOArgs) -> Run | None:
    """Everything a run needs, checked, loaded and (with ``resume``) restored; nothing is written yet. None for the
    ``--resume`` of a finished run: there is nothing to do."""
    method = method_of(cfg)
    if run_rules.nothing_to_do(cfg):  # a finished run's --resume checks nothing further and changes nothing
        return None
    plan = preflight.check_run(cfg)
    cuda_allocator_segments()
    if torch.cuda.is_available():  # a bad share of the GPU fails here, before any model loads; on a CPU it means nothing
        cuda_share()
    rank, world = parallel.setup()
    lock = RunLock(cfg.output_dir).acquire() if rank == 0 else None
    try:
        run = _load_run(cfg, plan, method, rank, world)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    run.lock = lock
    return run


def _load_run(cfg: PPOArgs, plan: preflight.RunPlan, method: Method, rank: int, world: int) -> Run:
    return_freed_memory()
    torch.manual_seed(cfg.seed)
    spec = locate(plan.spec)
    tokenizer = models.load_tokenizer(spec)
    task = make_task(cfg, tokenizer, rank=rank)
    if spec.context is not None and hasattr(task, "check_fits"):  # a prompt too long fails only when drawn
        observer = method.observer_reads_pioneer(cfg)  # the observer's prompt holds the pioneer's answer too
        task.check_fits(tokenizer, spec.context, cfg.response_length_max * (2 if observer else 1),
                        model=cfg.model_name, prompt=(lambda ex: task.observer_prompt(ex, "")) if observer else None)
    check_saveable(task.state_dict(), f"task {cfg.task}: state_dict()")  # every checkpoint holds it

    precision, why = resolve_precision(cfg.precision, "cuda" if torch.cuda.is_available() else "cpu")
    agent_cfg = cfg
    if cfg.precision == "auto" and plan.trained_precision not in (None, precision):
        # auto resolves by the machine: resumed on another kind of CPU it would switch precision mid-run, which an
        # explicit change is refused for; the run goes on in the precision it was trained in
        why = f"auto, kept from the run's checkpoint: here auto would be {precision}, {why}"
        precision = plan.trained_precision
        agent_cfg = dataclasses.replace(cfg, precision=precision)
    set_precision(agent_cfg.precision)
    if rank == 0:
        print(f"precision: {precision} ({why})", flush=True)
    # with LoRA both agents' adapters sit on one shared frozen base (single process only: DDP wants one
    # wrapper per set of weights)
    agents, reference = make_agents(agent_cfg, spec, list(method.agents), tokenizer, precision=precision,
                                    shared_base=world == 1)

    run = Run(cfg=cfg, method=method, agents=agents, reference=reference,
              rollout=Rollout(cfg, task, tokenizer, np.random.default_rng(cfg.seed), spec.context),
              run_dir=RunDir(cfg.output_dir, enabled=rank == 0), world_size=world,
              base_fingerprint=plan.base_fingerprint)
    # trl seeds every RNG when it builds a trainer; seed again so the run depends on cfg.seed alone
    torch.manual_seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    random.seed(cfg.seed + rank)
    if plan.resume_from is not None:  # a --resume without a checkpoint starts again from iteration 0
        run.start_step = checkpoint.restore(plan.resume_from, agents, task, run.rollout.length_rng, cfg, world)
    return run


def train(cfg: PPOArgs) -> Path:
    """Run PPO (one agent) or CORY (two agents) as configured; returns the output folder. Resuming a finished run
    changes nothing."""
    run = prepare_run(cfg)
    return Path(cfg.output_dir) if run is None else run.fit()


# ----------------------------------------------------------------------------- helpers

class _StopSignals:
    """Ctrl-C (SIGINT) or SIGTERM (what schedulers and ``timeout`` send before they kill) asks the loop to
    stop at the end of the current iteration, so the checkpoint it then saves is a state the run really
    passed through; a second signal stops at once, saving nothing. torchrun forwards each signal to every
    process, and the processes agree on the iteration to stop after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.signum = None
        self.again = None  # the second signal, which stops at once
        self._previous = {}
        # started by the experiment runner: taken out of the environment, so that no process this run starts
        # mistakes the runner for its own parent
        self.runner = os.environ.pop(RUNNER_PID, None)
        self.runner_gone = False
        if self.runner is not None and str(os.getppid()) != self.runner:
            # not the runner's child (a variable exported in a shell, or inherited): it would read as the runner gone
            warnings.warn(f"{RUNNER_PID}={self.runner} is not this run's parent process (pid {os.getppid()}): ignored")
            self.runner = None

    @property
    def requested(self) -> bool:
        if self.signum is None and self.runner is not None and str(os.getppid()) != self.runner:
            # the runner died without passing a signal on (SIGKILL, an out-of-memory kill): stop as on SIGTERM
            self.signum, self.runner_gone = signal.SIGTERM, True
            if self.verbose:
                print(f"\nthe experiment runner that started this run (pid {self.runner}) is gone: stopping after "
                      "this iteration and saving a checkpoint", file=sys.stderr, flush=True)
        return self.signum is not None

    @property
    def why(self) -> str:
        if self.runner_gone:
            return f"stopped (its experiment runner, pid {self.runner}, is gone)"
        return "interrupted" if self.signum == signal.SIGINT else f"stopped by {signal.Signals(self.signum).name}"

    def _handle(self, signum, frame):
        if self.requested:
            self.again = signum
            raise KeyboardInterrupt
        self.signum = signum
        if self.verbose:
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            print(f"\n{name}: stopping after this iteration and saving a checkpoint (again: stop now, save nothing)",
                  file=sys.stderr, flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        return False


class _Logger:
    """The metrics rows, also to ``report_to``'s logger, which writes inside the run folder (wandb/ or
    tensorboard/), never in the current one; open while the loop runs, in the main process."""

    def __init__(self, cfg: PPOArgs, enabled: bool):
        self.cfg, self.enabled = cfg, enabled
        self.wandb = self.tensorboard = None

    def __enter__(self):
        cfg = self.cfg
        if self.enabled and cfg.report_to == "wandb":
            import wandb  # optional: only runs that report to wandb need it installed

            self.wandb = wandb.init(project="cory", config=to_dict(cfg), name=Path(cfg.output_dir).name,
                                    resume="allow", dir=cfg.output_dir)
        elif self.enabled and cfg.report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # optional: needs the tensorboard package

            self.tensorboard = SummaryWriter(log_dir=str(Path(cfg.output_dir) / "tensorboard"))
        return self

    def log(self, row: dict, step: int) -> None:
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()  # a killed run keeps what it logged

    def __exit__(self, *exc):
        if self.wandb is not None:
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()
        return False


def eval_line(rows: list[dict], done: int) -> str:
    """One held-out evaluation in a line: per agent the task reward (accuracy for a 0/1 task), greedy where
    measured, the held-out KL, and as the observer its copy and correction rates where defined."""
    parts = []
    for r in rows:
        words = [f"reward {r['task_reward']:.3f}"]
        if isinstance(r.get("greedy_reward"), float):
            words.append(f"greedy {r['greedy_reward']:.3f}")
        words.append(f"KL {r['kl']:.2f}")
        for key, name in (("transfer/copy_rate", "copy"), ("transfer/correction_rate", "correction")):
            value = r.get(key)
            if isinstance(value, float) and value == value:
                words.append(f"{name} {value:.2f}")
        parts.append(f"{r['agent']} " + ", ".join(words))
    return f"held-out after {done} iterations: " + "; ".join(parts)


def _postfix(row: dict) -> dict:
    out = {}
    for prefix in AGENT_NAMES:
        if f"{prefix}/task_reward" in row:
            out[f"{prefix[-1] if prefix != 'policy' else ''}r"] = f"{row[f'{prefix}/task_reward']:.3f}"
            out[f"{prefix[-1] if prefix != 'policy' else ''}kl"] = f"{row[f'{prefix}/kl']:.2f}"
    return out
