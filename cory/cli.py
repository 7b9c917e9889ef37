"""The command line shared by the training scripts: ``--config FILE.yaml`` then ``--field value``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from cory.config import INVOCATION_FIELDS, ConfigError, build, field_help, load_yaml

USAGE = "usage: {prog} [--config FILE.yaml] [--field value ...] [--resume RUN_DIR] [--overwrite]"


def _help(cls, prog: str) -> str:
    lines = [USAGE.format(prog=prog), "",
             "Values come from the script's defaults, then the YAML file, then the flags.", "fields:"]
    for name, tp, default in field_help(cls):
        lines.append(f"  --{name:<28} {tp:<14} default: {default}")
    return "\n".join(lines)


def split_flags(cls, argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """(config path, {field: raw string}) from ``argv``; bool flags may stand alone (``--overwrite``)."""
    from cory.config import _allowed, _field_types

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
    """The resolved config. ``--resume DIR`` starts from the config saved in DIR."""
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
        run_dir = Path(flags["resume"])
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"resume: {saved} not found; is {run_dir} a run folder?")
        base = {**load_yaml(saved), **({} if config is None else base)}
        flags["output_dir"] = str(run_dir)
    return build(cls, base, flags)


def main(cls, method: str, argv: list[str] | None = None) -> None:
    """Entry point of a training script: user mistakes print one line and exit 2, no traceback."""
    from cory.assets import AssetError
    from cory.trainer import RunError, train

    try:
        cfg = parse(cls, argv)
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
