"""Property-based tests of the command line: whatever is wrong with a config file or a flag (malformed
YAML, unknown key, wrong type, out-of-range value, missing file), a training script exits with status 2
and one line naming the field, never a traceback, and leaves the output folder as it was.

Most examples run in-process through ``cory.cli.main``; a tripwire on the first model load turns an
input that validation wrongly accepts into a test failure (and keeps the examples fast). A few real
script runs check the same in a fresh process.
"""
import contextlib
import io
import itertools
import math
import os
import re

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import IMDB_CORY, IMDB_PPO, REPO, run_script
from cory import models
from cory.cli import main
from cory.config import allowed_type, field_types

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PER_FIELD = settings(SETTINGS, max_examples=8)  # parametrized over every field: each one gets its share
PRESET = {IMDB_PPO: REPO / "configs" / "imdb" / "ppo_tiny.yaml", IMDB_CORY: REPO / "configs" / "imdb" / "cory_tiny.yaml"}
IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
_counter = itertools.count()


class Accepted(BaseException):
    """Validation let the input through: the run got as far as loading a model."""


def _tripwire(*args, **kwargs):
    raise Accepted


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """An existing run (must never change) and a scratch folder for config files."""
    root = tmp_path_factory.mktemp("props")
    run = root / "existing_run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 3\n")
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (run / "checkpoints" / "step_000002" / "state.pt").write_bytes(b"state")
    scratch = root / "scratch"
    scratch.mkdir()
    return run, scratch, root / "never_created"


def snapshot(folder):
    return {p.relative_to(folder): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def run_main(argv, cls):
    err, out = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        mp.setattr(models, "load_tokenizer", _tripwire)
        try:
            main(cls, argv)
        except SystemExit as e:
            return e.code, out.getvalue(), err.getvalue()
        except Accepted:
            pytest.fail(f"accepted bad input: {argv}")
    pytest.fail(f"main returned: {argv}")


def assert_rejected(dirs, cls, field, *, flags=(), yaml_text=None, target="fresh"):
    """``flags`` (and ``yaml_text`` as a second config file) on top of the tiny preset are refused."""
    run, scratch, fresh = dirs
    out = {"fresh": [f"--output_dir={fresh}"], "existing": [f"--output_dir={run}"],
           "overwrite": [f"--output_dir={run}", "--overwrite"]}[target]
    argv = ["--config", str(PRESET[cls])]
    if yaml_text is not None:
        path = scratch / f"c{next(_counter)}.yaml"
        path.write_text(yaml_text) if isinstance(yaml_text, str) else path.write_bytes(yaml_text)
        argv = ["--config", str(path)]
        # the preset's values come in as flags, so the file holds only what is under test
        argv += [f"--{k}={v}" for k, v in yaml.safe_load(PRESET[cls].read_text()).items()
                 if not (isinstance(yaml_text, str) and re.search(rf"^{k}\s*:", yaml_text, re.M))]
    before = snapshot(run)
    code, stdout, stderr = run_main(argv + out + list(flags), cls)
    lines = stderr.splitlines()
    assert code == 2, (argv, flags, code, stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), (flags, yaml_text, stderr)
    assert field in lines[0], (field, lines[0])
    assert "Traceback" not in stderr and stdout == ""
    assert snapshot(run) == before
    assert not fresh.exists()
    return lines[0]


# ------------------------------------------------------------------------------------- strategies

def fields_of(cls, *kinds):
    return [(n, tp) for n, tp in field_types(cls).items() if allowed_type(tp)[0] in kinds]


def parses(kind, text) -> bool:
    low = text.strip().lower()
    if low in ("none", "null"):
        return True  # none is a value (for optional fields) with its own message otherwise
    if kind is bool:
        return low in ("true", "1", "yes", "on", "false", "0", "no", "off")
    try:
        kind(text)
        return True
    except ValueError:
        return False


YAML_NON_NUMBERS = st.one_of(st.text(max_size=8).filter(lambda t: not re.fullmatch(r"[-+.\deE]*", t.strip())),
                             st.booleans(), st.lists(st.integers(), max_size=2),
                             st.dictionaries(IDENT, st.integers(), max_size=1))
WRONG_YAML = {
    bool: st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=8), st.lists(st.booleans(), max_size=2)),
    int: st.one_of(st.floats(allow_nan=False), YAML_NON_NUMBERS),
    float: YAML_NON_NUMBERS,
    str: st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.text(max_size=3), max_size=2)),
}


@PER_FIELD
@pytest.mark.parametrize("name", sorted(field_types(IMDB_CORY)))
@given(data=st.data())
def test_wrong_type_names_the_field(dirs, name, data):
    cls = IMDB_CORY if name not in field_types(IMDB_PPO) else data.draw(st.sampled_from([IMDB_PPO, IMDB_CORY]))
    kind = allowed_type(field_types(cls)[name])[0]
    target = data.draw(st.sampled_from(["fresh", "existing", "overwrite"]))
    # every flag value is text: only non-text fields can get the wrong type from a flag
    if kind is not str and data.draw(st.booleans()):
        text = data.draw(st.text(max_size=10).filter(lambda t: not parses(kind, t)))
        assert_rejected(dirs, cls, name, flags=[f"--{name}={text}"], target=target)
    else:
        value = data.draw(WRONG_YAML[kind])
        assert_rejected(dirs, cls, name, yaml_text=yaml.safe_dump({name: value}), target=target)


