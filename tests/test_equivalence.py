"""lab.equivalence: two folders' PPO held-out paths, paired by seed, inside or outside the seeds' noise band."""
import json

import numpy as np
import pytest

from lab.equivalence import build, main
from test_report import ppo_rows, write_run


def folder(root, precision, shift=0.0, seeds=range(4), rng=0):
    """PPO runs whose held-out paths share each seed's spread (the same for every folder) plus a little noise of
    the folder's own: two folders of one setting differ by much less than the seeds do."""
    seed_luck = np.random.default_rng(99).normal(0, 0.1, (max(seeds) + 1, 2))
    g = np.random.default_rng(rng)
    for s in seeds:
        d = write_run(root, "ppo", s, ppo_rows(np.zeros(9), np.zeros(9)), {"precision": precision}, heldout=None)
        evals = [{"iterations": it, "agent": "policy",
                  "task_reward": 0.1 + (0.05 * it + shift + seed_luck[s, 0] + g.normal(0, 0.01) if it else 0.0),
                  "kl": (1.0 * it + 10 * seed_luck[s, 1] + g.normal(0, 0.1)) if it else 0.0}
                 for it in range(0, 10, 3)]
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_same_setting_is_equivalent_and_a_shift_is_not(tmp_path):
    folder(tmp_path / "a", "fp32", rng=0)
    folder(tmp_path / "b", "bf16", rng=1)
    folder(tmp_path / "c", "bf16", shift=0.5, rng=1)
    text = build(str(tmp_path / "a"), str(tmp_path / "b"), 9).read_text()
    assert "**Equivalent within the seeds noise**" in text and "bf16 − fp32" in text
    assert (tmp_path / "a" / "fig_equivalence.png").read_bytes()[:4] == b"\x89PNG"
    text = build(str(tmp_path / "a"), str(tmp_path / "c"), 9).read_text()
    assert "**Not shown equivalent**" in text and "held-out reward at iteration 9" not in text.split("—")[0]


def test_mistakes_are_one_line(tmp_path, capsys):
    folder(tmp_path / "a", "fp32", seeds=[0])
    folder(tmp_path / "b", "bf16", seeds=[0])
    for argv, msg in (([str(tmp_path / "a"), str(tmp_path / "b")], "1 seed(s) evaluated in both folders"),
                      ([str(tmp_path / "a"), str(tmp_path / "nope")], "folder not found"),
                      ([str(tmp_path / "a"), str(tmp_path / "b"), "--upto", "x"], "invalid int value")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err
