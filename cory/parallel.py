"""What data-parallel processes share, through accelerate's collectives. Every process calls these at the
same points; with one process they return their input.

Each process holds both agents (and the frozen reference) and draws its own batches; trl averages the
gradients. The run needs a few things beyond that: one decision for all (stop on a non-finite reward),
score statistics over the whole batch, metrics averaged over processes, every process's data stream in a
checkpoint, and a barrier after it.
"""
from __future__ import annotations

import os

import torch


def setup() -> tuple[int, int]:
    """(rank, world size). Under torchrun on CPU, accelerate must be told cpu=True before trl loads a model,
    or every process silently trains alone (checked with trl 0.11.4 + accelerate 1.15)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())
        return state.process_index, state.num_processes
    return 0, 1


def _state():
    from accelerate import PartialState

    return PartialState()


def distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and _state().num_processes > 1


def rank() -> int:
    return _state().process_index if distributed() else 0


def barrier() -> None:
    if distributed():
        _state().wait_for_everyone()


def any_process(flag: bool) -> bool:
    """True in every process when ``flag`` is true in any."""
    if not distributed():
        return bool(flag)
    from accelerate.utils import reduce

    return bool(reduce(torch.tensor([float(bool(flag))], device=_state().device), reduction="max").item())


def gather_objects(obj) -> list:
    """``obj`` of every process, in rank order."""
    if not distributed():
        return [obj]
    from accelerate.utils import gather_object

    return gather_object([obj])


def gather_floats(values: list[float]) -> list[float]:
    """The same-length ``values`` of every process, concatenated in rank order."""
    if not distributed():
        return list(values)
    from accelerate.utils import gather

    return gather(torch.tensor(values, dtype=torch.float64, device=_state().device)).tolist()


def mean_over_processes(row: dict) -> dict:
    """The numeric metrics of a row averaged over processes (trl already averages its own statistics)."""
    if not distributed():
        return row
    from accelerate.utils import reduce

    keys = [k for k, v in row.items() if isinstance(v, float)]
    values = reduce(torch.tensor([row[k] for k in keys], dtype=torch.float64, device=_state().device), "mean")
    return {**row, **dict(zip(keys, values.tolist()))}