def below(limit, strict=True):
    return st.floats(max_value=limit, exclude_max=not strict, allow_nan=False)


BAD_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf])
OUT_OF_RANGE = {
    **{n: st.integers(max_value=0) for n in ("steps", "batch_size", "mini_batch_size", "gradient_accumulation_steps",
                                             "ppo_epochs", "response_length_min", "save_every", "save_total_limit",
                                             "lora_r", "lora_alpha", "num_generations")},
    **{n: st.one_of(below(0), BAD_FLOATS) for n in ("learning_rate", "target", "horizon", "temperature",
                                                     "repetition_penalty")},
    "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2 ** 31)),
    "samples_per_step": st.integers(max_value=-1),
    "top_k": st.integers(max_value=-1),
    "top_p": st.one_of(below(0), st.floats(min_value=1, exclude_min=True), BAD_FLOATS),
    "init_kl_coef": st.one_of(below(0, strict=False), BAD_FLOATS),
    "gamma": st.one_of(below(0, strict=False), st.floats(min_value=1, exclude_min=True)),
    "lam": st.one_of(below(0, strict=False), st.floats(min_value=1, exclude_min=True)),
    "cliprange": below(0, strict=False),
    "cliprange_value": below(0, strict=False),
    "vf_coef": st.one_of(below(0, strict=False), BAD_FLOATS),
    "lora_dropout": st.one_of(below(0, strict=False), st.floats(min_value=1)),
    "max_grad_norm": st.one_of(below(0), BAD_FLOATS),
    "score_clip": st.one_of(below(0), BAD_FLOATS),
    "response_length_max": st.integers(max_value=3),  # the preset's minimum is 4
    "batch_size": st.integers(min_value=1).filter(lambda b: b % 2),  # the preset's mini-batch is 2
    "kl_penalty": st.text(max_size=8).filter(lambda t: t not in ("full", "kl", "abs", "mse")),
    "report_to": st.text(max_size=8).filter(lambda t: t not in ("none", "wandb")),
    "on_nonfinite": st.text(max_size=8).filter(lambda t: t not in ("stop", "skip")),
    "value_head_init": st.text(max_size=8).filter(lambda t: t not in ("trl", "zero")),
    "advantage_estimator": st.text(max_size=8).filter(lambda t: t not in ("gae", "rloo", "grpo")),
    "task": st.text(max_size=8).filter(lambda t: t not in ("imdb", "gsm8k")),
    "dataset": st.text(max_size=8).filter(lambda t: t not in ("auto", "hub", "builtin")),
    "model_name": st.sampled_from(["embedded:nope", "a--b", "x/../y", " ", "org/name/extra"]),
    "reward_model": st.sampled_from(["sentiment-xl", "distilbert", "VADER"]),
    "output_dir": st.sampled_from(["", "  "]),
}
CORY_OUT_OF_RANGE = {"swap_period": st.integers(max_value=-1), "other_reward_coef": BAD_FLOATS}


@PER_FIELD
@pytest.mark.parametrize("name", sorted({**OUT_OF_RANGE, **CORY_OUT_OF_RANGE}))
@given(data=st.data())
def test_out_of_range_names_the_field(dirs, name, data):
    cls = IMDB_CORY if name in CORY_OUT_OF_RANGE else data.draw(st.sampled_from([IMDB_PPO, IMDB_CORY]))
    value = data.draw({**OUT_OF_RANGE, **CORY_OUT_OF_RANGE}[name])
    target = data.draw(st.sampled_from(["fresh", "existing", "overwrite"]))
    if name == "output_dir":  # the folder under test is the bad value itself
        assert_rejected(dirs, cls, name, flags=[f"--output_dir={value}"])
    elif data.draw(st.booleans()):
        text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
        assume(isinstance(value, str) or "\n" not in text)
        assert_rejected(dirs, cls, name, flags=[f"--{name}={text}"], target=target)
    else:
        assert_rejected(dirs, cls, name, yaml_text=yaml.safe_dump({name: value}), target=target)


@SETTINGS
@given(data=st.data())
def test_unknown_field_is_named(dirs, data):
    cls = data.draw(st.sampled_from([IMDB_PPO, IMDB_CORY]))
    name = data.draw(IDENT.filter(lambda n: n not in field_types(cls) and n != "config"))
    value = data.draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans()))
    if data.draw(st.booleans()):
        assert_rejected(dirs, cls, name, flags=[f"--{name}={value}"], target="existing")
    else:
        assert_rejected(dirs, cls, name, yaml_text=yaml.safe_dump({name: value}), target="overwrite")


