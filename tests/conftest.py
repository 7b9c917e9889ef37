"""Tests never reach the network: the hub is declared offline for every test process."""
import contextlib
import copy
import fcntl
import importlib
import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# make test runs pytest-xdist workers side by side: each computes on its share of the cores (torch would start one
# thread per core in every worker, and the training scripts they start, and the threads would wait on each other)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))

REPO = Path(__file__).resolve().parent.parent
# the training scripts' folders are packages beside `cory` (imdb_train.ppo, ...): importable from the root
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
GSM8K_DIR = Path(os.environ.get("CORY_GSM8K_DIR", REPO.parent / "shared" / "data" / "gsm8k"))


@pytest.fixture(autouse=True)
def _fp32_matmuls_between_tests():
    """A run in the test process switches TF32 on (``precision: tf32``, or ``auto`` on CUDA), a process-wide flag: put
    it back, so that on a GPU machine a later test's tolerances are not met or missed by the order tests ran in
    (on a CPU the flag does nothing)."""
    import torch

    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def script_hyperparameters(task: str, method: str):
    """The ``Hyperparameters`` of ``<task>_train/<method>.py``: the task's paper values, as a user edits them."""
    return importlib.import_module(f"{task}_train.{method}").Hyperparameters


# the scripts' classes, for tests that build a config from a preset (presets list only what they change)
IMDB_PPO, IMDB_CORY = script_hyperparameters("imdb", "ppo"), script_hyperparameters("imdb", "cory")
GSM8K_PPO, GSM8K_CORY = script_hyperparameters("gsm8k", "ppo"), script_hyperparameters("gsm8k", "cory")


@pytest.fixture
def repo() -> Path:
    return REPO


def run_script(script: str, *args: str, timeout: int = 900, cwd: Path = REPO, env: dict | None = None):
    """A training script as a user runs it (a fresh process), returning the CompletedProcess; ``env``: variables
    set for it on top of this process's."""
    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=None if env is None else {**os.environ, **env})


def trained(script: str, out: Path, *args) -> list[dict]:
    """Run a training script into ``out`` (it must succeed) and return its metrics rows, each checked for the
    paper's r_c = task reward - eta * KL of every agent it logs."""
    import pytest as _pytest

    from cory.run.outputs import read_jsonl

    p = run_script(script, *args, "--output_dir", out)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    for r in rows:
        for agent in {k.split("/")[0] for k in r if k.endswith("/combined_reward")}:
            assert r[f"{agent}/combined_reward"] == _pytest.approx(
                r[f"{agent}/task_reward"] - r[f"{agent}/kl_coef"] * r[f"{agent}/kl"]), (r["step"], agent)
    return rows


def start_script(script: str, *args):
    """A training script started as a user would, left running (a Popen with its output captured)."""
    return subprocess.Popen([sys.executable, str(REPO / script), *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_rows(proc, metrics: Path, n: int, timeout: int = 600) -> None:
    """Until the running ``proc`` has logged ``n`` metrics rows (it must still be running then)."""
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"


@pytest.fixture(scope="module")
def ppo_batch():
    """(tokenizer, reference, policy, queries, responses): the tiny model moved away from its reference (so the
    KL terms are not zero) and four fixed query/response pairs of different lengths, for single PPO steps."""
    import torch

    from cory import models

    from cory.assets import locate

    torch.manual_seed(0)
    tok = models.load_tokenizer(locate("tiny"))
    reference = models.load_reference(locate("tiny"))
    policy = models.load_policy(locate("tiny"))
    with torch.no_grad():
        for p in policy.pretrained_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    texts = [("The film was", " very good indeed and I"), ("I did not", " like it"),
             ("A long and winding opening that goes on", " and on"), ("Bad", " acting, worse plot, but fine music")]
    queries = [torch.tensor(tok(q)["input_ids"]) for q, _ in texts]
    responses = [torch.tensor(tok(r)["input_ids"]) for _, r in texts]
    return tok, reference, policy, queries, responses


@pytest.fixture(scope="module")
def ppo_step(ppo_batch):
    """``ppo_step(tmp_path, cls=Agent, **config) -> (agent, stats, weights)``: one PPO step of a fresh agent of
    class ``cls`` on ``ppo_batch`` (tiny model, batch 4, 2 epochs, lr 1e-3, eta 0.2 unless ``config`` says
    otherwise), with numpy's mini-batch shuffling seeded; ``weights`` is every parameter, flattened."""
    import numpy as np
    import torch

    from cory.agent import Agent
    from cory.config import build

    tok, reference, policy, queries, responses = ppo_batch

    def step(tmp_path, cls=Agent, batch=None, **over):
        """``batch``: (queries, responses) in place of the fixture's."""
        cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": 4, "mini_batch_size": 4,
                              "ppo_epochs": 2, "init_kl_coef": 0.2, "learning_rate": 1e-3, "precision": "fp32",
                              "output_dir": str(tmp_path), **over})
        agent = cls("policy", cfg, copy.deepcopy(policy), reference, tok)
        np.random.seed(0)  # trl shuffles mini-batches with numpy
        stats = agent.step(*(batch or (queries, responses)), [1.0, -0.5, 0.25, 2.0])
        return agent, stats, torch.cat([p.detach().flatten() for p in agent.policy.parameters()])
    return step


# ----------------------------------------------------------------------------- the training scripts' user mistakes

class Loaded(Exception):
    pass


def _tripwire(*args, **kwargs):
    raise Loaded


def rejected(task, method, argv, *, tripwire=True) -> str:
    """Run a training script's main in-process; it must exit 2 with one line, before any model loads."""
    from cory import models
    from cory.cli import main

    err, out = io.StringIO(), io.StringIO()
    cls = script_hyperparameters(task, method)
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        if tripwire:
            mp.setattr(models, "load_tokenizer", _tripwire)
        try:
            main(cls, [str(a) for a in argv])
        except SystemExit as e:
            code = e.code
        except Loaded:
            pytest.fail(f"accepted, went on to load a model: {argv}")
        else:
            pytest.fail(f"accepted: {argv}")
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err.getvalue()[-2000:])
    assert "Traceback" not in err.getvalue()
    return lines[0]


TINY = ["--config", "configs/imdb/ppo_tiny.yaml"]


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished tiny PPO run and a finished tiny CORY run (2 iterations, a checkpoint each); tests that change
    one copy it first. Under pytest-xdist the workers share one pair, made by whichever asks first (the others
    wait on a lock): the runs take a minute."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _train_finished(tmp_path_factory.mktemp("finished"))
    root = tmp_path_factory.getbasetemp().parent / "finished"  # the folder above the workers' own, this run's
    with open(root.with_name("finished.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root.with_name("finished.done")
        if not done.is_file():
            shutil.rmtree(root, ignore_errors=True)  # a worker that failed midway left a part
            _train_finished(root)
            done.touch()
    return root


def _train_finished(root: Path) -> Path:
    for method in ("ppo", "cory"):
        p = run_script(f"imdb_train/{method}.py", "--config", f"configs/imdb/{method}_tiny.yaml", "--steps", "2",
                       "--output_dir", root / method)
        assert p.returncode == 0, p.stderr[-2000:]
    return root


def one_line(p, status: int) -> str:
    """A command's process ``p`` exited ``status`` with an "error: " line last on stderr and no traceback; that line."""
    lines = [ln for ln in re.split(r"[\r\n]", p.stderr) if ln.strip()]  # a progress bar's line ends in \r
    assert p.returncode == status and lines and lines[-1].startswith("error: "), (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return lines[-1]
