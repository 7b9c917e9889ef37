"""The command line shared by the training scripts: ``--config FILE.yaml`` then ``--field value``."""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from cory.config import (INVOCATION_FIELDS, ConfigError, CoryArgs, PPOArgs, _allowed, _field_types, build,
                         field_help, load_yaml, metadata, validate)

USAGE = "usage: {prog} [--config FILE.yaml] [--field value ...] [--resume RUN_DIR [--steps N]] [--overwrite]"


def _help(cls, prog: str) -> str:
    doc = (sys.modules.get(cls.__module__).__doc__ or "").strip()
    purpose = doc.split("\n\n")[0].replace("\n", " ") if doc else ""
    lines = [USAGE.format(prog=prog), ""] + ([purpose, ""] if purpose else []) + [
        "Values come from the script's defaults (the paper's), then the YAML file, then the flags.",
        "  --config FILE.yaml   a preset of `field: value` lines, e.g. configs/<task>/<method>_cpu.yaml",
        "  --resume RUN_DIR     continue that run from its newest checkpoint (its config.yaml is the base);",
        "                       only the fields marked [resume] may differ, e.g. --steps N extends a finished run",
        "  --overwrite          replace the run already in output_dir (only ever a folder this project wrote)",
        "", "fields (--name value; a true/false field may stand alone to mean true):"]
    for name, tp, default, meta in field_help(cls):
        if name in INVOCATION_FIELDS:
            continue
        allowed = " | ".join(map(str, meta["choices"])) if meta["choices"] else ("true | false" if tp == "bool" else tp)
        if meta.get("auto"):
            allowed = f"auto | {allowed}"
        flags = " [resume]" if meta["on_resume"] else ""
        lines.append(f"  --{name:<27} {allowed}  (default: {default}){flags}")
        if meta["help"]:
            lines.append(f"      {meta['help']}")
    return "\n".join(lines)


def split_flags(cls, argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """(config path, {field: raw string}) from ``argv``; bool flags may stand alone (``--overwrite``)."""
    types_ = _field_types(cls)
    config, flags, i = None, {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}; flags look like --field value")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("--"):
                value, i = nxt, i + 1
            elif key in types_ and _allowed(types_[key])[0] is bool:
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


def parse(cls, argv: list[str] | None = None, prog: str | None = None):
    """The resolved config, checked as far as it can be without loading a model. ``--resume DIR`` starts from
    the config saved in DIR, and only fields that do not change what the run learns may differ from it."""
    from cory import preflight

    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(_help(cls, prog or Path(sys.argv[0]).name))
        raise SystemExit(0)
    config, flags = split_flags(cls, argv)
    base = load_yaml(config) if config else {}
    for key in INVOCATION_FIELDS:
        if key in base:
            raise ConfigError(f"{key}: a command-line flag (--{key}), not a config-file field ({config})")
    if flags.get("resume"):
        return _resumed(cls, flags, base, config)
    cfg = build(cls, base, flags)
    preflight.check_config(cfg)
    return cfg


def _resumed(cls, flags: dict, base: dict, config: str | None):
    """The saved run's config with the changes a resume allows; any other change is refused by name."""
    from cory import preflight

    from cory.outputs import in_use

    run_dir = Path(flags["resume"]).expanduser()
    busy = in_use(run_dir)  # its config.yaml may not be written yet, or be about to change
    if busy:
        raise ConfigError(busy)
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"resume: {saved_path} not found; is {run_dir} a run folder?")
    saved = build_saved(cls, load_yaml(saved_path), saved_path)
    asked = build(cls, {**dataclasses.asdict(saved), **base, "resume": None},
                  {k: v for k, v in flags.items() if k not in ("resume", "output_dir")})
    # what this command sets (in --config or as a flag) must agree with the run, unless it may change
    given = set(base) | set(flags)
    changed = {}
    for name in sorted(given - {"resume", "output_dir"}):
        new, old = getattr(asked, name), getattr(saved, name)
        if new != old:
            if not metadata(cls, name)["on_resume"]:
                may = ", ".join(n for n, _, _, m in field_help(cls) if m["on_resume"] and n not in INVOCATION_FIELDS)
                raise ConfigError(f"resume: {name} is {old!r} in {saved_path}, this command asks for {new!r}; a "
                                  f"resumed run keeps its training settings (may change: {may})")
            changed[name] = new
    if "output_dir" in flags and Path(flags["output_dir"]).expanduser().resolve() != run_dir.resolve():
        raise ConfigError(f"output_dir: a resumed run stays in its folder ({run_dir}); drop --output_dir")
    cfg = dataclasses.replace(saved, **changed, output_dir=str(run_dir), resume=str(run_dir), overwrite=False)
    validate(cfg)
    preflight.check_config(cfg)
    return cfg


def build_saved(cls, saved: dict, path: Path):
    """The saved config of a run as ``cls``: a field the script does not have means another method's run."""
    fields = _field_types(cls)
    foreign = [k for k in saved if k not in fields]
    if foreign:
        raise ConfigError(f"resume: {path} holds fields this script does not have ({', '.join(foreign[:3])}): "
                          "a run of another method; resume it with its own script")
    return build(cls, {k: v for k, v in saved.items() if k not in INVOCATION_FIELDS})


def main(cls, method: str, argv: list[str] | None = None) -> None:
    """Entry point of a training script: user mistakes print one line and exit 2, no traceback."""
    from cory.assets import AssetError
    from cory.train import RunError, train

    try:
        cfg = parse(cls, argv)
        script_task = None if cls in (PPOArgs, CoryArgs) else cls.__dataclass_fields__["task"].default
        if script_task is not None and cfg.task != script_task:
            raise ConfigError(f"task: this script trains {script_task}, the config asks for {cfg.task}; use "
                              f"{cfg.task}_train/{method}.py")
        out = train(cfg, method)
    except (ConfigError, AssetError) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        raise SystemExit(2)
    except RunError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        raise SystemExit(1)
    if os.environ.get("RANK", "0") == "0":  # data-parallel runs: the main process reports
        print(f"done: metrics in {out / 'metrics.jsonl'}, samples in {out / 'samples.jsonl'}, "
              f"models in {out / 'final'}")


_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() splits on


def one_line(text: str) -> str:
    """``text`` with line breaks escaped (a value or path the user typed may hold one)."""
    return "".join(repr(c)[1:-1] if c in _LINE_BREAKS else c for c in text.strip())
