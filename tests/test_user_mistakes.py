"""Mistakes a new user makes, each ending with one line and exit status 2 (or, for SIGTERM, a saved checkpoint
and a clean resume), and nothing outside a run folder ever deleted. The list of such mistakes, case by case."""
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, TINY, one_line, rejected, run_script, start_script, wait_for_rows
from cory.run.outputs import folder_id, latest_checkpoint, read_jsonl


# ----------------------------------------------------------------------------- data loss

def test_overwrite_never_deletes_a_folder_that_is_not_a_run(tmp_path):
    project = tmp_path / "my_project"
    project.mkdir()
    (project / "config.yaml").write_text("lr: 1\n")
    (project / "important.txt").write_text("keep me")
    line = rejected("imdb", "ppo", TINY + ["--output_dir", project, "--overwrite"])
    assert "output_dir" in line and "not a run folder" in line
    assert (project / "important.txt").read_text() == "keep me"


def test_overwrite_refuses_a_run_folder_holding_other_files(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished / "ppo", run)
    (run / "notes.txt").write_text("mine")
    line = rejected("imdb", "ppo", TINY + ["--output_dir", run, "--overwrite"])
    assert "notes.txt" in line
    assert (run / "notes.txt").read_text() == "mine" and (run / "metrics.jsonl").is_file()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}\.(txt|yaml|json|py)", fullmatch=True), min_size=1,
                      max_size=4, unique=True))
def test_overwrite_property_foreign_files_survive(tmp_path_factory, names):
    folder = tmp_path_factory.mktemp("user")
    for n in names:
        (folder / n).write_text(n)
    (folder / "cory_run.json").write_text('{"project": "cory", "method": "ppo", "task": "imdb"}')
    ours = {"config.yaml", "metrics.jsonl", "samples.jsonl", "cory_run.json"}
    if set(names) <= ours:
        return  # only what a run writes: replacing it is what --overwrite is for
    rejected("imdb", "ppo", TINY + ["--output_dir", folder, "--overwrite"])
    assert all((folder / n).read_text() == n for n in names if n not in ours)


# ----------------------------------------------------------------------------- preemption

def start(out, *args):
    return start_script("imdb_train/cory.py", "--config", "configs/imdb/cory_tiny.yaml", "--output_dir", out, *args)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    out = tmp_path / "run"
    proc = start(out, "--steps", "4", "--save_every", "100")
    wait_for_rows(proc, out / "metrics.jsonl", 1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr and f"continue with --resume {out}" in stderr
    done = len(read_jsonl(out / "metrics.jsonl"))
    assert 1 <= done < 4 and latest_checkpoint(out).name == f"step_{done:06d}"
    p = run_script("imdb_train/cory.py", "--resume", out)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2, 3]


def signal_twice(proc, signum) -> None:
    """A stop signal, then a second one while the run handles the first."""
    proc.send_signal(signum)
    time.sleep(0.05)
    proc.send_signal(signum)


@pytest.mark.slow
def test_stopped_before_a_checkpoint_the_advice_leads_somewhere(tmp_path):
    out = tmp_path / "run"
    proc = start(out, "--steps", "3", "--save_every", "100")
    wait_for_rows(proc, out / "metrics.jsonl", 1)
    signal_twice(proc, signal.SIGINT)  # the second one: stop now, save nothing
    _, stderr = proc.communicate(timeout=600)
    if latest_checkpoint(out) is None:  # the second signal came before the first could save
        assert f"start again with --resume {out}" in stderr, stderr[-2000:]
    # whichever it was, --resume now continues or restarts the run, to the end
    p = run_script("imdb_train/cory.py", "--resume", out)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2]


