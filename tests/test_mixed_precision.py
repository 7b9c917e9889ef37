"""A folder whose runs computed in different precisions says so: `precision: auto` picks per CPU, so a comparison
run over sessions on two machines can mix bf16 and fp32 without a word in its configs (the horizon comparison's PPO
seed 7 once did)."""
from lab.report import build_report
from lab.compute import compute_of, logged_precision
from lab.results import load_experiment
from test_report import synthetic

BF16 = "precision: bf16 (auto on a CPU with AVX-512 BF16 (no AMX), where bf16 was measured 1.24-1.48x faster)\n"
FP32 = "precision: fp32 (auto on a CPU without native bfloat16, where torch emulates it slower than float32)\n"


def write_logs(root, lines):
    for (label, seed), line in lines.items():
        log = root / "logs" / label / f"seed_{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("start ppo\n" + line + "done\n")


def test_a_folder_of_one_precision_has_no_note(tmp_path):
    synthetic(tmp_path, cory_wins=False)
    write_logs(tmp_path, {(m, s): FP32 for m in ("ppo", "cory") for s in (0, 1, 2)})
    assert compute_of(tmp_path, "ppo", 0) == "fp32, no native bf16"
    assert not [n for n in load_experiment(tmp_path).notes if "precisions" in n]


def test_mixed_precisions_are_named_in_the_report(tmp_path):
    synthetic(tmp_path, cory_wins=False)
    lines = {(m, s): FP32 for m in ("ppo", "cory") for s in (0, 1, 2)}
    lines["ppo", 2] = BF16
    write_logs(tmp_path, lines)
    (note,) = [n for n in load_experiment(tmp_path).notes if "precisions" in n]
    assert "fp32 in 5 runs; bf16 in ppo/seed_2" in note
    assert "different precisions" in build_report(tmp_path).read_text()


def test_runs_without_a_log_count_as_unknown_not_as_another_precision(tmp_path):
    synthetic(tmp_path, cory_wins=False)
    write_logs(tmp_path, {("ppo", 0): BF16})
    assert compute_of(tmp_path, "ppo", 1) == "?"
    assert not [n for n in load_experiment(tmp_path).notes if "precisions" in n]


def test_a_restarted_run_is_read_from_its_last_attempt(tmp_path):
    """The runner appends each attempt to one log; a run restarted from the beginning (another machine, its rows
    thrown away) computed in what its last attempt printed, not its first; a resume prints what its checkpoint
    kept."""
    synthetic(tmp_path, cory_wins=False)
    log = tmp_path / "logs" / "ppo" / "seed_0.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n==== 2026-01-01 first attempt\n" + BF16 + "Killed\n"
                   "\n==== 2026-01-02 restarted from the beginning\n" + FP32 + "done\n")
    assert logged_precision(log)[0] == "fp32" and compute_of(tmp_path, "ppo", 0) == "fp32, no native bf16"
    with open(log, "a") as f:
        f.write("\n==== 2026-01-03 resumed\nprecision: fp32 (auto, kept from the run's checkpoint: here auto would be "
                "bf16, auto on a CPU with AVX-512 BF16 (no AMX))\n")
    assert logged_precision(log)[0] == "fp32"
