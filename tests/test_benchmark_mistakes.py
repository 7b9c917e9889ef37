"""The benchmarks are user programs too (issue 48, item 4): a bad flag, an unknown model or an unwritable --json is one
line (exit 2) before any work, with nothing written; a child process's one-line error comes back as that line; and a
signal to a benchmark stops what it started and removes its temporary folder. Each through the real entry point
(``python benchmarks/X.py``), the files compared before and after."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO
from cory.run.outputs import MANIFEST, folder_id
from entry_points import refused, tree

sys.path.insert(0, str(REPO / "benchmarks"))

BENCH = REPO / "benchmarks"
# each benchmark with flags that would make it run, at its smallest (none of them gets that far here)
SMALLEST = {
    "iteration.py": ["--preset", "tiny", "--batch_size", "4", "--variants", "ppo", "--iterations", "1", "--warmup",
                     "0"],
    "levers.py": ["--preset", "tiny", "--batch_size", "4", "--repeats", "1"],
    "generation.py": ["--model", "tiny", "--batch_size", "2", "--new_tokens", "2", "--calls", "1"],
    "scaling.py": ["--quick", "--iterations", "1", "--warmup", "0"],
    "learned.py": ["--config", "configs/imdb/ppo_tiny.yaml", "--limit_min", "0.1"],
    "run_cost.py": ["--before", str(REPO), "--preset", "tiny", "--steps", "1", "--eval_every", "1"],
}


def bench(name: str, *args, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / name), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def tmpdir_env(tmp_path):
    """A TMPDIR of the test's own, to see what a benchmark leaves in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


def left_behind(tmpdir: Path) -> list[str]:
    """What is left in a TMPDIR but torch's own compile cache (``torchinductor_<user>``, made where cory.agent is
    imported, to be kept between runs like any cache): the benchmark's temporary folders, which must all be gone."""
    return sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_"))


def fake_run(folder: Path) -> Path:
    """A folder that holds a run, as ``cory.run.outputs`` recognises one (its manifest), with a final model folder."""
    (folder / "final" / "llm1").mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"project": "cory", "method": "ppo", "task": "imdb",
                                               "folder": folder_id(folder)}) + "\n")
    (folder / "config.yaml").write_text("steps: 2\n")
    return folder


@pytest.fixture
def read_only(tmp_path):
    """A folder no one may write in: a read-only one where the file system enforces it; for root (who writes in
    any folder whatever its mode) /proc/self, where no one creates files."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        yield folder if not os.access(folder, os.W_OK) else Path("/proc/self")
    finally:
        folder.chmod(0o755)


# ----------------------------------------------------------------------------- --json, before any work

@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_json_into_a_missing_folder_is_refused_before_any_work(name, tmp_path, tmpdir_env):
    before = tree(tmp_path)
    p = bench(name, *SMALLEST[name], "--json", tmp_path / "no" / "such" / "out.json", cwd=tmp_path,
              env={"TMPDIR": str(tmpdir_env)})
    refused(p, f"--json: folder {tmp_path / 'no' / 'such'} does not exist")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_json_into_a_read_only_folder_is_refused_before_any_work(name, tmp_path, tmpdir_env, read_only):
    before = tree(tmp_path)
    p = bench(name, *SMALLEST[name], "--json", read_only / "out.json", cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
    refused(p, f"--json: cannot write in {read_only} (permission denied)")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_json_inside_a_run_folder_is_refused(name, tmp_path, tmpdir_env):
    run = fake_run(tmp_path / "run")
    before = tree(tmp_path)
    for target in (run / "results.json", run / "final" / "llm1" / "results.json"):
        p = bench(name, *SMALLEST[name], "--json", target, cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
        refused(p, f"--json: {target} is inside the run folder {run}", "choose a file outside it")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", sorted(set(SMALLEST) - {"iteration.py"}))  # iteration.py: test_output_flags.py
def test_json_onto_a_users_file_is_refused_unless_forced(name, tmp_path, tmpdir_env):
    mine = tmp_path / "results.json"
    mine.write_text('{"mine": true}\n')
    before = tree(tmp_path)
    p = bench(name, *SMALLEST[name], "--json", mine, cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
    refused(p, f"--json: {mine} already exists and was not written by python benchmarks/{name}", "--force")
    assert tree(tmp_path) == before


def test_json_a_folder_is_refused(tmp_path):
    p = bench("levers.py", "--json", tmp_path, cwd=tmp_path)
    refused(p, f"--json: {tmp_path} is a folder; give a file name")


def test_a_file_the_benchmark_wrote_is_replaced_without_force(tmp_path):
    """Each benchmark's own earlier result (its "command" names it) is no user's file: taken without --force."""
    import generation
    import levers
    import scaling

    import run_cost

    for module, name in ((generation, "generation.py"), (levers, "levers.py"), (scaling, "scaling.py")):
        own = tmp_path / f"{name}.json"
        own.write_text(json.dumps({"command": f"python benchmarks/{name} --seed 1"}))
        assert module.parse(["--json", str(own)]).json == str(own)
    own = tmp_path / "run_cost.json"
    own.write_text(json.dumps({"command": "python benchmarks/run_cost.py --before /tmp/x"}))
    assert run_cost.parse(["--before", str(REPO), "--json", str(own)]).json == str(own)


@pytest.mark.parametrize("args,says", [
    (["--pairs", "0"], "--pairs: must be >= 1, got 0"),
    (["--problems", "-1"], "--problems: must be >= 0"),
    (["--cpu", "4096"], "--cpu: no core 4096 here"),
    (["--before", "/nonexistent/tree"], "--before: /nonexistent/tree is not a checkout of this project"),
    (["--json", None], "--json: required"),
])
def test_run_costs_mistakes_are_one_line_before_any_run(args, says, tmp_path, tmpdir_env):
    flags = {**dict(zip(SMALLEST["run_cost.py"][::2], SMALLEST["run_cost.py"][1::2])),
             "--json": str(tmp_path / "out.json"), **dict(zip(args[::2], args[1::2]))}
    before = tree(tmp_path)
    p = bench("run_cost.py", *[x for k, v in flags.items() if v is not None for x in (k, v)], cwd=tmp_path,
              env={"TMPDIR": str(tmpdir_env)})
    refused(p, says)
    assert tree(tmp_path) == before and left_behind(tmpdir_env) == []


def test_learned_replaces_its_own_result_of_before_it_named_itself(tmp_path):
    """benchmarks/data/learned_ppo_cpu_2cores.json recorded the training command only: still the benchmark's own."""
    import learned

    old = tmp_path / "learned.json"
    old.write_text((REPO / "benchmarks" / "data" / "learned_ppo_cpu_2cores.json").read_text())
    assert learned.is_learned_result(old)
    assert not learned.is_learned_result(REPO / "benchmarks" / "data" / "cpu_bf16_quiet_fp32.json")


