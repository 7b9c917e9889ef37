"""The command line shared by the training scripts: ``--config FILE.yaml`` then ``--field value``."""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import yaml

from cory.run import preflight, run_rules
from cory.config import (INVOCATION_FIELDS, RENAMED, REQUIRED, allowed_type, build, field_help, field_types,
                         load_yaml, to_dict, validate)
from cory.errors import AssetError, ConfigError, RunError, Stopped
from cory.tasks import registered

USAGE = ("usage: {prog} [--config FILE.yaml] [--field value ...] [--resume RUN_DIR [--steps N]] [--overwrite] "
         "[--print_config]")


def _help(cls, prog: str) -> str:
    doc = (sys.modules.get(cls.__module__).__doc__ or "").strip()
    purpose = doc.split("\n\n")[0].replace("\n", " ") if doc else ""
    lines = [USAGE.format(prog=prog), ""] + ([purpose, ""] if purpose else []) + [
        "Values come from the script's defaults (the paper's), then the YAML file, then the flags.",
        "  --config FILE.yaml   a preset of `field: value` lines, e.g. configs/<task>/<method>_cpu.yaml",
        "  --resume RUN_DIR     continue that run from its newest checkpoint (its config.yaml is the base);",
        "                       only the fields marked [resume] may differ, e.g. --steps N extends a finished run",
        "                       that kept its checkpoint (keep_resume_checkpoint: true)",
        "  --overwrite          replace the run already in output_dir (only ever a folder this project wrote)",
        "  --print_config       check the resolved config as a run would, print it as YAML with the hub assets the",
        "                       run fetches (hub_assets) and exit (trains nothing, asks the hub nothing)",
        "", "fields (--name value; a true/false field may stand alone to mean true):"]
    # the values a field may take for this script's task, as the task registered them
    task = registered().get(cls.__dataclass_fields__["task"].default)
    by_task = {"dataset": task.datasets, "reward_model": task.rewards} if task is not None else {}
    for name, tp, default, meta in field_help(cls):
        if name in INVOCATION_FIELDS:
            continue
        choices = meta["choices"] or by_task.get(name)
        allowed = " | ".join(map(str, choices)) if choices else ("true | false" if tp == "bool" else tp)
        if meta.get("auto"):
            allowed = f"auto | {allowed}"
        flags = " [resume]" if meta["on_resume"] else ""
        given = "required" if default is REQUIRED else f"default: {default}"
        lines.append(f"  --{name:<27} {allowed}  ({given}){flags}")
        if meta["help"]:
            lines.append(f"      {meta['help']}")
    return "\n".join(lines)


def split_flags(cls, argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """(config path, {field: raw string}) from ``argv``; bool flags may stand alone (``--overwrite``)."""
    types_ = field_types(cls)
    config, flags, i = None, {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}; flags look like --field value")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        key = RENAMED.get(key, key)  # a field's old name (--keep_checkpoints) still works
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("--"):
                value, i = nxt, i + 1
            elif key in types_ and allowed_type(types_[key])[0] is bool:
                value = "true"
            else:
                raise ConfigError(f"--{key}: missing value")
        if key == "config":
            config = value
        elif key not in types_:
            raise ConfigError(f"unknown field {key!r}; see --help for the allowed fields")
        else:
            flags[key] = value
        i += 1
    return config, flags


def parse(cls, argv: list[str] | None = None, prog: str | None = None, *, check: bool = True):
    """The resolved config, checked as far as it can be without loading a model (``check``: the values, the model
    spec, the task's data and reward; ``main`` checks a run's after seeing whether it is a finished run's resume, and
    ``cory.train`` again with the run folder). ``--resume DIR`` starts from the config saved in DIR, and only fields
    that do not change what the run learns may differ from it."""
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != PRINT_CONFIG]
    if any(a in ("-h", "--help") for a in argv):
        print(_help(cls, prog or Path(sys.argv[0]).name))
        raise SystemExit(0)
    config, flags = split_flags(cls, argv)
    base = load_yaml(config) if config else {}
    for key in INVOCATION_FIELDS:
        if key in base:
            raise ConfigError(f"{key}: a command-line flag (--{key}), not a config-file field ({config})")
    if flags.get("resume"):
        cfg = _resumed(cls, flags, base, config)
    else:
        # another task's preset changes another task's values: refuse it by its task before reading its values
        run_rules.check_script_task(cls, flags.get("task", base.get("task")), cls.method)
        cfg = build(cls, base, flags)
    if check:
        preflight.check_config(cfg)
    return cfg


