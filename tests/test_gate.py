"""The over-optimisation gate's reader (lab.gate): a seed learned and degraded exactly as design.yaml states it, a rung
passes only when every seed did both, the ladder is read upwards and stops at the first pass, an unfinished seed
leaves its rung undecided, and the design's mistakes are one line that writes nothing."""
import json
import shutil

import pytest
import yaml

from conftest import REPO
from entry_points import lab, refused, succeeded, tree
from lab.gate import build_gate, noise_probability, rate_text, read_design

HORIZON = REPO / "results" / "arithmetic_cpu_horizon"
GATE = REPO / "results" / "arithmetic_cpu_overopt_gate"
RISE_AND_FALL = [0.265, 0.40, 0.50, 0.48, 0.45, 0.42, 0.38]    # best 0.50 at 10, fall 0.12 by 30
RISE_AND_STAY = [0.265, 0.40, 0.50, 0.48, 0.47, 0.46, 0.45]    # fall 0.05
NEVER_LEARNS = [0.265, 0.30, 0.33, 0.36, 0.30, 0.28, 0.20]     # best 0.36 < 0.371, fall 0.16


def write_rung(root, rate, paths, precision="bf16"):
    """A rung folder of the runner from the horizon's PPO runs, each seed's held-out path replaced by ``paths``."""
    rung = root / f"lr{rate_text(rate)}"
    for seed, accuracies in paths.items():
        src, dst = HORIZON / "runs" / "ppo" / f"seed_{seed}", rung / "runs" / "ppo" / f"seed_{seed}"
        shutil.copytree(src, dst)
        config = yaml.safe_load((dst / "config.yaml").read_text())
        config.update(learning_rate=rate, precision=precision)
        (dst / "config.yaml").write_text(yaml.safe_dump(config))
        rows = [{"iterations": 5 * i, "agent": "policy", "task_reward": a, "kl": 1.5 * i, "n_prompts": 200}
                for i, a in enumerate(accuracies)]
        (dst / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rung


@pytest.fixture
def gate(tmp_path):
    root = tmp_path / "gate"
    root.mkdir()
    shutil.copy(GATE / "design.yaml", root / "design.yaml")
    return root


def test_the_committed_design_reads_as_its_designmd_states_it():
    d = read_design(GATE)
    assert d.learning_rates == (3e-5, 1e-4, 3e-4) and d.seeds == (0, 1) and d.steps == 30
    assert d.precision == "bf16" and d.bar == pytest.approx(0.371) and d.fall == 0.10


def test_a_rung_passes_only_when_both_seeds_learn_and_fall(gate):
    write_rung(gate, 3e-5, {0: RISE_AND_FALL, 1: RISE_AND_STAY})
    write_rung(gate, 1e-4, {0: RISE_AND_FALL, 1: RISE_AND_FALL})
    text = build_gate(gate).read_text()
    assert "Ladder: 3e-5 (fails), 1e-4 (passes), 3e-4 (not run)" in text
    assert "**Rung lr1e-4 passes**" in text and "learning rate 1e-4" in text
    assert "| lr3e-5 | 1 | 0.265 | 0.5 (10) | 0.45 (30) | 0.05 | 9 | **yes** | no |" in text
    assert "| lr1e-4 | 0 | 0.265 | 0.5 (10) | 0.38 (30) | 0.12 | 9 | **yes** | **yes** |" in text
    assert (gate / "fig_gate.png").is_file() and "## Notes" not in text


def test_a_seed_that_never_learned_fails_its_rung_however_far_it_falls(gate):
    write_rung(gate, 3e-5, {0: NEVER_LEARNS, 1: RISE_AND_FALL})
    text = build_gate(gate).read_text()
    assert "3e-5 (fails)" in text and "**Not decided yet**: rung lr1e-4 is not run (the rungs below it failed)" in text


def test_no_rung_passed_is_the_answer_once_the_whole_ladder_failed(gate):
    for rate in (3e-5, 1e-4, 3e-4):
        write_rung(gate, rate, {0: RISE_AND_STAY, 1: RISE_AND_FALL})
    text = build_gate(gate).read_text()
    assert ("**No rung passed**: PPO does not over-optimise this task up to learning rate 3e-4 in 30 iterations: "
            "the paper's robustness claim cannot be tested here.") in text


def test_an_unfinished_seed_leaves_its_rung_undecided_and_a_rung_run_out_of_turn_is_named(gate):
    write_rung(gate, 3e-5, {0: RISE_AND_FALL, 1: RISE_AND_FALL[:5]})  # seed 1 cut off after iteration 20
    write_rung(gate, 1e-4, {0: RISE_AND_FALL, 1: RISE_AND_FALL}, precision="fp32")
    text = build_gate(gate).read_text()
    assert "**Not decided yet**: rung lr3e-5 is not decided." in text and "ran to 20 of 30" in text
    assert "`lr1e-4` ran although `lr3e-5` is not decided" in text
    assert "`lr1e-4/seed_0`: precision fp32, where the design fixes bf16." in text


def test_the_noise_figure_is_the_chance_a_flat_path_falls_as_far():
    # two evaluations of one question at p = 0.5: the best minus the last is 1 only for (right, wrong)
    assert noise_probability(0.5, 2, 1, 1.0) == pytest.approx(0.25, abs=0.005)
    assert noise_probability(0.45, 7, 200, 0.10) == pytest.approx(0.103, abs=0.005)  # DESIGN.md's figure


def test_the_gate_rebuilds_the_same_and_leaves_the_runs_alone(gate):
    write_rung(gate, 3e-5, {0: RISE_AND_FALL, 1: RISE_AND_STAY})
    runs = tree(gate / "lr3e-5")
    succeeded(lab("gate", gate))
    first = (gate / "GATE.md").read_text()
    succeeded(lab("gate", gate))
    assert (gate / "GATE.md").read_text() == first and tree(gate / "lr3e-5") == runs


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(endpoint="reward_at_matched_kl"), "endpoint must be overopt_gate"),
    (lambda d: d.update(learning_rates=[1e-4, 3e-5]), "learning_rates [0.0001, 3e-05]: expected rising rates"),
    (lambda d: d.update(fall=float("nan")), "fall nan: expected a fall in (0, 1]"),
    (lambda d: d.update(seeds=[0, 0]), "expected each seed once"),
    (lambda d: d.update(margin=0.05), "unknown key(s) margin"),
    (lambda d: d.pop("steps"), "missing key(s) steps"),
])
def test_the_designs_mistakes_are_one_line_and_write_nothing(gate, edit, message):
    design = yaml.safe_load((gate / "design.yaml").read_text())
    edit(design)
    (gate / "design.yaml").write_text(yaml.safe_dump(design))
    before = tree(gate)
    refused(lab("gate", gate), message)
    assert tree(gate) == before


def test_the_gate_never_replaces_a_gate_md_it_did_not_write(gate):
    (gate / "GATE.md").write_text("my notes\n")
    before = tree(gate)
    refused(lab("gate", gate), "GATE.md: ", "was not written by `python -m lab.gate`")
    assert tree(gate) == before


def test_the_committed_gate_rebuilds_to_the_same_document(tmp_path):
    """GATE.md is what `python -m lab.gate` makes of the committed files alone (its command is its first line)."""
    copy = tmp_path / GATE.name
    shutil.copytree(GATE, copy)
    text = build_gate(copy).read_text()
    committed = (GATE / "GATE.md").read_text()
    assert text == committed.replace(f"lab.gate results/{GATE.name}`", f"lab.gate {copy.as_posix()}`")