YAML_PIECES = st.sampled_from(["steps", ":", " ", "\n", "  ", "-", "[", "]", "{", "}", "'", '"', "!!", "&a",
                               "*a", "?", "#", "|", ">", "\t", "1", "2024-02-30", ",", "%YAML", "---", "..."])


def malformed(text) -> bool:
    """Not a mapping of fields: unparsable YAML, or a document that is not a mapping."""
    try:
        data = yaml.safe_load(text)
    except Exception:
        return True
    return data is not None and not isinstance(data, dict)


@SETTINGS
@given(text=st.one_of(st.text(max_size=40), st.lists(YAML_PIECES, max_size=12).map("".join)),
       cls=st.sampled_from([IMDB_PPO, IMDB_CORY]))
def test_malformed_yaml_names_the_config(dirs, text, cls):
    assume(malformed(text))
    assert_rejected(dirs, cls, "config", yaml_text=text, target="overwrite")


@pytest.mark.parametrize("text", [b"\xff\xfe\x00bad", "seed: 2024-02-30\n", "[" * 500 + "]" * 500, "steps: 3\nsteps: [\n"])
def test_unreadable_config_files(dirs, text):
    assert_rejected(dirs, IMDB_PPO, "config", yaml_text=text, target="existing")


@SETTINGS
@given(name=IDENT, cls=st.sampled_from([IMDB_PPO, IMDB_CORY]),
       field=st.sampled_from(["config", "dataset_path", "resume", "reward_model", "model_name"]))
def test_missing_files_are_named(dirs, name, cls, field):
    missing = str(dirs[1] / "missing" / name)
    assert_rejected(dirs, cls, field, flags=[f"--{field}={missing}"], target="overwrite")


def test_other_bad_paths(dirs, tmp_path):
    run, _, _ = dirs
    not_a_model = tmp_path / "empty_folder"
    not_a_model.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    no_positive = tmp_path / "classifier"
    no_positive.mkdir()
    (no_positive / "config.json").write_text('{"id2label": {"0": "NEG", "1": "NEUTRAL"}}')
    for flags, field in [([f"--model_name={not_a_model}"], "model_name"),
                         ([f"--reward_model={not_a_model}"], "reward_model"),
                         ([f"--reward_model={no_positive}"], "reward_model"),
                         ([f"--resume={not_a_model}"], "resume"),
                         (["--resume="], "resume"),
                         (["--load_in_4bit"], "load_in_4bit"),
                         ([f"--output_dir={a_file}"], "output_dir"),
                         ([f"--output_dir={tmp_path}", "--overwrite"], "output_dir")]:  # not a run folder
        assert_rejected(dirs, IMDB_PPO, field, flags=flags)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classifier", "empty_folder", "file.txt"]
    # resume/overwrite belong to one invocation, never to a config file
    assert_rejected(dirs, IMDB_PPO, "resume", yaml_text=f"resume: {run}\n")
    # the message stays on one line whatever the user typed
    line = assert_rejected(dirs, IMDB_PPO, "config", flags=["--config", "/no\nsuch\u2028file.yaml"])
    assert "\\n" in line


def test_valid_input_reaches_model_loading(dirs):
    """The tripwire is live: the rejections above come from validation, not from the harness."""
    _, scratch, fresh = dirs
    for cls in (IMDB_PPO, IMDB_CORY):
        with pytest.raises(Accepted), pytest.MonkeyPatch.context() as mp:
            mp.setattr(models, "load_tokenizer", _tripwire)
            main(cls, ["--config", str(PRESET[cls]), f"--output_dir={fresh}", "--learning_rate=1e-3"])
    path = scratch / "exp.yaml"
    path.write_text("learning_rate: 1e-4\nmax_grad_norm: null\n")  # YAML 1.1 reads 1e-4 as text
    with pytest.raises(Accepted), pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "load_tokenizer", _tripwire)
        main(IMDB_PPO, ["--config", str(path), "--model_name=tiny", "--reward_model=vader",
                              f"--output_dir={fresh}"])
    assert not fresh.exists()


@pytest.mark.parametrize("script,args,field", [
    ("imdb_train/cory.py", ["--config", "{bad_yaml}"], "config"),
    pytest.param("gsm8k_train/ppo.py", ["--config", "configs/gsm8k/ppo_tiny.yaml", "--dataset_path", "{missing}"],
                 "dataset_path", marks=pytest.mark.slow),  # ~30 s of imports before its refusal
    ("imdb_train/ppo.py", ["--config", "configs/imdb/ppo_tiny.yaml", "--overwrite", "--seed", "-1"], "seed"),
])
def test_scripts_reject_bad_input_in_a_fresh_process(tmp_path, script, args, field):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 1\n")
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    before = snapshot(run)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("steps: 3\nseed: 2024-02-30\n")
    args = [a.format(bad_yaml=bad_yaml, missing=tmp_path / "missing") for a in args]
    p = run_script(script, *args, "--output_dir", run, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("error: ") and field in p.stderr
    assert snapshot(run) == before and sorted(os.listdir(tmp_path)) == ["bad.yaml", "run"]
