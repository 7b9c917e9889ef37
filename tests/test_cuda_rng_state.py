"""Checkpoints carry CUDA's random generators (sampling on a GPU draws from them): without them a resumed GPU run
samples other answers than the uninterrupted one. CUDA's state functions are stood in here, so CI (no GPU) holds
the saving and restoring; tests/test_gpu.py holds a resumed run equal to an uninterrupted one on a real GPU."""
import random

import numpy as np
import pytest
import torch

from cory.run import checkpoint
from cory.run.outputs import load_checkpoint_file


@pytest.fixture
def two_cuda_devices(monkeypatch):
    """torch.cuda as a machine with two GPUs would show it, its generator states plain byte tensors."""
    states = {0: torch.tensor([1, 2, 3], dtype=torch.uint8), 1: torch.tensor([4, 5, 6], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(states))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [states[d].clone() for d in sorted(states)])

    def set_state(state, device):
        states[device] = state.clone()
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    return states


def _through_a_checkpoint(tmp_path, state):
    checkpoint._save({"rng": state}, tmp_path / "state.pt")
    return load_checkpoint_file(tmp_path / "state.pt")["rng"]  # weights_only=True, as a resume reads it


def test_a_checkpoint_restores_every_cuda_generator(tmp_path, two_cuda_devices):
    lengths = np.random.default_rng(0)
    saved = _through_a_checkpoint(tmp_path, checkpoint.rng_state(lengths))
    assert [s.tolist() for s in saved["cuda"]] == [[1, 2, 3], [4, 5, 6]]
    two_cuda_devices[0], two_cuda_devices[1] = torch.tensor([9], dtype=torch.uint8), torch.tensor([9], dtype=torch.uint8)
    checkpoint.set_rng_state(saved, lengths)
    assert two_cuda_devices[0].tolist() == [1, 2, 3] and two_cuda_devices[1].tolist() == [4, 5, 6]


def test_the_cpu_streams_come_back_too(tmp_path, two_cuda_devices):
    lengths = np.random.default_rng(3)
    saved = _through_a_checkpoint(tmp_path, checkpoint.rng_state(lengths))
    drawn = (torch.rand(3).tolist(), np.random.rand(), random.random(), lengths.integers(100))
    for _ in range(5):
        torch.rand(3), np.random.rand(), random.random(), lengths.integers(100)
    checkpoint.set_rng_state(saved, lengths)
    assert (torch.rand(3).tolist(), np.random.rand(), random.random(), lengths.integers(100)) == drawn


def test_a_machine_with_fewer_gpus_restores_those_it_has(tmp_path, two_cuda_devices):
    saved = _through_a_checkpoint(tmp_path, checkpoint.rng_state(np.random.default_rng(0)))
    del two_cuda_devices[1]
    two_cuda_devices[0] = torch.tensor([0], dtype=torch.uint8)
    checkpoint.set_rng_state(saved, np.random.default_rng(0))
    assert list(two_cuda_devices) == [0] and two_cuda_devices[0].tolist() == [1, 2, 3]


def test_without_cuda_nothing_of_it_is_saved_and_a_gpu_checkpoint_still_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "cuda" not in checkpoint.rng_state(np.random.default_rng(0))
    gpu_made = {**checkpoint.rng_state(np.random.default_rng(0)), "cuda": [torch.tensor([1], dtype=torch.uint8)]}
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a: pytest.fail("no CUDA here"))
    checkpoint.set_rng_state(_through_a_checkpoint(tmp_path, gpu_made), np.random.default_rng(0))
