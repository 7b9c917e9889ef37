"""The GPU path: tiny runs under each precision, the auto pass budget under a small memory figure, and exact
resume. Each test takes a ``device``: on "cpu" it runs everywhere (in the slow set, which CI runs), so the code a
GPU machine runs here cannot go stale unseen; on "cuda" it needs a GPU (marked gpu; on a GPU machine: python -m
pytest -m gpu). The auto budget exists on CUDA alone (a CPU has no limit), so that test is CUDA's only."""
import pytest
import torch

from conftest import IMDB_CORY, REPO, run_script
from cory.config import build, load_yaml
from cory.run.outputs import read_jsonl

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu,
                                   pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])
# the CPU side is minutes of end-to-end runs that other tests cover too: the slow set (make test-slow, CI)
CPU = pytest.param("cpu", marks=pytest.mark.slow)
DEVICES = [CPU, CUDA]
# a run on "cpu" sees no GPU even on a GPU machine
HIDE_GPUS = {"cpu": {"CUDA_VISIBLE_DEVICES": ""}, "cuda": {}}

RUNS = [("imdb_train/ppo.py", "configs/imdb/ppo_tiny.yaml", ["policy"]),
        ("imdb_train/cory.py", "configs/imdb/cory_tiny.yaml", ["llm1", "llm2"]),
        ("gsm8k_train/cory.py", "configs/gsm8k/cory_tiny.yaml", ["llm1", "llm2"])]
# on a CPU, tf32 is fp32 and bf16 has tests of its own (tests/test_precision.py): fp32 runs the path
PRECISIONS = [pytest.param("cpu", "fp32", marks=pytest.mark.slow, id="cpu-fp32")] + [
    pytest.param(*CUDA.values, p, marks=CUDA.marks, id=f"cuda-{p}") for p in ("fp32", "tf32", "bf16")]


@pytest.mark.parametrize("device,precision", PRECISIONS)
@pytest.mark.parametrize("script,preset,agents", RUNS, ids=["imdb-ppo", "imdb-cory", "gsm8k-cory-lora"])
def test_tiny_runs(tmp_path, script, preset, agents, device, precision):
    out = tmp_path / "run"
    p = run_script(script, "--config", preset, "--steps", "2", "--precision", precision, "--output_dir", out,
                   env=HIDE_GPUS[device])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert 0 < r["memory/peak_gib"] < 80  # CUDA: the allocator's peak over the iteration; CPU: the process's
        for a in agents:
            assert r[f"{a}/kl"] == r[f"{a}/kl"] and r[f"{a}/policy_loss"] == r[f"{a}/policy_loss"]  # not NaN


def tiny(cls, name, out, **over):
    base = load_yaml(REPO / "configs" / "imdb" / f"{name}_tiny.yaml")
    base.update(output_dir=str(out), **over)
    return build(cls, base)


def comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in rows]


def assert_same(a, b, rel=1e-4):
    assert len(a) == len(b)
    for ra, rb in zip(comparable(a), comparable(b)):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float):
                assert ra[k] == pytest.approx(rb[k], rel=rel, abs=1e-5), (ra["step"], k)


@pytest.mark.parametrize("device", [CUDA])
def test_auto_budget_under_a_small_memory_figure_gives_the_same_run(tmp_path, monkeypatch, device):
    """The free memory is stubbed to a few MiB, so the measured budget comes out at the floor and every PPO
    mini-batch runs in several passes: no out-of-memory, and the same metrics as one pass per mini-batch."""
    from cory.device import budget
    from cory.train import prepare_run

    chosen = []
    real = budget.auto_pass_tokens

    def small(free_bytes, bytes_per_token, reserve_bytes=0.0, fraction=budget.BUDGET_FRACTION,
              floor=budget.BUDGET_FLOOR):
        n = real(8 * 2 ** 20 + reserve_bytes, bytes_per_token, reserve_bytes, fraction, floor=16)
        chosen.append(n)
        return n
    monkeypatch.setattr(budget, "auto_pass_tokens", small)
    auto = prepare_run(tiny(IMDB_CORY, "cory", tmp_path / "auto", steps=2, precision="fp32",
                            max_pass_tokens="auto")).fit()
    assert chosen and all(n < 64 for n in chosen)
    one = prepare_run(tiny(IMDB_CORY, "cory", tmp_path / "one", steps=2, precision="fp32", max_pass_tokens=0)).fit()
    assert_same(read_jsonl(auto / "metrics.jsonl"), read_jsonl(one / "metrics.jsonl"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["cory", "ppo"])
def test_resume_equals_uninterrupted(tmp_path, method, device):
    """A run stopped after 2 iterations and resumed to 4 gives the uninterrupted run's numbers (on CUDA that needs
    CUDA's generators in the checkpoint: sampling there draws from them)."""
    script, preset = f"imdb_train/{method}.py", f"configs/imdb/{method}_tiny.yaml"

    def run(*args):
        p = run_script(script, *args, env=HIDE_GPUS[device])
        assert p.returncode == 0, p.stderr[-3000:]
    run("--config", preset, "--precision", "fp32", "--steps", "4", "--save_every", "2", "--output_dir", tmp_path / "a")
    run("--config", preset, "--precision", "fp32", "--steps", "2", "--output_dir", tmp_path / "b")
    run("--resume", tmp_path / "b", "--steps", "4")
    assert_same(read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl"))