@pytest.mark.slow
def test_resume_of_a_run_without_checkpoint_restarts_it(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # a run stopped before its first checkpoint in this folder (its manifest records the folder)
    (out / "cory_run.json").write_text(json.dumps({"project": "cory", "method": "ppo", "task": "imdb",
                                                   "folder": folder_id(out)}))
    cfg = yaml.safe_load((REPO / "configs/imdb/ppo_tiny.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({**cfg, "steps": 2, "output_dir": str(out)}))
    (out / "metrics.jsonl").write_text('{"step": 0, "policy/kl": 1.0}\n')  # a row from before the stop
    p = run_script("imdb_train/ppo.py", "--resume", out)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["policy/kl"] != 1.0


# ----------------------------------------------------------------------------- silently wrong runs

def test_dataset_path_is_never_ignored(tmp_path):
    line = rejected("gsm8k", "cory", ["--config", "configs/gsm8k/cory_tiny.yaml",
                                      "--dataset_path", REPO.parent / "shared" / "data" / "gsm8k",
                                      "--output_dir", tmp_path / "r"])
    assert line.startswith("error: dataset_path:") and "generated" in line
    line = rejected("imdb", "ppo", TINY + ["--dataset_path", tmp_path, "--output_dir", tmp_path / "r"])
    assert line.startswith("error: dataset_path:")


@pytest.mark.parametrize("flags", [["--dataset_path", "/nonexistent/gsm8k"], ["--model_name", "x/../y"],
                                   ["--reward_model", "VADER"]])
def test_a_mistake_is_refused_before_the_training_stack_loads(flags):
    """The checks that need no model run before torch and trl are imported (seconds), not after."""
    code = ("import runpy, sys\n"
            f"sys.argv = ['gsm8k_train/cory.py', *{flags!r}]\n"
            "try:\n    runpy.run_path('gsm8k_train/cory.py', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules, 'trl' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.stdout.split() == ["exit", "2", "False", "False"], (p.stdout, p.stderr[-2000:])
    assert p.stderr.startswith(f"error: {flags[0][2:]}:") and len(p.stderr.strip().splitlines()) == 1


def test_a_script_refuses_a_config_of_another_task(tmp_path):
    line = rejected("imdb", "cory", ["--config", "configs/gsm8k/cory_tiny.yaml", "--output_dir", tmp_path / "r"])
    assert "task" in line and "gsm8k_train/cory.py" in line


def test_resume_checks_the_run_against_the_script(finished):
    line = rejected("gsm8k", "cory", ["--resume", finished / "cory"])
    assert "task" in line and "imdb" in line
    line = rejected("imdb", "cory", ["--resume", finished / "ppo"])
    assert "ppo run" in line and "imdb_train/ppo.py" in line
    line = rejected("imdb", "ppo", ["--resume", finished / "cory"])
    assert "cory run" in line and "imdb_train/cory.py" in line


@pytest.mark.parametrize("flags,field", [
    (["--learning_rate", "0.5", "--batch_size", "8"], "batch_size"),  # named in order; both are refused
    (["--learning_rate", "0.5"], "learning_rate"),
    (["--model_name", "embedded:smollm2-135m"], "model_name"),
    (["--config", "configs/imdb/ppo_cpu.yaml"], "batch_size"),
])
def test_resume_refuses_changed_training_settings(finished, flags, field):
    before = (finished / "ppo" / "config.yaml").read_text()
    line = rejected("imdb", "ppo", ["--resume", finished / "ppo", *flags])
    assert f"resume: {field} is" in line and "may change: " in line
    assert (finished / "ppo" / "config.yaml").read_text() == before


@pytest.mark.slow
def test_resume_may_extend_a_finished_run(finished, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    p = run_script("imdb_train/ppo.py", "--resume", run, "--steps", "3", "--save_every", "5")
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["steps"] == 3 and saved["save_every"] == 5 and saved["learning_rate"] == 1e-4


# ----------------------------------------------------------------------------- tracebacks

def test_a_model_folder_with_broken_weights(tmp_path):
    from cory import assets
    broken = tmp_path / "broken"
    shutil.copytree(assets.tiny_model_dir(), broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    line = rejected("imdb", "ppo", TINY + ["--model_name", broken, "--output_dir", tmp_path / "r"], tripwire=False)
    assert "model_name" in line and "broken" in line
    assert not (tmp_path / "r").exists()


def test_output_dir_under_a_file_or_unwritable(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    line = rejected("imdb", "ppo", TINY + ["--output_dir", a_file / "run"])
    assert "output_dir" in line and "is a file" in line
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "permission" in rejected("imdb", "ppo", TINY + ["--output_dir", locked / "run"])


def test_a_corrupted_checkpoint(finished, tmp_path):
    run = tmp_path / "cory"
    shutil.copytree(finished / "cory", run)
    (latest_checkpoint(run) / "state.pt").write_bytes(b"\x00garbage")
    line = rejected("imdb", "cory", ["--resume", run, "--steps", "3"])  # (a finished run's own: nothing to do)
    assert "state.pt" in line and "cannot be read" in line


def test_corrupted_agent_weights_in_a_checkpoint(finished, tmp_path):
    run = tmp_path / "cory"
    shutil.copytree(finished / "cory", run)
    (latest_checkpoint(run) / "llm2.pt").write_bytes(b"\x00garbage")
    line = rejected("imdb", "cory", ["--resume", run, "--steps", "3"], tripwire=False)
    assert "llm2.pt" in line


def test_wandb_without_a_login_is_refused_before_any_folder(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    line = rejected("imdb", "ppo", TINY + ["--report_to", "wandb", "--output_dir", tmp_path / "r"])
    assert "wandb" in line and "login" in line
    assert not (tmp_path / "r").exists()


def test_answers_longer_than_the_context(tmp_path):
    line = rejected("imdb", "cory", ["--config", "configs/imdb/cory_tiny.yaml", "--response_length_max", "5000",
                                     "--output_dir", tmp_path / "r"])
    assert "response_length_max" in line and "context of 512" in line
    assert not (tmp_path / "r").exists()


BAD_RECORDS = {
    "malformed": "{not json\n",
    "empty": "",
    "no_answer": json.dumps({"question": "2+2?"}) + "\n",
    "no_hashes": json.dumps({"question": "2+2?", "answer": "It is 4."}) + "\n",
    "wrong_type": json.dumps({"question": 7, "answer": "#### 4"}) + "\n",
    "a_list": "[1, 2]\n",
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_gsm8k_files_name_file_and_line(tmp_path, case):
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = json.dumps({"question": "1+1?", "answer": "1+1=2 #### 2"}) + "\n"
    text = BAD_RECORDS[case] if case == "empty" else good + BAD_RECORDS[case]  # the bad record on line 2
    (data / "train.jsonl").write_text(text)
    (data / "test.jsonl").write_text(text)
    for dataset in ("local", "auto"):
        line = rejected("gsm8k", "ppo", ["--config", "configs/gsm8k/ppo_tiny.yaml", "--dataset", dataset,
                                         "--dataset_path", data, "--output_dir", tmp_path / "r"])
        assert "train.jsonl" in line and ("line 2" in line or "no records" in line)
    from lab.evaluate import main as evaluate
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        evaluate(["--task", "gsm8k", "--model", "tiny", "--dataset_path", str(data), "--n", "1", "--k", "1"])
    assert e.value.code == 2 and len(err.getvalue().strip().splitlines()) == 1
    assert "test.jsonl" in err.getvalue() and ("line 2" in err.getvalue() or "no records" in err.getvalue())


def evaluate_rejects(argv) -> str:
    from lab.evaluate import main as evaluate
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        evaluate([str(a) for a in argv])
    lines = err.getvalue().strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and not out.getvalue().strip(), err.getvalue()
    return lines[0]


def test_evaluate_json_to_an_unwritable_place_fails_first(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    line = evaluate_rejects(["--task", "imdb", "--model", "tiny", "--json", a_file / "out.json", "--limit", "2"])
    assert "--json" in line


def test_evaluate_reward_that_is_not_a_classifier_is_one_quiet_line(tmp_path):
    from cory import assets
    line = evaluate_rejects(["--task", "imdb", "--model", "tiny", "--reward", assets.tiny_model_dir()])
    assert "--reward" in line and "POSITIVE" in line


def test_evaluate_reads_only_the_test_split(tmp_path):
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    from lab.evaluate import main as evaluate
    doc = evaluate(["--task", "gsm8k", "--model", "tiny", "--dataset_path", str(data), "--n", "1", "--k", "1",
                    "--max_new_tokens", "4", "--no_base", "--json", str(tmp_path / "e.json")])
    assert doc["results"][0]["n_questions"] == 1


# ----------------------------------------------------------------------------- help

def test_help_explains_every_field():
    p = run_script("imdb_train/cory.py", "--help", timeout=120)
    assert p.returncode == 0
    text = p.stdout
    assert "CORY on IMDB" in text and "--config FILE.yaml" in text
    assert "--kl_penalty" in text and "full | kl | abs | mse" in text
    assert "[resume]" in next(ln for ln in text.splitlines() if ln.strip().startswith("--steps "))
    assert "the paper's T_REx" in text


# ----------------------------------------------------------------------------- silently wrong or unclear

def test_a_finished_run_cannot_be_shortened(finished):
    before = (finished / "ppo" / "config.yaml").read_text()
    line = rejected("imdb", "ppo", ["--resume", finished / "ppo", "--steps", "1"])
    assert "has done 2 iterations, more than --steps 1" in line and "--steps 2 or more" in line
    assert (finished / "ppo" / "config.yaml").read_text() == before
    assert latest_checkpoint(finished / "ppo").name == "step_000002"


@pytest.mark.slow
def test_two_sigterms_exit_143(tmp_path):
    out = tmp_path / "run"
    proc = start(out, "--steps", "3", "--save_every", "100")
    wait_for_rows(proc, out / "metrics.jsonl", 1)
    signal_twice(proc, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nlearning_rate: *a9\n")
    t0 = time.perf_counter()
    line = rejected("imdb", "ppo", ["--config", bomb, "--output_dir", tmp_path / "r"])
    assert time.perf_counter() - t0 < 5
    assert "more than 100,000 values" in line and len(line) < 300


def test_an_oversized_config_or_value_gives_a_short_error(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("learning_rate: 1.0e-4\n" + "# padding\n" * 200_000)
    line = rejected("imdb", "ppo", ["--config", big, "--output_dir", tmp_path / "r"])
    assert "MiB" in line and len(line) < 300
    long = tmp_path / "long.yaml"
    long.write_text(yaml.safe_dump({"learning_rate": list(range(5000))}))
    line = rejected("imdb", "ppo", ["--config", long, "--output_dir", tmp_path / "r"])
    assert line.startswith("error: learning_rate: expected a float, got [0, 1, 2") and len(line) < 200


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("task: imdb\nlearning_rate: 1.0e-4\nsteps: 3\nlearning_rate: 1.0e-2\n")
    line = rejected("imdb", "ppo", ["--config", twice, "--output_dir", tmp_path / "r"])
    assert "'learning_rate' is given twice (lines 2 and 4)" in line


def test_a_tilde_in_a_yaml_output_dir_is_the_home_folder(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "tilde.yaml"
    preset = (REPO / "configs/imdb/ppo_tiny.yaml").read_text().splitlines()
    cfg.write_text("".join(ln + "\n" for ln in preset if not ln.startswith("output_dir:")) + "output_dir: ~/runs/x\n")
    (home / "runs" / "x").mkdir(parents=True)
    (home / "runs" / "x" / "mine.txt").write_text("mine")  # a folder that is not a run: refused, so nothing loads
    line = rejected("imdb", "ppo", ["--config", cfg])
    assert f"{home}/runs/x already holds files" in line
    assert not (tmp_path / "~").exists()
    assert "a leading ~ is your home folder" in run_script("imdb_train/ppo.py", "--help", timeout=120).stdout


def long_question_data(tmp_path):
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = json.dumps({"question": "1+1?", "answer": "1+1=2 #### 2"}) + "\n"
    long = json.dumps({"question": "How many apples? " * 300, "answer": "#### 3"}) + "\n"
    (data / "train.jsonl").write_text(good + "\n" + long)  # the long one on line 3, after a blank line
    (data / "test.jsonl").write_text(good + long)
    return data


def test_a_gsm8k_question_longer_than_the_context_is_named_before_the_model_loads(tmp_path, monkeypatch):
    from cory import agent

    data = long_question_data(tmp_path)
    monkeypatch.setattr(agent, "make_agents", _no_model)
    line = rejected("gsm8k", "cory", ["--config", "configs/gsm8k/cory_tiny.yaml", "--dataset", "local",
                                      "--dataset_path", data, "--output_dir", tmp_path / "r"], tripwire=False)
    assert f"{data / 'train.jsonl'} line 3: its prompt is" in line and "context of 512 tokens" in line
    assert not (tmp_path / "r").exists()
    line = evaluate_rejects(["--task", "gsm8k", "--model", "tiny", "--dataset_path", data, "--n", "1", "--k", "1",
                             "--no_base"])
    assert f"{data / 'test.jsonl'} line 2: its prompt is" in line and "--max_new_tokens" in line


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded")


@pytest.mark.parametrize("answer", ["3/4", "2 1/2", "1e3", "1 000"])
def test_a_gsm8k_reference_that_is_not_one_number_is_refused(tmp_path, answer):
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = json.dumps({"question": "1+1?", "answer": "1+1=2 #### 2"}) + "\n"
    (data / "train.jsonl").write_text(good + json.dumps({"question": "How much?", "answer": f"so #### {answer}"}))
    (data / "test.jsonl").write_text(good)
    line = rejected("gsm8k", "ppo", ["--config", "configs/gsm8k/ppo_tiny.yaml", "--dataset", "local",
                                     "--dataset_path", data, "--output_dir", tmp_path / "r"])
    assert f"train.jsonl line 2: 'answer' ends in '#### {answer}', not one number" in line


def test_non_utf8_data_names_the_line(tmp_path):
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = (json.dumps({"question": "1+1?", "answer": "1+1=2 #### 2"}) + "\n").encode()
    (data / "train.jsonl").write_bytes(good * 2 + '{"question": "caf\u00e9?", "answer": "#### 1"}\n'.encode("latin-1"))
    (data / "test.jsonl").write_bytes(good)
    line = rejected("gsm8k", "ppo", ["--config", "configs/gsm8k/ppo_tiny.yaml", "--dataset", "local",
                                     "--dataset_path", data, "--output_dir", tmp_path / "r"])
    assert "train.jsonl line 3 is not UTF-8 text" in line


def test_an_unwritable_cache_names_the_folder_and_the_variable(tmp_path, monkeypatch):
    from cory import agent

    a_file = tmp_path / "file"
    a_file.write_text("x")
    monkeypatch.setenv("HOME", str(a_file / "home"))  # unwritable even for root: a path through a file
    monkeypatch.delenv("CORY_CACHE", raising=False)
    monkeypatch.setattr(agent, "make_agents", _no_model)
    line = rejected("imdb", "ppo", TINY + ["--output_dir", tmp_path / "r"], tripwire=False)
    assert f"cannot write the model cache {a_file}/home/.cache/cory" in line and "set CORY_CACHE" in line
    assert not (tmp_path / "r").exists()  # the folder the run had made for its lock went with it


def test_evaluate_refuses_a_model_of_another_architecture(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(bert)
    line = evaluate_rejects(["--task", "imdb", "--model", bert, "--reference", "tiny", "--limit", "2"])
    assert f"--model {bert}: {bert} holds a BertForMaskedLM" in line and "not a causal language model" in line


def test_evaluate_bounds_the_samples_per_question():
    line = evaluate_rejects(["--task", "gsm8k", "--model", "tiny", "--n", "100000000", "--k", "100000000"])
    assert line.startswith("error: --n: at most 1000 samples per question, got 100000000")


@pytest.mark.parametrize("damage", ["missing", "half_written"])
def test_a_model_without_its_tokenizer_says_so(finished, tmp_path, damage):
    model = tmp_path / "llm1"
    shutil.copytree(finished / "cory" / "final" / "llm1", model)
    if damage == "missing":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (model / name).unlink()
    else:
        (model / "tokenizer.json").unlink()  # a copy cut short: the config without the vocabulary
    line = evaluate_rejects(["--task", "imdb", "--model", model, "--reference", "tiny", "--limit", "2"])
    assert line.startswith(f"error: --model: {model} has no usable tokenizer"), line


@pytest.mark.parametrize("flag", ["--model", "--reference"])
def test_evaluate_names_the_flag_whose_tokenizer_cannot_pad(tmp_path, flag):
    """The loaders name their config field; evaluate passes its own flag instead, the one that was given."""
    from cory import assets

    model = tmp_path / "model"
    shutil.copytree(assets.tiny_model_dir(), model)
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config.update(pad_token=None, eos_token=None, bos_token=None, unk_token=None)
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    models = {"--model": model, "--reference": "tiny"} if flag == "--model" else {"--model": "tiny", "--reference": model}
    line = evaluate_rejects(["--task", "imdb", *[str(a) for kv in models.items() for a in kv], "--limit", "2"])
    assert line.startswith(f"error: {flag}: the tokenizer of {model} has no pad token"), line


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["wandb", "tensorboard"])
def test_loggers_write_inside_the_run_folder(tmp_path, logger):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    p = subprocess.run([sys.executable, str(REPO / "imdb_train/ppo.py"), "--config", str(REPO / TINY[1]),
                        "--steps", "2", "--report_to", logger, "--output_dir", str(out)],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert list(cwd.iterdir()) == []  # nothing in the folder the run was started from
    assert (out / logger).is_dir()
    if logger == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        events = EventAccumulator(str(out / "tensorboard")).Reload()
        assert [e.step for e in events.Scalars("policy/kl")] == [0, 1]
    from cory.run.outputs import scan_run_dir
    assert scan_run_dir(out)[1] == []  # the logger's folder is a run's own: --overwrite replaces it with the rest


# ----------------------------------------------------------------------------- a resume, a value, a folder, YAML

@pytest.mark.slow
def test_resume_refuses_a_hand_edited_config(finished, tmp_path):
    out = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", out)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("learning_rate: 0.0001", "learning_rate: 1.0e-06"))
    edited = config.read_text()
    line = one_line(run_script("imdb_train/ppo.py", "--resume", out, "--steps", "3"), 2)
    assert "config.yaml says learning_rate 1e-06" in line and "trained with 0.0001" in line
    assert config.read_text() == edited and not (out / "final" / "policy" / "x").exists()


def test_a_horizon_that_would_turn_the_kl_penalty_into_a_bonus_is_refused():
    line = rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_tiny.yaml", "--adap_kl_ctrl", "true",
                                    "--target", "1000", "--horizon", "0.5"])
    assert "horizon: 0.5" in line and "zero or negative" in line and "0.8" in line


def test_another_methods_run_folder_gets_advice_that_works(finished):
    line = rejected("imdb", "cory", ["--config", "configs/imdb/cory_tiny.yaml", "--output_dir", finished / "ppo"])
    assert "holds a ppo run on imdb; continue it with imdb_train/ppo.py --resume" in line


@pytest.mark.parametrize("text,expected", [
    ("_tiny: &t\n  learning_rate: 1.0e-4\n  batch_size: 4\nlearning_rate: *t\n", None),  # an alias as a value
    ("steps: &n 2\nsave_every: *n\n", {"steps": 2, "save_every": 2}),
    ("defaults: &d {steps: 2}\n<<: *d\nsave_every: 1\n", {"steps": 2, "save_every": 1}),
])
def test_yaml_anchors_aliases_and_merge_keys_are_yaml(tmp_path, text, expected):
    from cory.config import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text(text)
    data = load_yaml(path)
    if expected is not None:
        assert {k: data[k] for k in expected} == expected
    else:
        assert data["learning_rate"] == {"learning_rate": 1e-4, "batch_size": 4}


@pytest.mark.slow
def test_the_projects_environment_variables_act_only_where_they_mean_something(tmp_path):
    """CORY_RUNNER_PID exported in a shell (not the run's parent) read as "the runner is gone" and stopped the run
    after its first iteration; CORY_CUDA_SHARE, a share of a GPU, refused a CPU run over a bad value. Both are ignored
    where they mean nothing: the run trains all its iterations."""
    from conftest import run_script
    from cory.run.outputs import read_jsonl

    out = tmp_path / "run"
    p = run_script("imdb_train/ppo.py", "--config", "configs/imdb/ppo_tiny.yaml", "--steps", "2", "--output_dir", out,
                   env={"CORY_RUNNER_PID": "1", "CORY_CUDA_SHARE": "half", "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1] and (out / "final").is_dir()
    assert "CORY_RUNNER_PID=1 is not this run's parent process" in p.stderr and "gone" not in p.stderr


@pytest.mark.slow
def test_a_heldout_evaluation_shows_its_bar_prints_its_line_and_reaches_tensorboard(tmp_path):
    """A tiny run with eval_every: the evaluation's bar and one line per evaluation on the console, and its numbers
    under eval/ in TensorBoard at the iteration just done (the base model's at 0)."""
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, str(REPO / "arithmetic_train/ppo.py"), "--config",
                        str(REPO / "configs/arithmetic/ppo_tiny.yaml"), "--steps", "2", "--eval_every", "1",
                        "--report_to", "tensorboard", "--output_dir", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "held-out evaluation" in p.stderr  # the bar's label
    for done in (0, 1, 2):
        line = next(ln for ln in p.stderr.replace("\r", "\n").splitlines()
                    if ln.startswith(f"held-out after {done} iterations: "))
        assert "policy reward " in line and ", KL " in line
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("eval/policy/task_reward")] == [0, 0, 1]
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [e.value for e in events.Scalars("eval/policy/task_reward")] == pytest.approx(
        [r["task_reward"] for r in rows])


def test_a_manifest_without_its_task_names_the_script_generically(finished, tmp_path):
    """A manifest and a config.yaml naming no task (edited, or damaged): the advice names the method's script of
    the run's task, never "None_train/ppo.py"."""
    run = tmp_path / "ppo"
    shutil.copytree(finished / "ppo", run)
    manifest = json.loads((run / "cory_run.json").read_text())
    del manifest["task"]
    (run / "cory_run.json").write_text(json.dumps(manifest))
    line = rejected("imdb", "cory", ["--config", "configs/imdb/cory_tiny.yaml", "--output_dir", run])
    assert "holds a ppo run on imdb; continue it with imdb_train/ppo.py --resume" in line  # its config.yaml's task
    config = run / "config.yaml"
    config.write_text("".join(ln for ln in config.read_text().splitlines(True) if not ln.startswith("task:")))
    for argv in (["--resume", run, "--steps", "3"],
                 ["--config", "configs/imdb/cory_tiny.yaml", "--output_dir", run]):
        line = rejected("imdb", "cory", argv)
        assert "None" not in line, line
        assert "continue it with <task>_train/ppo.py, the script of the task it was trained on" in line, line
