"""What a run saves, and how a resume puts it back.

A checkpoint, ``checkpoints/step_NNNNNN/`` after N completed iterations, holds everything a resumed run needs to go
on as the uninterrupted one would:

- ``<agent>.pt`` for each agent (``policy``; or ``llm1`` and ``llm2``): its trainable parameters (with LoRA, its
  adapter), its optimizer's state (not with ``save_only_model``: a resume then starts Adam afresh, and says so),
  its KL coefficient and its score normaliser (``Agent.state_dict``);
- ``state.pt``: the ``step`` (completed iterations); the main process's data sampler (``task``: the task's
  ``state_dict``) and random streams (``rng``: torch's CPU generator, every CUDA device's on a GPU, numpy's,
  Python's, and the answer lengths' generator); the same pair for every other process (``other_ranks``); and the
  config it was trained with, less ``resume`` and ``overwrite`` (``config``); what its base model was
  (``base_model``: ``cory.assets.weights_fingerprint``, where there is one); the precision it computed in
  (``precision``, what ``auto`` resolved to, which a resume on another machine keeps); whether the agent files lack
  their optimizer state (``model_only``); and the sha256 of every agent file
  beside it (``files``), so that a resume takes only the files saved with it (``cory.run.run_rules.check_resumable``,
  which also checks ``step`` against the folder's name).

It is written whole or not at all (``RunDir.save_checkpoint``) and read back as data only
(``cory.run.outputs.load_checkpoint_file``, which the checks before any model loads share without torch). The run's
final models (``final/``, ``save_final``) are saved here too.
"""
from __future__ import annotations

import copy
import errno
import hashlib
import json
import random
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from cory import parallel
from cory.config import INVOCATION_FIELDS, PPOArgs, to_dict
from cory.errors import ConfigError, RunError
from cory.run.final import file_digest, write_final
from cory.run.outputs import DIGESTS, RunDir, latest_checkpoint, load_checkpoint_file
from cory.tasks.base import Task


def sampler_state(task: Task, length_rng: np.random.Generator) -> dict:
    """Where this process's data and random streams stand."""
    return {"task": copy.deepcopy(task.state_dict()), "rng": rng_state(length_rng)}


def save(run_dir: RunDir, step: int, agents: dict, sampler: dict, cfg: PPOArgs, base_model: str | None = None) -> None:
    """Checkpoint after ``step`` completed iterations; ``sampler``: this process's ``sampler_state``; ``base_model``:
    the base model's ``weights_fingerprint``, which a resume compares (``cory.run.run_rules.check_resumable``).

    The agents are the same in every process; the data and random streams are not, so the main process saves
    every process's ``sampler``.
    """
    samplers = parallel.gather_objects(sampler)
    files = {f"{name}.pt": agent.state_dict(optimizer=not cfg.save_only_model) for name, agent in agents.items()}
    # the config the weights were trained with, so that a resume can tell a hand-edited config.yaml
    state = {"step": step, **samplers[0], "other_ranks": samplers[1:],
             "config": {k: v for k, v in to_dict(cfg).items() if k not in INVOCATION_FIELDS},
             **({"base_model": base_model} if base_model is not None else {}),
             # what ``precision: auto`` resolved to where the run started: a resume elsewhere keeps it
             "precision": next(iter(agents.values())).precision,
             # save_only_model: no optimizer state in the agent files, so a resume from here is not exact
             "model_only": cfg.save_only_model}

    def write(folder: Path):
        for name, content in files.items():
            _save(content, folder / name)
        # what ties the agent files to this state: a resume refuses files copied in from another checkpoint
        _save({**state, "files": {name: file_digest(folder / name) for name in files}}, folder / "state.pt")
    try:
        run_dir.save_checkpoint(step, write, keep=cfg.save_total_limit)
    except OSError as e:
        # a file-size limit (ulimit -f: EFBIG; Python ignores the SIGXFSZ that would kill it) is a full disk for
        # one file: the same stop, and --resume continues once it is lifted
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        root = run_dir.path
        need, free = _gib(sum(map(_tensor_bytes, files.values()))), _gib(shutil.disk_usage(root).free)
        last = latest_checkpoint(root)
        kept = f"the last complete one, {last}, is kept" if last else "no earlier checkpoint"
        if e.errno == errno.EFBIG:
            raise RunError(f"checkpoint {step}: a file of it would be larger than this process may write in {root} "
                           f"(the file size limit, ulimit -f; the checkpoint needs about {need}); {kept}; raise the "
                           f"limit (ulimit -f unlimited), then continue with --resume {cfg.output_dir}") from None
        raise RunError(f"checkpoint {step}: no space left on the device holding {root} ({free} free, the "
                       f"checkpoint needs about {need}); {kept}; free space, then continue with --resume "
                       f"{cfg.output_dir}") from None
    parallel.barrier()  # no process runs ahead of, or later resumes from, a checkpoint still being written