def _resumed(cls, flags: dict, base: dict, config: str | None):
    """The saved run's config with the changes a resume allows (``cory.run.run_rules``: any other change is refused by
    name)."""
    run_dir = Path(flags["resume"]).expanduser()
    script_task = cls.__dataclass_fields__["task"].default
    saved_path = run_rules.check_resume_folder(run_dir, cls.method, None if script_task is REQUIRED else script_task)
    saved = build_saved(cls, load_yaml(saved_path), saved_path)
    asked = build(cls, {**dataclasses.asdict(saved), **base, "resume": None},
                  {k: v for k, v in flags.items() if k not in ("resume", "output_dir")})
    # what this command sets (in --config or as a flag) must agree with the run, unless it may change
    changed = run_rules.resume_changes(cls, asked, saved, set(base) | set(flags), saved_path)
    run_rules.check_stays_in_folder(flags.get("output_dir"), run_dir)
    cfg = dataclasses.replace(saved, **changed, output_dir=str(run_dir), resume=str(run_dir), overwrite=False)
    validate(cfg)
    return cfg


def build_saved(cls, saved: dict, path: Path):
    """The saved config of a run as ``cls`` (``run_rules.check_saved_fields``: only fields the script has)."""
    run_rules.check_saved_fields(cls, saved, path)
    return build(cls, {k: v for k, v in saved.items() if k not in INVOCATION_FIELDS})


PRINT_CONFIG = "--print_config"
CONFIG_MARKER = "# cory --print_config"
HUB_ASSETS_NOTE = ("# hub_assets: the Hugging Face hub repositories the run fetches (none: it runs offline); cached: "
                   "in the local cache now; fallback: what the run takes where the hub does not have it")


def hub_asset(asset) -> dict:
    """A ``cory.assets.HubAsset`` as ``--print_config`` prints it (``cached`` read from the disk alone)."""
    printed = {"field": asset.field, "repo_id": asset.repo_id, "repo_type": asset.repo_type, "cached": asset.cached()}
    return printed if asset.fallback is None else {**printed, "fallback": asset.fallback}


def main(cls, argv: list[str] | None = None) -> None:
    """Entry point of a training script (``cls``: its config class, which says its method): user mistakes print
    one line and exit 2, no traceback.

    ``--print_config``: the resolved config, checked as far as a run checks it before loading a model, printed
    as YAML (``method`` and ``config``; this is how the experiment runner reads a script's values), then the hub
    assets the run fetches (``hub_assets``: ``cory.run.preflight.hub_assets``, the hub not asked)."""
    argv = sys.argv[1:] if argv is None else argv
    print_config = PRINT_CONFIG in argv
    try:
        cfg = parse(cls, argv, check=print_config)
        hub = [hub_asset(a) for a in preflight.hub_assets(cfg)] if print_config else []
    except (ConfigError, AssetError) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        raise SystemExit(2)
    if print_config:
        # after a marker line, so that whatever the script printed before (a task file that prints at import) is
        # not read as the config
        print(CONFIG_MARKER)
        print(yaml.safe_dump({"method": cfg.method, "config": to_dict(cfg)}, sort_keys=False), end="")
        print(HUB_ASSETS_NOTE)
        print(yaml.safe_dump({"hub_assets": hub}, sort_keys=False), end="")
        return
    finished = run_rules.nothing_to_do(cfg)  # a finished run's --resume: before anything loads or is written
    if finished:
        print(finished)
        return
    try:
        # checked before the training stack (torch, trl: seconds of imports) loads, so that a mistake answers at
        # once; it loads only now, so that --help and --print_config answer at once too
        preflight.check_config(cfg)
        from cory.train import train

        out = train(cfg)
    except (ConfigError, AssetError) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        raise SystemExit(2)
    except RunError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        raise SystemExit(1)
    except Stopped as e:  # a stop signal: what was saved, and how to go on
        if os.environ.get("RANK", "0") == "0":
            print(str(e), file=sys.stderr)
        raise SystemExit(e.exit_status)
    if os.environ.get("RANK", "0") == "0":  # data-parallel runs: the main process reports
        print(f"done: metrics in {out / 'metrics.jsonl'}, samples in {out / 'samples.jsonl'}, "
              f"models in {out / 'final'}")


_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() splits on


def one_line(text: str) -> str:
    """``text`` with line breaks escaped (a value or path the user typed may hold one)."""
    return "".join(repr(c)[1:-1] if c in _LINE_BREAKS else c for c in text.strip())
