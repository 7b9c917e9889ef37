"""Bring the finished runs of an experiment folder run elsewhere (a clean clone, one runner per clone, as the long
comparisons run) into the repository's folder of the same experiment.

    python -m lab.collect /tmp/clone_1/results/arithmetic_cpu_horizon results/arithmetic_cpu_horizon

Both folders are the runner's (``lab.experiments``: a runs.json) and of one experiment: the same task, preset, steps,
η sweep, ``--set`` values and design (its hash). Every run of the source's runs.json must have finished (its last
attempt exited 0), its runner too, and none may be in the destination already. A destination with no runs.json yet
(a folder holding only its design, before its first run comes in) takes the source's record of the experiment, if it
holds no runs and its design.yaml, if any, is the one the source ran under. Then each run's files (those at the
top of its folder: config, metrics, samples, evaluations; not its checkpoints or final models, which the repository
does not keep) and its logs are copied, and the destination's runs.json gains the runs and the invocations, written
last and whole. The copies are made into a temporary folder of this collect's own in the destination
(``.collect.<pid>-<hex>.tmp``), renamed into place once all are whole, and the record renamed over runs.json last: a
stop (Ctrl-C, or SIGTERM, which stops it as Ctrl-C does) or a fault before then removes what this collect made, so
that the same command can be run again (a collect killed outright leaves that folder: the next one into the
destination removes it, and says so). The source's base-model evaluation is not copied when the destination has
one: the folder keeps its first draw (a different one is named). Nothing is written before every check has passed,
and the checks are made again under the destination's lock, the one the experiment runner takes (one writer of a
runs.json at a time). A run key is the runner's (``<method>[_kl<eta>]/seed_<n>``), never a path out of the
destination; a run's folder holds its config and metrics; no file or folder read is a symbolic link (none is
followed) or a pipe.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import sys
from pathlib import Path

from cory.errors import ConfigError
from cory.run.outputs import RunLock, in_use, read_jsonl, read_manifest, run_folder_of
from cory.run.targets import NotRegularFile, open_regular, special_kind, stopped_as_interrupt, target_refusal
from lab.errors import OneLineParser, ReportError, exit_on_error
from lab.figures import writer_command
from lab.design import DESIGN_DIGEST, DESIGN_FILE, design_digest
from lab.runs import RUN_KEY, record_refusal

WRITERS = "experiment runner or collect"  # who takes a folder's lock to write its runs.json, for the refusal
SAME = ("task", "preset", "steps", "kl_coefs", "set", "design_sha256")


def read_runs_json(folder: Path, which: str) -> dict:
    """``which`` folder's runs.json, of the runner's shape (``record_refusal``) with its runs, each with attempts; a
    ReportError naming what is not. A runs.json that is a pipe or a device is refused unopened (it would wait)."""
    path = folder / "runs.json"
    try:
        with open_regular(path, encoding="utf-8") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise ReportError(f"{which} {folder}: no runs.json (not a folder the experiment runner wrote)") from None
    except NotRegularFile as e:
        raise ReportError(f"{which} {path}: {e.strerror}; the runner's record is a file, refused unread") from None
    except (OSError, ValueError) as e:
        raise ReportError(f"{which} {path}: cannot be read ({type(e).__name__})") from None
    wrong = record_refusal(doc, f"{which} {path}")
    if wrong is None and not isinstance(doc.get("runs"), dict):
        wrong = f"{which} {path} has no runs: not a runs.json of the experiment runner"
    if wrong is None:
        wrong = next((f"{which} {path}'s run {key!r} records no attempt; the runner records one for every run it "
                      "starts" for key, run in doc["runs"].items() if not run.get("attempts")), None)
    if wrong is not None:
        raise ReportError(wrong)
    return doc


def _unfinished(doc: dict) -> list[str]:
    return [i.get("command", "?") for i in doc.get("invocations") or [] if not i.get("finished")]


def first_record(src: dict, dest: Path) -> dict:
    """The runs.json of a destination no runner has written yet: the source's experiment with no runs, once the
    folder is shown to hold none (a runs/ folder without a record is not the runner's) and its design.yaml, if it
    has one, to be the one the source's runs were planned under."""
    if not dest.is_dir():
        raise ReportError(f"destination {dest}: no such folder; make it (with its DESIGN.md) before the first collect")
    if (dest / "runs").exists():
        raise ReportError(f"destination {dest}: has a runs/ folder but no runs.json (not a folder the experiment "
                          "runner wrote)")
    if design_digest(dest) != src.get(DESIGN_DIGEST):
        raise ReportError(f"{DESIGN_FILE}: the destination's (sha256 {str(design_digest(dest))[:12]}) is not the one "
                          f"the source ran under ({str(src.get(DESIGN_DIGEST))[:12]}); these are two experiments")
    return {**src, "runs": {}, "invocations": [], "methods": [], "seeds": []}


def _refuse_links(base: Path, rel: Path) -> None:
    """A ReportError where a folder or file of ``base / rel`` below ``base`` is a symbolic link (a private file,
    another seed's run: collect copies a run's own files and follows no link), or the file is not a regular one."""
    path = base
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise ReportError(f"{path}: a symbolic link (to {os.readlink(path)}); lab.collect copies a run's own "
                              "files and follows no link: put the file itself there, or move the link away")
    kind = special_kind(path)
    if kind is not None:
        raise ReportError(f"{path}: {kind}, not a regular file; lab.collect copies regular files only: move it away")


def _run_copies(source: Path, dest: Path, key: str, run: dict, dst: dict) -> list[tuple[Path, Path]]:
    """[(file, where it goes)] of the source's finished run ``key`` (``run``: its record): the files at the top of
    its folder, and its logs; a ReportError, naming what, where it cannot come in."""
    if not RUN_KEY.fullmatch(key):  # a key is a path here: "../x", "/etc", "" would write outside runs/
        raise ReportError(f"source runs.json: the run key {key!r} is not one the runner writes "
                          "(<method>[_kl<eta>]/seed_<n>); nothing is collected")
    last = run["attempts"][-1]
    if last.get("exit_status") != 0:
        raise ReportError(f"{key}: its last attempt did not finish (exit status {last.get('exit_status')}); a "
                          "run cut off is committed as such by hand")
    method, _, seed = key.partition("/")
    logs = [Path("logs") / method / f"{seed}.log", Path("logs") / "eval" / f"{method}_{seed}.log"]
    for rel in [Path("runs") / key, *logs]:  # the destination's folders too: a link there would be written through
        _refuse_links(dest, rel.parent)
    if key in dst["runs"] or os.path.lexists(dest / "runs" / key):
        raise ReportError(f"{key}: the destination has it already ({dest / 'runs' / key})")
    folder = source / "runs" / key
    _refuse_links(source, Path("runs") / key)
    if not folder.is_dir():
        raise ReportError(f"{key}: no folder {folder}")
    files = sorted(f for f in folder.iterdir() if f.is_symlink() or not f.is_dir())  # its folders are not kept
    for f in files:
        _refuse_links(folder, Path(f.name))
    lacking = next((f"no {name}" for name in ("config.yaml", "metrics.jsonl") if not (folder / name).is_file()),
                   None) or (None if read_jsonl(folder / "metrics.jsonl") else "a metrics.jsonl with no rows")
    if lacking:  # exit status 0 and nothing to show for it: copied by hand, or cut after the runner wrote it
        raise ReportError(f"{key}: runs.json says it finished, but {folder} has {lacking}; it is not collected "
                          "as finished (a run cut off is committed as such by hand)")
    copies = [(f, dest / "runs" / key / f.name) for f in files]
    for rel in logs:
        if os.path.lexists(source / rel):
            _refuse_links(source, rel)
            copies.append((source / rel, dest / rel))
    return copies


def _draw(path: Path) -> object:
    """A base-model evaluation's results, None where they cannot be read."""
    try:
        with open_regular(path, encoding="utf-8") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return doc.get("results") if isinstance(doc, dict) else None


def plan(source: Path, dest: Path) -> tuple[dict, dict, list[tuple[Path, Path]], list[str]]:
    """(source runs.json, the destination's after the merge, [(file, where it goes)], notes); a ReportError, naming
    what, where the two cannot be merged."""
    for base in (source, dest):  # the record read, the record replaced: neither through a link
        if (base / "runs.json").is_symlink():
            _refuse_links(base, Path("runs.json"))
    src = read_runs_json(source, "source")
    if source.resolve() == dest.resolve():
        raise ReportError(f"{source}: the source and the destination are one folder")
    if source.resolve() in dest.resolve().parents:  # the runs would be copied into the folder they are read from
        raise ReportError(f"destination {dest}: inside the source {source}; give the repository's folder of the "
                          "experiment, outside the clone's")
    inside = dest if read_manifest(dest) is not None else run_folder_of(dest)
    if inside is not None:  # a run's folder (its manifest), or a folder a run or a runner holds (its lock)
        raise ReportError(f"destination {dest}: {'is' if inside == dest else 'inside'} {inside}, a run's folder or "
                          "an experiment's; give the experiment's folder itself (the one holding runs.json)")
    dst = read_runs_json(dest, "destination") if (dest / "runs.json").exists() else first_record(src, dest)
    for key in SAME:
        if src.get(key) != dst.get(key):
            raise ReportError(f"{key}: the source has {src.get(key)!r}, the destination {dst.get(key)!r}; these "
                              "are two experiments")
    for which, doc in (("source", src), ("destination", dst)):
        if unfinished := _unfinished(doc):
            raise ReportError(f"{which}: its runner has not finished ({unfinished[0]}); collect once it has")
    copies, notes = [], []
    for key, run in sorted(src["runs"].items()):
        copies += _run_copies(source, dest, key, run, dst)
    for base in sorted(source.glob("eval_base_*.json")):
        _refuse_links(source, base.relative_to(source))
        if not (dest / base.name).exists():
            copies.append((base, dest / base.name))
        elif _draw(base) is None or _draw(base) != _draw(dest / base.name):
            notes.append(f"{base.name}: the source's draw differs from the destination's; the destination keeps its "
                         "own")
    taken = [to for _, to in copies if to.exists()]
    if taken:
        raise ReportError(f"{taken[0]}: already there; nothing is replaced")
    merged = {**dst, "runs": {**dst["runs"], **src["runs"]},
              "invocations": (dst.get("invocations") or []) + (src.get("invocations") or []),
              "methods": list(dict.fromkeys((dst.get("methods") or []) + (src.get("methods") or []))),
              "seeds": sorted(set(dst.get("seeds") or []) | set(src.get("seeds") or []))}
    return src, merged, copies, notes


def _copy(frm: Path, to: Path) -> None:
    """``frm``'s bytes and times into ``to``, a new file: ``frm`` opened without following a link or waiting on a
    pipe (checked before, and again here, on what was opened)."""
    fd = os.open(frm, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReportError(f"{frm}: not a regular file; lab.collect copies regular files only: move it away")
        with open(to, "xb") as out:
            shutil.copyfileobj(f, out)
    shutil.copystat(frm, to, follow_symlinks=False)


def collect(source: str | Path, dest: str | Path) -> tuple[list[str], list[str]]:
    """Copy and merge (see the module); (the runs brought in, notes)."""
    source, dest = Path(source), Path(dest)
    for folder, name in ((source, "source"), (dest, "destination")):  # a runner or a collect at work there now
        busy = in_use(folder, name, WRITERS) if folder.is_dir() else None
        if busy:
            raise ReportError(busy)
    plan(source, dest)  # a refusal before the lock leaves nothing behind, not even the lock's file
    try:  # the runner's lock on the folder: one writer of its runs.json at a time, a runner or a collect
        lock = RunLock(dest, "destination", WRITERS).acquire()
    except ConfigError as e:
        raise ReportError(str(e)) from None
    try:
        return _collect_locked(source, dest)
    finally:
        lock.release()


def _collect_locked(source: Path, dest: Path) -> tuple[list[str], list[str]]:
    src, merged, copies, notes = plan(source, dest)  # again, now that no other writer can change the folder
    notes += _remove_left_staging(dest)
    staging = dest / f".collect.{os.getpid()}-{secrets.token_hex(4)}.tmp"  # cory.run.targets.TEMPORARY's form
    record = staging / "runs.json"
    made: list[Path] = []  # what this call put in the destination, in order
    written = None  # the inode of the record to be renamed into place
    try:
        staging.mkdir()
        for i, (frm, _) in enumerate(copies):  # the long part: a stop here leaves the destination untouched
            _copy(frm, staging / str(i))
        with open(record, "x", encoding="utf-8") as f:
            f.write(json.dumps(merged, indent=2) + "\n")
        written = os.stat(record).st_ino
        for i, (_, to) in enumerate(copies):
            for parent in reversed([to.parent, *to.parent.parents]):
                if not parent.exists():
                    made.append(parent)  # before it is made: a stop between the two leaves nothing untracked
                    parent.mkdir()
            if os.path.lexists(to):  # planned under the lock as free; a writer that takes no lock put it there
                raise ReportError(f"{to}: already there; nothing is replaced")
            made.append(to)
            os.rename(staging / str(i), to)
        if refusal := target_refusal(dest / "runs.json", "runs.json"):  # a pipe put there since: not replaced
            raise ReportError(refusal)
        os.replace(record, dest / "runs.json")  # the runs are in from here on
    except BaseException:  # a stop (SIGTERM too, in main) or a fault: what this call made goes, to be run again
        if written is not None and not record.exists() and _inode(dest / "runs.json") == written:
            return sorted(src["runs"]), notes  # the stop came once the record was in place: so are the runs
        with _stops_held():
            for path in reversed(made):  # each was not there before this call (a stop may come before it was made)
                if os.path.lexists(path):
                    path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(src["runs"]), notes


STAGING = re.compile(r"\.collect\.\d+-[0-9a-f]{8}\.tmp")


def _remove_left_staging(dest: Path) -> list[str]:
    """The temporary folders of collects killed mid-copy (SIGKILL, a power cut: no handler ran), in the destination:
    removed, each a note. Under the lock no other collect is at work there, so each one of that name is a dead
    collect's copies, nothing else (a link of that name is left alone)."""
    notes = []
    for path in sorted(dest.iterdir()):
        if STAGING.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            notes.append(f"removed {path}, the copies of a collect that was killed before it finished")
    return notes


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@contextlib.contextmanager
def _stops_held():
    """Within it, a stop signal waits (it is delivered at the end): what a stopped collect made is removed whole."""
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def next_step(dest: str | Path) -> str:
    """The command to run after a collect: the one the folder's document names as its writer (a learner pilot's
    SUMMARY.md is lab.learners', with its ``--against`` folders), else the report's, each on ``dest`` as given:
    the document names the folder it was written in, which a collect into a copy or a clone's is not."""
    for name in ("REPORT.md", "SUMMARY.md", "EQUIVALENCE.md"):
        doc = Path(dest) / name
        command = writer_command(doc) if doc.is_file() and not doc.is_symlink() else None  # a pipe is not opened
        if command:
            words = shlex.split(command)  # python -m lab.X FOLDER [its other arguments]
            return shlex.join([*words[:3], str(dest), *words[4:]])
    return shlex.join(["python", "-m", "lab.report", str(dest)])


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(ReportError, prog="python -m lab.collect", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="the experiment folder in the clone that ran the runs")
    p.add_argument("destination", help="the repository's folder of the same experiment")
    # a stop, Ctrl-C or SIGTERM (stopped_as_interrupt), removes what the collect copied (see collect)
    with exit_on_error((ReportError,), files=lambda: args.destination,
                       interrupted="nothing was collected (runs.json unchanged)"):
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        with stopped_as_interrupt():
            runs, notes = collect(args.source, args.destination)
        for note in notes:
            print(f"note: {note}")
        print(f"collected {', '.join(runs) or 'no runs'} into {args.destination}; next: {next_step(args.destination)}")


if __name__ == "__main__":
    main()
