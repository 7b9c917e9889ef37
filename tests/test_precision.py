"""Compute precision: bf16 (autocast, float32 weights and Adam state) stays close to fp32 on a PPO step;
TF32 is a CUDA switch that changes nothing on a CPU."""
import pytest
import torch

from conftest import IMDB_PPO
from cory.agent import Agent
from cory.device.precision import resolve_precision, set_precision
from cory.config import build
from cory.errors import ConfigError

STATS = ("kl", "policy_loss", "value_loss", "mean_return", "sequence_entropy")


@pytest.fixture(scope="module")
def setup(ppo_batch):
    return ppo_batch


@pytest.fixture
def step(ppo_step):
    def run(tmp_path, precision, **over):
        agent, stats, params = ppo_step(tmp_path, precision=precision, **over)
        dtypes = {p.dtype for p in agent.policy.parameters()}
        state = {t.dtype for s in agent.trainer.optimizer.state.values() for t in s.values() if t.dim()}
        return stats, params, dtypes, state
    return run


@pytest.mark.parametrize("over", [{}, {"max_pass_tokens": 30}, {"fast_ppo": False}])
def test_bf16_step_is_close_to_fp32(setup, step, tmp_path, over):
    """Tolerance: the statistics within 2% (bf16 keeps 8 bits of mantissa; log-probabilities and the KL are
    taken in float32), the weight update pointing the same way (cosine > 0.95) with the same size (within 10%)."""
    before = torch.cat([p.detach().flatten() for p in setup[2].parameters()])
    s32, p32, _, _ = step(tmp_path / "fp32", "fp32", **over)
    s16, p16, dtypes, state = step(tmp_path / "bf16", "bf16", **over)
    assert dtypes == {torch.float32} and state <= {torch.float32}  # master weights and Adam stay float32
    for key in STATS:
        assert getattr(s16, key) == pytest.approx(getattr(s32, key), rel=0.02, abs=2e-3), key
    u32, u16 = p32 - before, p16 - before
    assert float(torch.nn.functional.cosine_similarity(u32, u16, dim=0)) > 0.95
    assert float(u16.norm() / u32.norm()) == pytest.approx(1.0, abs=0.1)


def test_bf16_generation_samples_from_nearly_the_same_policy(setup, tmp_path):
    tok, reference, policy, queries, _ = setup
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 4,
                          "precision": "bf16", "output_dir": str(tmp_path)})
    agent = Agent("policy", cfg, policy, reference, tok)
    torch.manual_seed(0)
    out = agent.generate(queries, max_new_tokens=6, min_new_tokens=6, do_sample=True, top_k=0,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    assert [len(r) for r in out] == [6] * 4


def test_tf32_is_a_cuda_switch():
    set_precision("tf32")
    assert torch.backends.cuda.matmul.allow_tf32
    set_precision("fp32")
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def test_precision_is_checked():
    with pytest.raises(ConfigError, match="precision: 'fp16' is not one of auto, fp32, tf32, bf16"):
        build(IMDB_PPO, {"precision": "fp16"})


def test_auto_is_the_default_and_follows_the_hardware_not_this_machine():
    """auto: on a CPU, bf16 only where it was measured faster than fp32 (AVX-512 BF16 without AMX: 1.24-1.48x), fp32
    where it was not (AMX: 0.88-1.22x) or is emulated (AVX2: far slower); tf32 on CUDA; a named precision is never
    changed. The CPU's kind is passed in, so the test holds on any machine."""
    assert build(IMDB_PPO, {}).precision == "auto"
    assert resolve_precision("auto", "cpu", kernels="avx512_bf16")[0] == "bf16"
    assert resolve_precision("auto", "cpu", kernels="amx")[0] == "fp32"
    assert resolve_precision("auto", "cpu", kernels="emulated")[0] == "fp32"
    assert resolve_precision("auto", "cuda", kernels="emulated")[0] == "tf32"
    for named in ("fp32", "tf32", "bf16"):
        for kernels in ("amx", "avx512_bf16", "emulated"):
            assert resolve_precision(named, "cpu", kernels=kernels) == (named, "as configured")
    assert "emulates" in resolve_precision("auto", "cpu", kernels="emulated")[1]
    assert "AMX" in resolve_precision("auto", "cpu", kernels="amx")[1]
    assert "measured" in resolve_precision("auto", "cpu", kernels="avx512_bf16")[1]


def test_auto_asks_what_the_math_library_will_run(monkeypatch):
    """A CPU with AVX-512 BF16 whose library is held below it (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2)
    emulates bfloat16: auto must not pick it there for a speed-up measured on native kernels."""
    from cory.device.precision import cpu_bf16_kernels

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert cpu_bf16_kernels("AVX512", "") == "avx512_bf16"
    assert cpu_bf16_kernels("AVX2", "") == "emulated"                       # ATen's kernels held at AVX2
    assert cpu_bf16_kernels("AVX512", "AVX2") == "emulated"                 # oneDNN capped below bf16
    assert cpu_bf16_kernels("AVX512", "avx512_core_bf16") == "avx512_bf16"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert cpu_bf16_kernels("AVX512", "") == "amx"
    assert cpu_bf16_kernels("AVX512", "AVX512_CORE_BF16") == "avx512_bf16"  # AMX capped away, bf16 kept
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_bf16_kernels("AVX512") == "emulated" and resolve_precision("auto", "cpu")[0] == "fp32"


def test_an_agent_computes_in_the_resolved_precision(setup, tmp_path, monkeypatch):
    tok, reference, policy, _, _ = setup
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 4,
                          "output_dir": str(tmp_path)})
    agent = Agent("policy", cfg, policy, reference, tok)
    for kernels, want in (("avx512_bf16", torch.bfloat16), ("amx", None), ("emulated", None)):
        monkeypatch.setattr("cory.device.precision.cpu_bf16_kernels", lambda: kernels)
        with agent.compute():
            assert (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None) == want
