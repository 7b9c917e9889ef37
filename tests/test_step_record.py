"""Training gives the numbers recorded before the PPO step was rewritten (tests/data/step_record.json, written by
tests/record_step.py at the commit it names): the same metrics, and the same weight updates, up to float
rounding, on the tiny model and on the embedded SmolLM2 at batch 8."""
import json

import pytest

from record_step import RECORD, RUNS, record_run

RECORDED = json.loads(RECORD.read_text())


@pytest.mark.parametrize("name,method,config,over", RUNS, ids=[r[0] for r in RUNS])
def test_training_gives_the_recorded_numbers(tmp_path, name, method, config, over):
    want, got = RECORDED["runs"][name], record_run(method, config, over, tmp_path / name)
    assert len(got["rows"]) == len(want["rows"])
    for a, b in zip(got["rows"], want["rows"]):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(b[key], float):
                assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-4), (name, a["step"], key)
            else:
                assert a[key] == b[key], (name, a["step"], key)
    assert got["models"].keys() == want["models"].keys()
    for agent, w in want["models"].items():
        g = got["models"][agent]
        assert g["update_norm"] == pytest.approx(w["update_norm"], rel=1e-3), (name, agent)
        scale = max(abs(x) for x in w["projections"])
        for x, y in zip(g["projections"], w["projections"]):
            assert abs(x - y) <= 1e-2 * scale, (name, agent)
