"""Training gives the numbers recorded before the PPO step was rewritten (tests/data/step_record.json, written by
tests/record_step.py at the commit it names): the same metrics, and the same weight updates, up to float
rounding, on the tiny model and on the embedded SmolLM2 at batch 8."""
import json

import numpy as np
import pytest

from cory.device.precision import native_bf16_cpu
from cory.metrics import TRANSFER_KEYS
from record_step import BF16_RUNS, RECORD, RUNS, bf16_record_path, cpu_flags, kernel_family, record_run

RECORDED = json.loads(RECORD.read_text())
# each agent's explained variance came after the record too (issue 63): the record holds the value head's mean and the
# returns' mean, not the values themselves, so it is checked to be a number <= 1 as CleanRL's definition allows
EXPLAINED_VARIANCE = {f"{agent}/explained_variance" for agent in ("policy", "llm1", "llm2")}
# the step's diagnostics under CleanRL's names came after the record too (issue 74): computed by the step whose
# losses the record holds (tests/test_ppo_formulas.py holds them to trl's), checked here to be what they can be
APPROX_KL = {f"{agent}/approx_kl" for agent in ("policy", "llm1", "llm2")}
CLIP_FRACTION = {f"{agent}/clip_fraction" for agent in ("policy", "llm1", "llm2")}
SHARES = {f"{agent}/{name}" for agent in ("policy", "llm1", "llm2")
          for name in ("frac_minibatches_skipped", "frac_reward_zero_std")}
# bf16 is held to the record of this CPU's kernel family: AMX's kernels round otherwise than AVX-512 BF16's
FAMILY = kernel_family(cpu_flags())
BF16_RECORD = bf16_record_path(FAMILY)
RECORDED_BF16 = json.loads(BF16_RECORD.read_text()) if BF16_RECORD.is_file() else None


@pytest.mark.slow
@pytest.mark.parametrize("name,method,config,over", RUNS, ids=[r[0] for r in RUNS])
def test_training_gives_the_recorded_numbers(tmp_path, name, method, config, over):
    want, got = RECORDED["runs"][name], record_run(method, config, over, tmp_path / name)
    same_numbers(name, got, want, rel=1e-3, abs_=1e-4, norm=1e-2, share=0.05)


@pytest.mark.skipif(not native_bf16_cpu(), reason="bf16 is emulated on this CPU (auto computes in fp32 here)")
@pytest.mark.skipif(native_bf16_cpu() and RECORDED_BF16 is None, reason=f"no bf16 record for this CPU's kernels ({FAMILY}) yet: make one here "
                    f"with `python tests/record_step.py bf16` ({BF16_RECORD.name})")
@pytest.mark.parametrize("name,method,config,over", BF16_RUNS[1:3], ids=[r[0] for r in BF16_RUNS[1:3]])
def test_bf16_training_gives_its_recorded_numbers(tmp_path, name, method, config, over):
    """bf16 against the record of this CPU's kernel family (flags in the file). Tolerance, wider than
    float32's: metrics within 2% (or 2e-3), update norms within 3%, at most 10% of an update vector differing. bf16
    keeps 8 bits of mantissa, so another CPU's bf16 kernels (AMX against AVX-512 BF16, another summation order)
    round differently: each family has its own record; within one machine the numbers repeat exactly. Two runs: the
    tiny CORY and the embedded PPO (the embedded CORY costs a minute more and runs the same passes)."""
    assert kernel_family(RECORDED_BF16["cpu_flags"]) == FAMILY
    want, got = RECORDED_BF16["runs"][name], record_run(method, config, over, tmp_path / name)
    same_numbers(name, got, want, rel=2e-2, abs_=2e-3, norm=3e-2, share=0.10)


def same_numbers(name, got, want, *, rel, abs_, norm, share):
    assert len(got["rows"]) == len(want["rows"])
    for a, b in zip(got["rows"], want["rows"]):
        # CORY's knowledge-transfer readings came after the record (issue 59): they are read from the row's own task
        # rewards, so they are checked against those; every recorded key is compared as before
        new = a.keys() - b.keys()
        later = set(TRANSFER_KEYS) | EXPLAINED_VARIANCE | APPROX_KL | CLIP_FRACTION | SHARES
        assert new <= later and b.keys() <= a.keys(), (name, new, b.keys() - a.keys())
        for key in new & EXPLAINED_VARIANCE:
            assert a[key] <= 1.0, (name, a["step"], key)  # NaN fails too
        for key in new & APPROX_KL:
            assert a[key] >= 0.0, (name, a["step"], key)
        for key in new & (CLIP_FRACTION | SHARES):
            assert 0.0 <= a[key] <= 1.0, (name, a["step"], key)
        if TRANSFER_KEYS[0] in new:
            observer = next(agent for agent in ("llm1", "llm2") if agent != a["pioneer"])
            assert a[TRANSFER_KEYS[0]] == pytest.approx(a[f"{observer}/task_reward"] - a[f"{a['pioneer']}/task_reward"])
        for key in b:
            if isinstance(b[key], float):
                assert a[key] == pytest.approx(b[key], rel=rel, abs=abs_), (name, a["step"], key)
            else:
                assert a[key] == b[key], (name, a["step"], key)
    # Adam's first steps are close to lr x sign(gradient), so a float-rounding change in a gradient that is a sum of
    # cancelling terms flips that weight's whole update: a few percent of the update vector may differ (measured
    # at the rewrite: 2%, the pioneer's; the observer's updates equal to the bit). The projections estimate that
    # share: ||u' - u|| / ||u|| ~ rms(projection differences) / rms(projections).
    assert got["models"].keys() == want["models"].keys()
    for agent, w in want["models"].items():
        g = got["models"][agent]
        assert g["update_norm"] == pytest.approx(w["update_norm"], rel=norm), (name, agent)
        rms = np.sqrt(np.mean(np.square(w["projections"])))
        diff = np.sqrt(np.mean(np.square(np.subtract(g["projections"], w["projections"]))))
        assert diff <= share * rms, (name, agent, diff / rms)


def test_each_kernel_family_has_its_own_bf16_record():
    assert kernel_family(["avx2", "avx512f", "avx512_bf16"]) == "avx512_bf16"
    assert kernel_family(["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]) == "amx"
    assert kernel_family(["avx2", "avx512f", "avx512_bf16", "avx512_fp16"]) == "avx512_fp16"
    assert kernel_family(["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"]) == "amx"
    assert kernel_family(["avx2"]) == "emulated"
    assert bf16_record_path("avx512_bf16").name == "step_record_bf16.json"
    assert bf16_record_path("amx").name == "step_record_bf16_amx.json"
    assert bf16_record_path("avx512_fp16").name == "step_record_bf16_avx512_fp16.json"
    # the committed record is AVX-512 BF16's, and says so by its flags
    recorded = json.loads(bf16_record_path("avx512_bf16").read_text())
    assert kernel_family(recorded["cpu_flags"]) == "avx512_bf16"
