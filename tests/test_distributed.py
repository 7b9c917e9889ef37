"""Data-parallel training on CPU: torchrun starts two processes (gloo), each holding both CORY agents.

What makes it real: each process draws its own batches, DDP averages the gradients, and at the end the
trainer compares every process's weights (sha256 of each agent's trainable parameters, gathered to the
main process, recorded in ``final/weight_digests.json``; a mismatch stops the run with an error).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from cory.run.checkpoint import weights_digest
from cory.run.outputs import latest_checkpoint, read_jsonl


def torchrun(*args, timeout=900):
    # --standalone picks a free rendezvous port: parallel test runs on one machine do not collide
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "imdb_train" / "cory.py"), *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def check_in_sync(out, steps):
    """Both processes ended with the weights of the last checkpoint, which the main process wrote."""
    digests = json.loads((out / "final" / "weight_digests.json").read_text())
    ckpt = latest_checkpoint(out)
    assert ckpt.name == f"step_{steps:06d}"
    for agent in ("llm1", "llm2"):
        saved = torch.load(ckpt / f"{agent}.pt", weights_only=False)["params"]
        assert digests[agent] == [weights_digest(saved)] * 2, agent
    state = torch.load(ckpt / "state.pt", weights_only=False)
    [other] = state["other_ranks"]
    # two data streams, each at its own position after `steps` batches (not one stream twice)
    assert state["task"]["batches"] == other["task"]["batches"] == steps
    assert state["task"]["perm"] != other["task"]["perm"]
    assert not torch.equal(state["rng"]["torch"], other["rng"]["torch"])


@pytest.mark.slow
def test_two_processes_train_in_sync_and_resume(tmp_path):
    out = tmp_path / "run"
    p = torchrun("--config", "configs/imdb/cory_tiny.yaml", "--steps", 2, "--save_every", 1,
                 "--keep_checkpoints", 5, "--output_dir", out)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("done: ") == 1  # the main process reports, once
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and all(r["world_size"] == 2 for r in rows)
    for r in rows:  # averaged over processes, the metrics keep their identities
        assert r["llm1/collective_reward"] == pytest.approx(r["llm1/task_reward"] + r["llm2/task_reward"])
        assert r["llm2/combined_reward"] == pytest.approx(r["llm2/task_reward"] - r["llm2/kl_coef"] * r["llm2/kl"])
    assert [s["step"] for s in read_jsonl(out / "samples.jsonl")] == [0, 0, 1, 1]  # main process only
    assert sorted(os.listdir(out / "checkpoints")) == ["step_000001", "step_000002"]
    check_in_sync(out, 2)

    # the two-process checkpoint reloads: each process picks up its own data stream where it stopped
    p = torchrun("--resume", out, "--steps", 3)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["world_size"] == 2 for r in rows)
    check_in_sync(out, 3)


@pytest.mark.parametrize("name,kind", [("single_gpu", "NO"), ("multi_gpu", "MULTI_GPU"),
                                       ("deepspeed_zero2", "DEEPSPEED")])
def test_accelerate_configs_load(repo, name, kind):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(repo / "configs" / "accelerate" / f"{name}.yaml"))
    assert cfg.distributed_type == kind and not cfg.use_cpu
    assert f"configs/accelerate/{name}.yaml" in (repo / "README.md").read_text()