def restore(folder: Path, agents: dict, task: Task, length_rng: np.random.Generator, cfg: PPOArgs,
            world_size: int) -> int:
    """Put the checkpoint in ``folder`` back into the agents, the task and the random streams; returns its step.
    What it refuses can only be found with the models loaded; every other rule of a resume is checked before
    (``cory.run.run_rules``)."""
    for name, agent in agents.items():
        state = load_checkpoint_file(folder / f"{name}.pt")
        try:
            agent.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            raise ConfigError(f"resume: {folder / (name + '.pt')} does not fit this run's model "
                              f"({type(e).__name__}); was it written by another model or method?") from None
    state = load_checkpoint_file(folder / "state.pt")
    others = state.get("other_ranks", [])
    rank = parallel.rank()
    if 1 + len(others) != world_size:
        warnings.warn(f"resume: {folder} was written by {1 + len(others)} processes and this run has "
                      f"{world_size}; processes without a saved data stream start a fresh one")
    mine = state if rank == 0 else (others[rank - 1] if rank <= len(others) else None)
    if mine is not None:
        try:  # the task refuses a state of another format or other data (a data file changed since)
            task.load_state_dict(mine["task"])
        except (ValueError, KeyError, TypeError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"resume: {folder / 'state.pt'} holds a task {cfg.task} state this run cannot "
                              f"take ({why}); resume with the data and version it was saved with, or start "
                              "again with --overwrite") from None
        set_rng_state(mine["rng"], length_rng)
    else:  # response lengths stay common to all processes
        length_rng.bit_generator.state = state["rng"]["length"]
    return state["step"]


def save_final(run_dir: RunDir, agents: dict, tokenizer, cfg: PPOArgs, world_size: int) -> None:
    """The plain final models, from the main process, once every process holds the same weights: written whole
    or not at all (``cory.run.final.write_final``), so a save cut short leaves no final/ that reads as finished."""
    digests = ({name: weights_digest(agent.state_dict()["params"]) for name, agent in agents.items()}
               if world_size > 1 else {})
    everyone = parallel.gather_objects(digests)
    if run_dir.enabled:
        def write(folder: Path):
            for name, agent in agents.items():
                agent.use_own_adapter()  # merge_and_unload merges the active adapter only
                model = agent.policy.pretrained_model
                if getattr(agent.policy, "is_peft_model", False):
                    # a plain model that loads from the query alone, without peft or the base
                    model = copy.deepcopy(model).merge_and_unload()
                save_model(model, folder / name, cfg.final_dtype)
                tokenizer.save_pretrained(folder / name)
            if world_size > 1:
                record = {name: [d[name] for d in everyone] for name in digests}
                (folder / DIGESTS).write_text(json.dumps(record, indent=1))
        from safetensors import SafetensorError  # safetensors' writer reports a full disk as its own error

        try:
            write_final(run_dir.path, cfg.steps, write)
        except (OSError, SafetensorError) as e:  # a full or read-only disk: the last iteration's checkpoint is saved
            raise RunError(f"final models: cannot write them in {run_dir.path} ({_io_reason(e)}); "
                           f"nothing of them was kept; free space, then finish the run with --resume "
                           f"{cfg.output_dir}") from None
    parallel.barrier()
    for name in digests:
        if len({d[name] for d in everyone}) > 1:
            raise RunError(f"{name}: the {len(everyone)} processes ended with different weights (sha256 per "
                           f"process in {run_dir.path / 'final' / DIGESTS})")