# ----------------------------------------------------------------------------- flags and models, before any work

def test_iteration_refuses_a_mini_batch_that_does_not_divide_the_batch_before_any_worker(tmp_path, tmpdir_env):
    before = tree(tmp_path)
    p = bench("iteration.py", "--preset", "tiny", "--batch_size", "4", "--mini_batch_size", "3", "--variants", "ppo",
              cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
    line = refused(p, "--batch_size: 4 is not divisible by mini_batch_size * gradient_accumulation_steps = 3 * 1")
    assert "running" not in p.stderr and "Traceback" not in p.stderr, line
    assert tree(tmp_path) == before


@pytest.mark.parametrize("value", ["0", "-2"])
def test_iteration_dry_run_refuses_a_mini_batch_that_is_not_positive(tmp_path, tmpdir_env, value):
    """Issue 75: --mini_batch_size 0 was taken as "the whole batch" under --dry_run; the config's check says it."""
    p = bench("iteration.py", "--preset", "tiny", "--dry_run", "--mini_batch_size", value, "--variants", "ppo",
              cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
    refused(p, f"--mini_batch_size: must be > 0, got {value}")


@pytest.mark.parametrize("name,model,says", [
    ("iteration.py", "gpt2-large", "--model: model 'gpt2-large' is not in the local Hugging Face cache"),
    ("iteration.py", "/no/such/dir", "--model: '/no/such/dir' is not a model spec; allowed: "),
    ("generation.py", "/no/such/dir", "--model: '/no/such/dir' is not a model spec; allowed: "),
    ("generation.py", "gpt2-large", "--model: model 'gpt2-large' is not in the local Hugging Face cache"),
])
def test_an_unknown_model_is_one_line_before_any_work(name, model, says, tmp_path, tmpdir_env):
    """Offline (the tests' HF_HUB_OFFLINE=1; the iteration benchmark's workers always are), a hub model that is not
    cached cannot load: said at once, with the stand-ins that can."""
    from cory.assets import local_snapshot

    if "/" not in model and local_snapshot(model) is not None:
        pytest.skip(f"{model} is in this machine's Hugging Face cache")
    before = tree(tmp_path)
    p = bench(name, *SMALLEST[name], "--model", model, cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
    line = refused(p, says)
    if "gpt2-large" in model:
        assert "random:gpt2-large" in line
    assert "running" not in p.stderr
    assert tree(tmp_path) == before


def test_scaling_refuses_zero_iterations_before_starting_any_run(tmp_path, tmpdir_env):
    before = tree(tmp_path)
    p = bench("scaling.py", "--quick", "--iterations", "0", cwd=tmp_path, env={"TMPDIR": str(tmpdir_env)})
    refused(p, "--iterations: must be >= 1, got 0")
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_a_childs_one_line_error_comes_back_as_that_line(tmp_path, tmpdir_env):
    """A mistake only the iteration benchmark's worker meets (a model cache that cannot be written: CORY_CACHE
    through a file) is its one line, passed on by iteration.py and again by scaling.py, with its status; no
    temporary file is left."""
    (tmp_path / "a_file").write_text("")
    env = {"TMPDIR": str(tmpdir_env), "CORY_CACHE": str(tmp_path / "a_file" / "cache")}
    expected = f"error: cache: cannot write the model cache {tmp_path / 'a_file' / 'cache'} (Not a directory)"
    p = bench("iteration.py", *SMALLEST["iteration.py"], cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(expected), p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    p = bench("scaling.py", *SMALLEST["scaling.py"], cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(expected), p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert left_behind(tmpdir_env) == []


# ----------------------------------------------------------------------------- signals

FAKE_TRAINING = textwrap.dedent("""
    import argparse, os, pathlib, time
    p = argparse.ArgumentParser()
    p.add_argument("--config"); p.add_argument("--output_dir")
    a = p.parse_args()
    pathlib.Path(a.output_dir).mkdir()
    pathlib.Path(a.config).with_name("pid").write_text(str(os.getpid()))
    time.sleep(300)  # a run that would go on
""")


def start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, /proc's stat field 22): with the pid, names one process even
    after the pid is reused; None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def gone(pid: int, started: str | None = None) -> bool:
    """No process ``pid`` (a zombie is one: it has ended), or one started at another time than ``started`` (the pid
    reused: this machine's pid_max is 32768, and the tests beside start many processes)."""
    try:
        if "zombie" in Path(f"/proc/{pid}/status").read_text().lower():
            return True
    except FileNotFoundError:
        return True
    return started is not None and start_time(pid) not in (started, None)


def all_gone(processes: list[tuple[int, str | None]], within: float = 30) -> bool:
    """Whether every (pid, start time) is gone, allowing a process already sent SIGKILL the moments the kernel takes
    to tear it down (a loaded machine stretches them)."""
    deadline = time.monotonic() + within
    while not all(gone(pid, started) for pid, started in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_until(condition, proc, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_learned_stops_its_run_and_removes_its_folder(signum, tmp_path, tmpdir_env):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAINING)
    out = tmp_path / "result.json"
    proc = subprocess.Popen([sys.executable, str(BENCH / "learned.py"), "--script", str(script), "--config",
                             str(tmp_path / "cfg.yaml"), "--json", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmpdir_env)})
    try:
        wait_until(lambda: (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text(), proc)
        [folder] = tmpdir_env.iterdir()
        assert folder.name.startswith("cory_learned_") and (folder / "run").is_dir()
        child = int((tmp_path / "pid").read_text())
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines() == [f"stopped by {name}: the training run it started was stopped and its "
                                        "temporary folder removed; nothing written"]
    assert gone(child)
    assert list(tmpdir_env.iterdir()) == [] and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["iteration.py", "scaling.py"])
def test_sigterm_to_a_benchmark_stops_its_children_and_removes_its_folder(name, tmp_path, tmpdir_env):
    """iteration.py's worker (and, for scaling.py, the iteration.py it runs and that one's worker) is stopped, and
    every temporary folder they made is gone."""
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, str(BENCH / name), *SMALLEST[name]], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "TMPDIR": str(tmpdir_env)})
    try:
        depth = 1 if name == "iteration.py" else 2  # the worker: a child, or a grandchild

        def descendants() -> list[int]:
            found, level = [], [proc.pid]
            for _ in range(depth):
                level = [c for p in level for c in children(p)]
                found += level
            return found
        wait_until(lambda: len(descendants()) == depth, proc)
        started = [(pid, start_time(pid)) for pid in descendants()]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, log.read_text()[-2000:]
    assert log.read_text().strip().splitlines()[-1].startswith("stopped by SIGTERM: ")
    assert all_gone(started), [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:200]) for pid, t in started
                               if not gone(pid, t)]
    assert left_behind(tmpdir_env) == []


def test_a_signal_whose_stop_a_library_wrapped_in_its_own_error_still_stops():
    """torch.compile catches the Stopped a signal raises inside its compile step and raises BackendCompilerFailed;
    the benchmark must still see the stop (one line, exit 128 + signal), not a traceback."""
    from harness import Stopped, stopped_by_signals

    with pytest.raises(Stopped) as e:
        with stopped_by_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            except Stopped as inner:
                raise RuntimeError("backend='inductor' raised: Stopped") from inner
    assert e.value.exit_status == 128 + signal.SIGTERM and str(e.value) == "stopped by SIGTERM"
    with pytest.raises(ValueError):  # without a signal, an error is what it is
        with stopped_by_signals():
            raise ValueError("a real error")
