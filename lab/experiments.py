"""Run the paper's comparisons: every (method, seed[, KL coefficient]) as a training run, then the report.

    python -m lab.experiments --task imdb --preset cpu --methods ppo,cory,cory_no_kt,cory_no_swap \\
        --seeds 0,1,2 --steps 60 --out results/imdb_cpu [--kl_coefs 0.01,0.1,0.3] [--set field=value ...]

Methods: ``ppo`` and ``cory`` (the comparison); the paper's ablations ``cory_no_kt`` (no knowledge transfer),
``cory_no_swap`` (no role exchange) and ``ppo_2x`` (PPO on a model about twice the size); and two confounds,
the ways the authors' runs differ from a like-for-like comparison:

* ``ppo_norm``: PPO with ``--score_norm true``. The authors normalise CORY's scores but not PPO's (so do the
  IMDB CORY presets here), so CORY vs ``ppo_norm`` compares the two with the same score normalisation.
* ``cory_norm``: CORY with ``--score_norm true``, as the authors run it. Normalising by the running sd of
  r1 + r2 roughly doubles CORY's KL coefficient relative to its reward, so the cpu presets run both methods
  without it and this variant shows how much of CORY's "lower KL" the normaliser alone makes.
* ``cory_authors``: CORY with ``--reset_on_swap true --init_kl_coef 0.4``, as the authors' released code runs
  it: its role exchange reloads both models into fresh trainers, which resets Adam, the adaptive KL controller
  and the score statistics, and its KL coefficient starts from 0.4 (the paper's Table 1 says 0.3). The method
  sets init_kl_coef itself, so in a ``--kl_coefs`` sweep every one of its folders runs at 0.4 (a method's own
  flags come last and win).

Each run is a fresh process of the real training script (``<task>_train/{ppo,cory}.py``, or for a task in one
file, ``--task_file FILE``: ``FILE ppo|cory`` as docs/adding_a_task.md writes it) with the preset
``configs/<task>/<ppo|cory>_<preset>.yaml`` (a task file: none, its own values) and writes
``OUT/runs/<method>[_kl<eta>]/seed_<s>/``. The runner reads each run's config from the script itself
(``--print_config``: resolved and checked exactly as the run will be), before anything is written. Running
the same command again skips finished runs and resumes cut-off ones, so a long experiment can be stopped
(Ctrl-C lets the current run save a checkpoint) and continued. Each run's command, wall time and exit
status go to ``OUT/runs.json``, its output to ``OUT/logs/``; at the end ``lab.report`` writes the figures
and ``OUT/REPORT.md``.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from cory.errors import ConfigError
from cory.device.memory import cpu_info
from cory.run.outputs import RunLock, in_use
from lab import heldout_runs
from lab.errors import ExperimentError, ReportError, exit_on_error
from lab.experiment_plan import build_parser, plan
from lab.report import build_report
from lab.runs import (REPO, Children, Pair, Progress, Record, cut_off_elsewhere, execute, git_state, lost_by,
                      mismatch, now, pair_state, rel, set_aside)


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    pairs, spec = plan(args)
    out: Path = spec["out"]
    # a refusal comes before the lock, so that a refused command leaves nothing behind; _run checks again once
    # no other runner can change the folder
    busy = in_use(out, "--out", "experiment runner") if out.is_dir() else None
    if busy:
        raise ExperimentError(busy)
    _check_experiment_folder(args, spec, out)
    _states(pairs, args.restart_cut_off)
    try:  # one runner per experiment folder (its runs.json); each run locks its own folder too
        lock = RunLock(out, "--out", "experiment runner").acquire()
    except ConfigError as e:
        raise ExperimentError(str(e)) from None
    try:
        return _run(args, argv, pairs, spec, out)
    finally:
        lock.release()


GPU_SHARE_ENV = "CORY_CUDA_SHARE"  # cory.device.budget.SHARE_ENV, named here so the runner need not import torch


def child_env(environ, jobs: int) -> dict:
    """The runs' environment: parallel runs share the cores (instead of each starting one thread per core) and the
    GPU (each budgets its passes within its share, ``cory.device.budget.cuda_share``; 0.9 of the card in all, since
    every process's CUDA context and allocator slack lie outside what it budgets). A setting the user made wins. A
    relative CORY_CACHE is made absolute from where the runner was started: the runs start in the repository."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    if env.get("CORY_CACHE"):
        env["CORY_CACHE"] = os.path.abspath(os.path.expanduser(env["CORY_CACHE"]))
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
        env.setdefault(GPU_SHARE_ENV, f"{0.9 / jobs:.4f}")
    return env


def _run(args, argv, pairs: list[Pair], spec: dict, out: Path) -> int:
    """Check every run's folder, record the invocation, train what is not finished, evaluate, report."""
    from tqdm.auto import tqdm

    _check_experiment_folder(args, spec, out)
    states = _states(pairs, args.restart_cut_off)
    again = [pair for pair in pairs if states[pair.key][0] == "again"]
    if again:
        print(f"set aside {len(again)} run(s) cut off elsewhere: {rel(set_aside(again, out))}")
        states = _states(pairs)
    record = Record(out, spec)
    invocation = _record_invocation(record, argv)
    todo = []
    for pair in pairs:
        state, why = states[pair.key]
        if state == "finished":
            invocation["skipped"] += 1
            record.run(pair)["status"] = "finished"
            tqdm.write(f"skip   {pair.key}: {why}")
        else:
            todo.append((pair, state, why))
    record.save()
    env = child_env(os.environ, min(spec["jobs"], max(1, len(todo))))  # the runs at once: jobs, or fewer left to do

    children = Children()
    failed = _train(todo, len(pairs), spec, record, invocation, out, env, children)
    if children.stopped_by is not None:
        print(f"interrupted: rerun the same command to continue (records in {rel(record.path)})", file=sys.stderr)
        return 128 + children.stopped_by
    failed += _evaluate(args, pairs, spec, out, env, children)
    if children.stopped_by is not None:
        print("interrupted: rerun the same command to finish the evaluations", file=sys.stderr)
        return 128 + children.stopped_by
    if not args.no_report:
        try:
            print(f"report: {rel(build_report(out))}")
        except ReportError as e:
            print(f"error: report: {e}", file=sys.stderr)
            return 1
    if failed:
        runs = [k for k in failed if not k.startswith("eval ")]
        what = [f"{len(runs)} of {len(pairs)} run(s) failed"] if runs else []
        what += [f"{len(failed) - len(runs)} evaluation(s) failed"] if len(failed) > len(runs) else []
        print(f"{' and '.join(what)}: {', '.join(failed)} (see {rel(out / 'logs')})", file=sys.stderr)
        return 1
    return 0


def _check_experiment_folder(args, spec: dict, out: Path) -> None:
    """``--out`` holds no other task's or preset's experiment, nor one whose runs were made with other ``--set``
    values (runs.json's), and no training run of its own."""
    try:
        prior = json.loads((out / "runs.json").read_text(encoding="utf-8")) if (out / "runs.json").is_file() else {}
    except ValueError:  # not JSON, or not UTF-8
        raise ExperimentError(f"--out: {rel(out / 'runs.json')} is not valid UTF-8 JSON; fix or remove it") from None
    if not isinstance(prior, dict):
        raise ExperimentError(f"--out: {rel(out / 'runs.json')} holds a JSON {type(prior).__name__}, not the runner's "
                              "record of its runs; fix or remove it")
    for key in ("task", "preset"):
        if prior.get(key) not in (None, spec[key]):
            raise ExperimentError(f"--out: {args.out} holds the {prior.get('task')}/{prior.get('preset')} "
                                  f"experiment; use another folder for {spec['task']}/{spec['preset']}")
    # one folder, one experiment: a method run under other --set values would be compared as if it were not
    recorded = prior.get("set") if prior.get("runs") else None
    if isinstance(recorded, dict) and recorded != spec["set"]:
        key = sorted(k for k in {*recorded, *spec["set"]} if recorded.get(k) != spec["set"].get(k))[0]
        said = (lambda v: "not set" if v is None else repr(f"{key}={v}"))
        raise ExperimentError(f"--set {key}: this command has it {said(spec['set'].get(key))}, but the runs in "
                              f"{rel(out / 'runs.json')} were made with it {said(recorded.get(key))}; a folder holds "
                              "one experiment's settings: give the same --set, or use a new --out folder")


def _states(pairs: list[Pair], restart_cut_off: bool = False) -> dict[str, tuple[str, str]]:
    """Each run's state (``pair_state``); a folder holding a run made otherwise (other settings, or more
    iterations than --steps), or what rerunning or continuing it would delete, is refused before anything is
    written: a runner never replaces or shortens a run, nor deletes a result. With ``restart_cut_off``, a run
    cut off elsewhere (``cut_off_elsewhere``) is "again": to be set aside, then started anew."""
    states = {}
    for pair in pairs:
        state, why = pair_state(pair)
        if state != "new":
            bad = mismatch(pair)
            if bad:
                raise ExperimentError(f"{rel(pair.run_dir)} holds a run with {bad}; use another --out or move that "
                                      "folder away")
        if restart_cut_off and cut_off_elsewhere(pair, state):
            states[pair.key] = ("again", "cut off elsewhere, set aside")
            continue
        refusal = lost_by(pair, state)
        if refusal:
            raise ExperimentError(refusal)
        states[pair.key] = (state, why)
    return states


def _record_invocation(record: Record, argv) -> dict:
    commit, dirty = git_state()
    invocation = {"command": shlex.join(["python", "-m", "lab.experiments",
                                          *(sys.argv[1:] if argv is None else argv)]),
                  "started": now(), "git_commit": commit, "git_dirty": dirty, "python": sys.version.split()[0],
                  # the machine beside the runs' wall times: which CPU kind (AVX2, AVX-512 BF16, AMX) they were taken on
                  "cpu": {k: v for k, v in cpu_info().items() if k != "load"},
                  "ran": 0, "skipped": 0, "failed": 0}
    record.data["invocations"].append(invocation)
    record.save()
    return invocation


def _train(todo: list, total: int, spec: dict, record: Record, invocation: dict, out: Path, env: dict,
           children: Children) -> list[str]:
    """The training runs still to do, ``jobs`` at a time; a stop signal is passed on to the running ones, which
    save a checkpoint (``children.stopped_by`` says so afterwards). Returns the keys of the runs that failed."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=total - len(todo), desc=f"{spec['task']} {spec['preset'] or ''}", unit="run",
               dynamic_ncols=True)
    failed = []

    def stop(signum, frame):
        children.stop(passed_on(signum))
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    pool = ThreadPoolExecutor(max_workers=spec["jobs"])
    progress = Progress()
    try:
        futures = {pool.submit(execute, pair, state, record, out, env, why, children, progress): pair
                   for pair, state, why in todo}
        for fut in _as_completed(futures, lambda: bar.set_postfix_str(progress.line(), refresh=True)):
            pair, attempt = futures[fut], fut.result()
            invocation["ran"] += 1
            if attempt["exit_status"] is None:  # never started: the runner was stopping
                continue
            if attempt["exit_status"] == 0:
                tqdm.write(f"done   {pair.key} in {attempt['wall_time_s']:.0f} s")
            else:
                failed.append(pair.key)
                invocation["failed"] += 1
                tqdm.write(f"FAILED {pair.key} (exit {attempt['exit_status']}): {attempt.get('error')}; "
                           f"log: {attempt['log']}", file=sys.stderr)
            bar.update(1)
            record.save()
    except KeyboardInterrupt:
        if children.stopped_by is None:  # (our handler has passed the signal on already)
            children.stop(signal.SIGINT)
        tqdm.write("interrupted: waiting for the current run(s) to save a checkpoint ...")
        while True:  # a second signal is passed on too (the runs stop at once): keep waiting for them
            try:
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:
                pass
    finally:
        pool.shutdown(wait=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
        bar.close()
        invocation["finished"] = now()
        record.save()
    return failed


def _as_completed(futures, tick, every_s: float = 10.0):
    """``as_completed`` that calls ``tick`` every ``every_s`` seconds while it waits (the running runs' progress)."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=every_s, return_when=FIRST_COMPLETED)
        tick()
        yield from done


# a hang-up (the terminal or the ssh session the runner ran in closed) stops the runs as SIGTERM does: each saves a
# checkpoint and stops, and a rerun finds them cut off (a training script that got SIGHUP itself would die unsaved)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def passed_on(signum: int) -> int:
    """The signal a runner's stop signal ``signum`` is passed on to its runs as."""
    return signal.SIGTERM if signum == signal.SIGHUP else signum


def _evaluate(args, pairs: list[Pair], spec: dict, out: Path, env: dict, children: Children) -> list[str]:
    """The held-out evaluations of the finished runs and of the base model (``lab.heldout_runs``); the names
    of those that failed."""
    from tqdm.auto import tqdm

    if args.no_eval:
        return []
    eval_args = shlex.split(args.eval_args)
    why_not = heldout_runs.wanted(spec["task"], eval_args)
    if why_not:
        tqdm.write(f"no held-out evaluation: {why_not}")
        return []
    todo = heldout_runs.commands(spec["task"], [(p.key, p.run_dir) for p in pairs], out, eval_args, rel,
                                 args.task_file)
    previous = {s: signal.signal(s, lambda signum, frame: children.stop(passed_on(signum))) for s in STOP_SIGNALS}
    try:
        return [f"eval {name}" for name in heldout_runs.run_evaluations(todo, out, env, children, tqdm.write, REPO)]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _out_given(argv: list[str]) -> str:
    """The --out of a command line, as typed, to name where a file-system fault happened."""
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--out="):
            return arg.split("=", 1)[1]
    return "--out"


def main(argv: list[str] | None = None) -> None:
    # a full or read-only disk under --out: runs.json is rewritten whole or not at all
    with exit_on_error((ExperimentError,), files=lambda: _out_given(sys.argv[1:] if argv is None else argv)):
        status = run(argv)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
