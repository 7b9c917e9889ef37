"""What ``python -m lab.evaluate`` is asked, checked and resolved into a ``Plan`` before any model loads: its
flags, the models a ``--model`` or ``--reference`` names (folders, run folders, specs), the base model, the data,
the reward, the samples of pass@k and the file the results go to. A mistake raises a one-line EvalError (or a
ConfigError, an AssetError) naming the flag.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from cory.assets import (MODEL_SPECS_HELP, SMOLLM2_SPEC, TINY_SPEC, check_hub_asset, is_valid_model_spec,
                         model_spec)
from cory.config import load_yaml
from cory.errors import AssetError, ConfigError
from cory.run.final import WEIGHT_FILES, final_complete, final_weights_id
from cory.heldout import BATCH_SIZE
from cory.models import check_weights_fit
from cory.run.outputs import in_use, read_manifest, run_folder_of
from cory.run.targets import check_output_file
from cory.tasks import PASS_AT_K, REWARD_METRICS, check_eval_config, load_task_file, registered, task_spec
from lab.errors import EvalError, OneLineParser

# the first paragraph of lab.evaluate's docstring: what --help says the command does
DESCRIPTION = """Score trained models on held-out prompts, from the query alone (how either CORY model is used
after training), next to the base model they started from."""

DEFAULT_KS = (1, 4, 16)
DTYPES = ("float32", "bfloat16", "float16")
MAX_SAMPLES = 1000  # per pass@k question: estimates need n >= k, and the paper's k is at most 16


# ----------------------------------------------------------------------------- models

@dataclass
class ModelEntry:
    label: str
    spec: str                   # what the loaders take: a folder, 'tiny', 'embedded:...' or a hub id
    run_dir: Path | None = None  # the training run it came from (for its config.yaml)
    # a folder's model: the path that names it (RUN/NAME for RUN/final/NAME, else the model folder) and the folder
    # its label is relative to (RUN's parent, the model folder's); ``_rows`` moves that up to the rows' common parent
    identity: Path | None = None
    anchor: Path | None = None
    repeat: int = 1             # the n-th row of the same model (given twice), labelled LABEL#n


def _folder_entry(path: Path, run: Path | None) -> ModelEntry:
    """The model folder ``path`` (``run``: the run whose final/ holds it), named by RUN/NAME or its own name."""
    identity = run.resolve() / path.name if run is not None else path.resolve()
    anchor = run.resolve().parent if run is not None else path.resolve().parent
    return ModelEntry(identity.relative_to(anchor).as_posix(), str(path), run, identity, anchor)


def _is_builtin_spec(spec: str) -> bool:
    return spec in (TINY_SPEC, SMOLLM2_SPEC)


def _hub_id_or_error(arg: str, flag: str) -> str:
    first = Path(arg).expanduser().parts[0] if arg else ""
    pathlike = arg.startswith((".", "/", "~")) or (os.sep in arg and Path(first).is_dir())
    if pathlike or not is_valid_model_spec(arg):
        raise EvalError(f"{flag} {arg}: no such directory ({MODEL_SPECS_HELP})")
    try:
        check_hub_asset(arg, "model", hint="give a model or run folder, 'tiny' or 'embedded:smollm2-135m'")
    except AssetError as e:  # fails within seconds when offline
        raise EvalError(f"{flag} {arg}: no such directory; as a hub id: {e}") from None
    return arg


def expand_model(arg: str) -> list[ModelEntry]:
    """The models a ``--model`` argument names: a model folder, a run folder (all of final/*), or a spec."""
    if _is_builtin_spec(arg):
        return [ModelEntry(arg, arg)]
    path = Path(arg).expanduser()
    if not path.is_dir():
        return [ModelEntry(arg, _hub_id_or_error(arg, "--model"))]
    if (path / "config.json").is_file():
        _check_causal_lm(path, f"--model {arg}")
        if not any((path / name).is_file() for name in WEIGHT_FILES):  # a save cut short
            raise EvalError(f"--model {arg}: {path} holds a config.json but no weights ({WEIGHT_FILES[0]}); "
                            "give a complete model folder")
        run = path.parent.parent if path.parent.name == "final" else None
        if run is not None and not (run / "config.yaml").is_file():
            run = None
        return [_folder_entry(path, run)]
    final = path / "final"
    if final.is_dir() and any(final.iterdir()) and not final_complete(path):  # written before it was written whole
        raise EvalError(f"--model {arg}: {final} is incomplete (a model folder without its weights: the save was cut "
                        f"short); finish the run with --resume {arg}")
    models = sorted(d for d in final.iterdir() if (d / "config.json").is_file()) if final.is_dir() else []
    for d in models:
        _check_causal_lm(d, f"--model {arg}")
    if models:
        return [_folder_entry(d, path) for d in models]
    if (path / "config.yaml").is_file():
        raise EvalError(f"--model {arg}: run folder has no trained models in final/ (has training finished?)")
    raise EvalError(f"--model {arg}: not a model folder (no config.json) nor a run folder (no final/)")


def _check_causal_lm(folder: Path, flag: str) -> None:
    """``folder``'s config.json describes a causal LM: another architecture's weights would not load into one,
    and transformers fills what does not load with random values (and only warns)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        raise EvalError(f"{flag}: {folder / 'config.json'} is not valid JSON") from None
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    kinds = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(kinds, list) and kinds and not any(k in causal for k in kinds):
        raise EvalError(f"{flag}: {folder} holds a {kinds[0]} (config.json architectures), not a causal language "
                        "model; give a model trained here (RUN/final/NAME) or another causal LM")
    if not kinds and (not isinstance(config, dict) or config.get("model_type") not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise EvalError(f"{flag}: {folder}'s config.json names no causal language model (model_type {kind!r})")
    try:  # every weight the config asks for is in the folder (a missing one would be scored as random values)
        check_weights_fit(model_spec(str(folder)), flag)
    except AssetError as e:
        raise EvalError(str(e)) from None


def _run_config(run: Path) -> dict:
    try:
        return load_yaml(run / "config.yaml")
    except ConfigError as e:
        raise EvalError(str(e)) from None


# ----------------------------------------------------------------------------- arguments

def _int_at_least(minimum: int, name: str):
    """An argparse type: an integer >= ``minimum``, with a one-line reason otherwise."""
    expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    parse.__name__ = name
    return parse


def _positive_int(name: str):
    return _int_at_least(1, name)


def _ks(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    try:
        ks = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers like 1,4,16, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"every k must be >= 1, got {text!r}")
    return sorted(set(ks))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(EvalError, prog="python -m lab.evaluate", description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help=f"a registered task ({', '.join(registered())}, or one that "
                                                 "--task_file registers)")
    p.add_argument("--task_file", metavar="FILE", help="a one-file task (docs/adding_a_task.md) to load first")
    p.add_argument("--model", action="append", required=True, metavar="DIR",
                   help="a model folder (e.g. RUN/final/llm1), a run folder (all of its final/ models), "
                        "or a model spec ('tiny', 'embedded:smollm2-135m', a hub id), evaluated as-is; repeatable")
    p.add_argument("--reference", metavar="SPEC",
                   help="the base model pi0 (KL reference and the 'base' row); default: model_name in the "
                        "run's config.yaml; a model given as a spec is its own reference")
    p.add_argument("--no_base", action="store_true", help="do not evaluate the base model as a row")
    p.add_argument("--limit", type=_positive_int("limit"),
                   help="held-out prompts/questions to use (default: the task's, e.g. imdb 256, gsm8k all 1,319)")
    p.add_argument("--max_new_tokens", type=_positive_int("max_new_tokens"),
                   help="default: the task's, e.g. imdb 15, gsm8k 256")
    p.add_argument("--batch_size", type=_positive_int("batch_size"), default=BATCH_SIZE,
                   help=f"sequences per generate() call (default {BATCH_SIZE})")
    p.add_argument("--seed", type=_int_at_least(0, "seed"), default=0, help="sampling seed, the same for every model (default 0)")
    p.add_argument("--dataset", help="where the held-out examples come from: a value the task allows "
                                     "(default: the run's, else auto)")
    p.add_argument("--dataset_path", metavar="DIR", help="a folder of data files, for a task that reads them "
                                                         "(GSM8K: the original release's test.jsonl)")
    p.add_argument("--reward", help="the task's reward, e.g. imdb: vader | distilbert-imdb | a classifier folder "
                                    "(default: the run's)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="model weights (default float32)")
    p.add_argument("--json", metavar="OUT.json",
                   help="where to write the results (default: RUN/eval_<task>.json when all models come "
                        "from one run folder, else nowhere); a file there that this tool did not write is refused "
                        "unless --force")
    p.add_argument("--force", action="store_true", help="replace the --json file even if this tool did not write it")
    reward = p.add_argument_group(f"{REWARD_METRICS} tasks (e.g. imdb)")
    reward.add_argument("--allow_early_eos", choices=("true", "false"),
                        help="true: EOS may end an answer before --max_new_tokens; false: every answer has that "
                             "length, as in training (default: the run's allow_early_eos, else false)")
    passk = p.add_argument_group(f"{PASS_AT_K} tasks (e.g. gsm8k)")
    passk.add_argument("--k", type=_ks, help="comma-separated k of pass@k (default: those of 1,4,16 that are <= n)")
    passk.add_argument("--n", type=_positive_int("n"), help="samples per question (default 16)")
    passk.add_argument("--protocol", help="how answers are sampled and read: training (default), as training does; "
                                          "or one the task declares, e.g. gsm8k's authors (the authors' GSM8K "
                                          "evaluation: top_k 10, top_p 0.7, repetition penalty 1.1, 256 tokens, no "
                                          "early stop, 'the answer is' else the last number), for pass@k comparable "
                                          "with the paper's")
    return p


@dataclass
class Plan:
    task: str
    metrics: str               # the task's kind of evaluation: REWARD_METRICS or PASS_AT_K
    rows: list[ModelEntry]     # what to evaluate, the base first
    reference: str | None      # the KL reference / base spec
    dataset: str
    dataset_path: str | None
    reward: str | None
    limit: int | None
    max_new_tokens: int
    batch_size: int
    seed: int
    dtype: str
    json_path: Path | None
    n: int | None = None
    ks: list[int] | None = None
    allow_early_eos: bool = True
    protocol: str = "training"  # a name in the task's Evaluation.protocols
    command: str | None = None  # as typed, recorded in the JSON
    scored_run: Path | None = None  # the run whose final models every row but the base's comes from
    final_weights: str | None = None  # which final weights of that run these are (cory.run.final), as planned

    def task_config(self) -> SimpleNamespace:
        """The fields of a training config the task's ``make`` and checks read."""
        return SimpleNamespace(task=self.task, dataset=self.dataset, dataset_path=self.dataset_path,
                               reward_model=self.reward, seed=0)


# the task's checks name config fields; this command's flags for them
FLAG_OF_FIELD = {"reward_model": "--reward", "dataset_path": "--dataset_path", "dataset": "--dataset",
                 "task": "--task"}


def as_flags(e: ConfigError, flags: dict[str, str] = FLAG_OF_FIELD) -> EvalError:
    """A task check's ConfigError ("dataset: ...") as the command's own error, naming its flag ("--dataset: ...")."""
    field, colon, rest = str(e).partition(":")
    return EvalError(f"{flags[field]}:{rest}" if colon and field in flags else str(e))


def plan(argv: Sequence[str] | None) -> Plan:
    """Validate everything that needs no model (raises EvalError, ConfigError or AssetError)."""
    args = build_parser().parse_args(argv)
    if args.task_file is not None:
        load_task_file(args.task_file)
    try:
        spec = task_spec(args.task)
    except ConfigError as e:
        raise as_flags(e) from None
    evaluation = spec.evaluation
    passk = evaluation.metrics == PASS_AT_K
    wrong = [("--allow_early_eos", args.allow_early_eos)] if passk else [("--k", args.k), ("--n", args.n)]
    for flag, value in wrong:
        if value is not None:
            raise EvalError(f"{flag} applies to {PASS_AT_K if not passk else REWARD_METRICS} tasks, not "
                            f"--task {args.task}")

    entries = [e for arg in args.model for e in expand_model(arg)]
    runs = list(dict.fromkeys(e.run_dir.resolve() for e in entries if e.run_dir is not None))
    for run in runs:  # a run in training replaces its final models: a result would pass for the new ones
        busy = in_use(run, "--model", "run")
        if busy:
            raise EvalError(busy)
    configs = {run: _run_config(run) for run in runs}
    same_task = [c for c in configs.values() if c.get("task", args.task) == args.task]
    inherited = same_task[0] if same_task else {}  # what the (first) run read and was scored with

    reference = _reference(args, entries, configs, passk)
    rows = _rows(args, entries, reference)
    dataset, dataset_path = _data(args, spec, inherited)
    reward = _reward(args, spec, inherited)
    allow_early_eos = True  # pass@k: an answer ends where the model stops
    if not passk:
        allow_early_eos = (args.allow_early_eos == "true" if args.allow_early_eos is not None
                           else bool(inherited.get("allow_early_eos", False)))
    n, ks = _samples(args) if passk else (None, None)
    protocol = args.protocol or "training"
    if protocol not in evaluation.protocols:
        raise EvalError(f"--protocol: {protocol!r} is not one of {', '.join(evaluation.protocols)} for --task "
                        f"{args.task}")
    # an evaluation under another protocol must not overwrite the training-protocol one beside it
    suffix = "" if protocol == "training" else f"_{protocol}"
    json_path = Path(args.json) if args.json else (runs[0] / f"eval_{args.task}{suffix}.json" if len(runs) == 1 and
                                                   all(e.run_dir is not None for e in entries) else None)
    if json_path is not None and json_path.is_dir():
        raise EvalError(f"--json {json_path}: is a folder, expected a file name")
    inside = run_folder_of(json_path) if args.json else None
    if inside is not None and read_manifest(inside) is None:
        inside = None  # a lock alone: an experiment runner's folder, where it writes the base model's evaluation
    own_name = f"eval_{args.task}{suffix}.json"
    if inside is not None and not (len(runs) == 1 and json_path.absolute().parent.resolve() == runs[0]
                                   and json_path.name == own_name):
        # a run folder holds what its run writes, and its own evaluation under its own name (the default)
        raise EvalError(f"--json {json_path}: is inside the run folder {inside}, which holds only what its run writes "
                        f"and the evaluation of its own models ({own_name}, the default without --json); choose a "
                        "file outside it")
    if json_path is not None:  # known now, not after the whole evaluation
        check_output_file(json_path, "--json", "python -m lab.evaluate", args.force)
    p = Plan(task=args.task, metrics=evaluation.metrics, rows=rows, reference=reference, dataset=dataset,
             dataset_path=dataset_path, reward=reward,
             limit=args.limit if args.limit is not None else evaluation.limit,
             max_new_tokens=args.max_new_tokens or evaluation.answer_tokens, batch_size=args.batch_size,
             seed=args.seed, dtype=args.dtype, json_path=json_path, n=n, ks=ks, allow_early_eos=allow_early_eos,
             protocol=protocol)
    if len(runs) == 1 and all(e.run_dir is not None for e in entries):
        # recorded with the results: a --resume that replaces the models later makes them stale, not wrong
        p.scored_run, p.final_weights = runs[0], final_weights_id(runs[0])
    try:  # the reward and the data, before any model loads (and prints its load report)
        check_eval_config(p.task_config())
    except ConfigError as e:
        raise as_flags(e) from None
    return p


def _reference(args, entries: list[ModelEntry], configs: dict, passk: bool) -> str | None:
    """The base model: the flag, else the runs' base model, else a model given as a spec is its own base."""
    reference = args.reference
    if reference is not None:
        if _is_builtin_spec(reference):
            pass
        elif not Path(reference).expanduser().is_dir():
            _hub_id_or_error(reference, "--reference")
        elif not (Path(reference).expanduser() / "config.json").is_file():
            raise EvalError(f"--reference {reference}: not a model folder (no config.json)")
        else:
            _check_causal_lm(Path(reference).expanduser(), f"--reference {reference}")
        return reference
    bases = {str(c["model_name"]) for c in configs.values() if c.get("model_name")}
    if len(bases) > 1:
        raise EvalError(f"the runs start from different base models ({', '.join(sorted(bases))}); "
                        "pass --reference SPEC or evaluate them separately")
    if bases:
        reference = bases.pop()
    elif len(entries) == 1 and entries[0].run_dir is None and not Path(entries[0].spec).is_dir():
        reference = entries[0].spec
    if reference is None and (not passk or not args.no_base):  # a reward task's KL column needs it, a base row too
        why = "the KL reference" if not passk else "the 'base' row (or pass --no_base)"
        raise EvalError(f"--reference: needed for {why}; no run config.yaml found at DIR/../../config.yaml")
    return reference


def _rows(args, entries: list[ModelEntry], reference: str | None) -> list[ModelEntry]:
    """The models to evaluate, the base model first (unless --no_base), each under a label of its own: a folder's
    model by its path from the rows' common parent folder (``ppo/seed_0/policy`` and ``cory/seed_0/llm1``; one run's
    models, or runs side by side, as ``seed_0/llm1``), the same model given again as LABEL#2."""
    rows = [] if args.no_base else [ModelEntry("base", reference)]
    rows += [e for e in entries if args.no_base or e.spec != reference]
    anchors = [e.anchor for e in rows if e.anchor is not None]
    common = Path(os.path.commonpath(anchors)) if anchors else None
    for e in rows:
        if e.identity is not None and common is not None:
            e.label = e.identity.relative_to(common).as_posix()
    labels: dict[str, int] = {}
    for e in rows:  # the same model given twice stays two rows
        labels[e.label] = labels.get(e.label, 0) + 1
        if labels[e.label] > 1:
            e.repeat = labels[e.label]
            e.label = f"{e.label}#{labels[e.label]}"
    return rows


def _data(args, spec, inherited: dict) -> tuple[str, str | None]:
    """(dataset, dataset_path): the flags, else the run's."""
    dataset, dataset_path = args.dataset, args.dataset_path
    if dataset is None and dataset_path is None and inherited.get("dataset"):
        dataset = inherited["dataset"]
        path = inherited.get("dataset_path")
        if path and Path(path).is_dir():
            dataset_path = path
        elif dataset == "local":
            raise EvalError(f"the run read its data from {path}, which is not found here; pass --dataset_path DIR")
    dataset = dataset or ("local" if dataset_path else "auto")
    if dataset not in spec.datasets:
        raise EvalError(f"--dataset {dataset!r} is not one of {', '.join(spec.datasets)} for {args.task}")
    return dataset, dataset_path


def _reward(args, spec, inherited: dict) -> str:
    """The reward to score with: the flag, else the run's (a shaped training reward: the one it shapes), else the
    task's evaluation reward."""
    run_reward = inherited.get("reward_model")
    if spec.rewards and run_reward not in spec.rewards:
        run_reward = None  # a config without a task field, of another task's run
    run_reward = spec.evaluation.scored_reward(run_reward)
    reward = (args.reward or run_reward or spec.evaluation.reward
              or (spec.rewards[0] if len(spec.rewards) == 1 else None))
    if reward is None:
        raise EvalError(f"--reward: needed ({args.task} takes any reward and no run's config.yaml names one)")
    return reward


def _samples(args) -> tuple[int, list[int]]:
    """(n, ks) of a pass@k evaluation."""
    n = args.n or 16
    if n > MAX_SAMPLES:
        raise EvalError(f"--n: at most {MAX_SAMPLES} samples per question, got {n} (each is a generation of up to "
                        "--max_new_tokens tokens, for every question and model)")
    ks = args.k or [k for k in DEFAULT_KS if k <= n]
    too_big = [k for k in ks if k > n]
    if too_big:
        raise EvalError(f"--k {too_big[0]} is larger than --n {n}: pass@k needs at least k samples per question")
    return n, ks
