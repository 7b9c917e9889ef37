"""On a CUDA GPU: the tiny runs under each precision, the auto pass budget under a small memory figure, and
resume. Skipped where there is no GPU (CI); on a GPU machine: python -m pytest -m gpu."""
import pytest
import torch

from conftest import IMDB_CORY, IMDB_PPO, REPO, run_script
from cory.config import build, load_yaml
from cory.outputs import read_jsonl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RUNS = [("imdb_train/ppo.py", "configs/imdb/ppo_tiny.yaml", ["policy"]),
        ("imdb_train/cory.py", "configs/imdb/cory_tiny.yaml", ["llm1", "llm2"]),
        ("gsm8k_train/cory.py", "configs/gsm8k/cory_tiny.yaml", ["llm1", "llm2"])]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("script,preset,agents", RUNS, ids=["imdb-ppo", "imdb-cory", "gsm8k-cory-lora"])
def test_tiny_runs_on_cuda(tmp_path, script, preset, agents, precision):
    out = tmp_path / "run"
    p = run_script(script, "--config", preset, "--steps", "2", "--precision", precision, "--output_dir", out)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert 0 < r["memory/peak_gib"] < 80  # CUDA: the allocator's peak over the iteration
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


def test_auto_budget_under_a_small_memory_figure_gives_the_same_run(tmp_path, monkeypatch):
    """The free memory is stubbed to a few MiB, so the measured budget comes out at the floor and every PPO
    mini-batch runs in several passes: no out-of-memory, and the same metrics as one pass per mini-batch."""
    from cory import passes as budget
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
                            max_pass_tokens="auto"), "cory").fit()
    assert chosen and all(n < 64 for n in chosen)
    one = prepare_run(tiny(IMDB_CORY, "cory", tmp_path / "one", steps=2, precision="fp32", max_pass_tokens=0),
                      "cory").fit()
    assert_same(read_jsonl(auto / "metrics.jsonl"), read_jsonl(one / "metrics.jsonl"))


@pytest.mark.parametrize("method,cls", [("cory", IMDB_CORY), ("ppo", IMDB_PPO)])
def test_resume_on_cuda_equals_uninterrupted(tmp_path, method, cls):
    from cory.train import prepare_run

    straight = prepare_run(tiny(cls, method, tmp_path / "a", steps=4, save_every=2, precision="fp32")).fit()
    prepare_run(tiny(cls, method, tmp_path / "b", steps=2, precision="fp32")).fit()
    p = run_script(f"imdb_train/{method}.py", "--resume", tmp_path / "b", "--steps", "4")
    assert p.returncode == 0, p.stderr[-3000:]
    assert_same(read_jsonl(straight / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl"))