def drop_resume_checkpoint(run_dir: RunDir, cfg: PPOArgs) -> None:
    """``keep_resume_checkpoint: false``, once the final models are written: the run's checkpoint files go
    (``RunDir.drop_checkpoints``: never a link, nor a file of another name), and the log says what that freed."""
    if not run_dir.enabled:
        return
    freed, left = run_dir.drop_checkpoints()
    print(f"checkpoint dropped (keep_resume_checkpoint: false): {_gib(freed)} freed; the final models are in "
          f"{Path(cfg.output_dir) / 'final'}; --resume can no longer extend this run", flush=True)
    if left:
        names = ", ".join(str(p.relative_to(run_dir.path)) for p in left[:4]) + (", ..." if len(left) > 4 else "")
        print(f"left in place, not the run's checkpoint files (a link, or another name): {names}", flush=True)


FINAL_DTYPES = {"bf16": torch.bfloat16}  # final_dtype -> the weights' dtype ("training": as they are)


def save_model(model, folder: Path, final_dtype: str = "training") -> None:
    """``model.save_pretrained(folder)``, its floating-point weights cast to ``final_dtype`` (``FINAL_DTYPES``) in a
    copy of its state (the model trains on, or is evaluated, as it is) and its config.json saying so."""
    if final_dtype == "training":
        model.save_pretrained(folder)
        return
    dtype = FINAL_DTYPES[final_dtype]
    cast: dict = {}  # one cast per tensor storage, so tied weights (embeddings and the LM head) stay one tensor
    state = {name: cast.setdefault((t.data_ptr(), t.dtype, t.shape), t.detach().to(dtype))
             if t.is_floating_point() else t for name, t in model.state_dict().items()}
    model.save_pretrained(folder, state_dict=state)
    config = copy.copy(model.config)  # save_pretrained wrote the dtype of the model's parameters, not of the file's
    config.dtype = str(dtype).split(".")[1]
    config.save_pretrained(folder)


def _io_reason(e: Exception) -> str:
    """The operating system's words for a failed write: an OSError's, or the one quoted inside safetensors' error
    ('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')."""
    if isinstance(e, OSError):
        return e.strerror or str(e)
    quoted = re.search(r'message: "([^"]+)"', str(e))
    return quoted.group(1) if quoted else (str(e).strip().splitlines() or [type(e).__name__])[0]


def rng_state(length_rng: np.random.Generator) -> dict:
    """Every random stream a run draws from: torch's CPU generator and, on a GPU, each CUDA device's (sampling on
    the GPU draws from those), numpy's, Python's, and the stream of answer lengths."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
             "length": length_rng.bit_generator.state}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, length_rng: np.random.Generator) -> None:
    """Put back what ``rng_state`` saved. CUDA's generators go back where the checkpoint has them and the run has
    CUDA; a GPU run resumed on a CPU (or the reverse) goes on, with its own draws from there on."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    length_rng.bit_generator.state = state["length"]
    if state.get("cuda") and torch.cuda.is_available():
        cuda = list(state["cuda"])[: torch.cuda.device_count()]
        for device, device_state in enumerate(cuda):
            torch.cuda.set_rng_state(device_state, device)


def weights_digest(params: dict) -> str:
    """sha256 of ``{name: tensor}`` (names and bytes, in name order): equal digests, equal weights.
    Applied to an agent's trainable parameters, as its checkpoint saves them under ``params``."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _save(content, path: Path) -> None:
    """torch.save through a Python file, so that a full disk raises its OSError (ENOSPC). An exception raised
    while torch's zip writer is open (that OSError, or the KeyboardInterrupt of a second stop signal) can come
    out as the writer's RuntimeError on closing: raise the cause instead."""
    with open(path, "wb") as f:
        try:
            torch.save(content, f)
        except RuntimeError as e:
            if isinstance(e.__context__, (OSError, KeyboardInterrupt)):
                raise e.__context__ from None
            raise


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, dict):
        obj = list(obj.values())
    return sum(map(_tensor_bytes, obj)) if isinstance(obj, (list, tuple)) else 0


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
