"""The report and the search name every file they skip: an evaluation cut in half, a runs.json of another task or
of another shape, a config.yaml that holds no config, a held-out row without a reward; two folders of one seed
are refused (which one is the result cannot be told). Each through its entry point, on a copy of a committed
experiment, and the runs' files are the same afterwards (the commands only read them)."""
import json
import os
import shutil

import pytest

from conftest import REPO
from entry_points import lab, refused, succeeded, tree

COMMITTED = REPO / "results" / "imdb_cpu_learning"
SEARCH = REPO / "results" / "imdb_cpu_search"


@pytest.fixture
def exp(tmp_path):
    out = tmp_path / "imdb_cpu_learning"
    shutil.copytree(COMMITTED, out)
    return out


def reported(exp) -> str:
    """The report of ``exp`` (it must succeed, leaving the runs as they were), as text."""
    before = tree(exp / "runs")
    succeeded(lab("report", exp))
    assert tree(exp / "runs") == before
    return (exp / "REPORT.md").read_text()


@pytest.mark.slow
def test_an_evaluation_cut_in_half_is_named(exp):
    result = exp / "runs" / "ppo" / "seed_1" / "eval_imdb.json"
    text = result.read_text()
    assert "| PPO | 8 |" in reported(exp)
    result.write_text(text[: len(text) // 2])
    report = reported(exp)
    assert "`ppo/seed_1/eval_imdb.json` cannot be read (cut short or damaged); left out" in report
    assert "| PPO | 7 |" in report  # the held-out table counts the seeds it read


def test_a_seed_in_two_folders_is_refused(exp):
    shutil.copytree(exp / "runs" / "ppo" / "seed_1", exp / "runs" / "ppo" / "seed_01")
    before = tree(exp)
    refused(lab("report", exp), f"{exp}/runs/ppo/seed_01 and {exp}/runs/ppo/seed_1 both hold seed 1",
            "keep one of them")
    assert tree(exp) == before


@pytest.mark.parametrize("where", ["logs/cory/seed_0.log", "runs/ppo/seed_1/cory_run.json", "runs.json",
                                   "eval_base_imdb.json", "notes.md"])
def test_a_pipe_in_the_folder_is_refused_not_waited_on(exp, where):
    """A run's log (its precision line), a manifest, the record, an evaluation, a document beside the figures: the
    report opened each and waited for a writer that never came."""
    (exp / where).unlink(missing_ok=True)
    os.mkfifo(exp / where)
    before = tree(exp)
    refused(lab("report", exp, timeout=120), f"{exp / where}: a named pipe, not a regular file",
            f"move it out of {exp}")
    assert tree(exp) == before


@pytest.mark.slow
def test_a_runs_json_of_another_task_is_named_not_used(exp):
    shutil.copy(REPO / "results" / "gsm8k_cpu" / "runs.json", exp / "runs.json")
    report = reported(exp)
    assert report.startswith("# CORY vs PPO: IMDB\n")
    assert "runs.json describes a gsm8k experiment, but the runs here are imdb runs; it is not used" in report
    assert "gsm8k_train" not in report


@pytest.mark.slow
def test_a_runs_json_holding_a_list_is_named(exp):
    (exp / "runs.json").write_text("[1, 2]\n")
    report = reported(exp)
    assert "runs.json holds a JSON list, not the runner's record" in report


@pytest.mark.parametrize("shape,says", [
    ({"runs": [1]}, "runs.json's runs are a JSON list, not an object of runs"),
    ({"runs": {"ppo/seed_0": 3}}, "runs.json's run 'ppo/seed_0' is a JSON number, not a run's record"),
    ({"runs": {"ppo/seed_0": {"attempts": [{"wall_time_s": "1 h"}]}}}, "attempt whose wall_time_s is a JSON string"),
    ({"invocations": ["python -m lab.experiments"]}, "runs.json's invocations are not a list of objects"),
    ({"task": ["imdb"]}, "runs.json's task is a JSON list, not a string"),
])
def test_a_runs_json_of_another_shape_is_named_not_used(exp, shape, says):
    """Each gave the report a traceback where it read the record (its attempts' wall times, the failed runs)."""
    from lab.report import provenance_section
    from lab.results import load_experiment

    (exp / "runs.json").write_text(json.dumps(shape))
    loaded = load_experiment(exp)
    assert loaded.runs_json == {}
    assert any(says in n and n.endswith("; the commands and wall times are missing.") for n in loaded.notes)
    assert "_No runs.json" in provenance_section(loaded)


@pytest.mark.slow
def test_a_config_holding_a_list_is_named(exp):
    (exp / "runs" / "cory" / "seed_2" / "config.yaml").write_text("- 1\n- 2\n")
    report = reported(exp)
    assert "`cory/seed_2`: config.yaml holds a list, not a config; its settings are left out" in report


def test_the_runner_refuses_a_runs_json_holding_a_list(exp):
    (exp / "runs.json").write_text("[1, 2]\n")
    before = tree(exp)
    refused(lab("experiments", "--task", "imdb", "--preset", "cpu", "--methods", "ppo", "--seeds", "0", "--steps",
                "20", "--out", exp), "runs.json holds a JSON list, not the runner's record", "fix or remove it")
    assert tree(exp) == before


@pytest.mark.slow
def test_latin1_bytes_are_a_note_or_one_line(exp):
    """A byte that is not UTF-8 (Latin-1 'é') in a seed's config.yaml is a note of the report; in design.yaml one line
    of the report; in runs.json one line of the runner; nothing is written."""
    config = exp / "runs" / "cory" / "seed_2" / "config.yaml"
    config.write_bytes(config.read_bytes() + b"# caf\xe9\n")
    assert "`cory/seed_2`: config.yaml unreadable (not UTF-8 YAML); its settings are left out" in reported(exp)
    (exp / "design.yaml").write_bytes(b"margin: 0.05\n# caf\xe9\n")
    before = tree(exp)
    refused(lab("report", exp), "design.yaml: not UTF-8 text (byte 0xe9 at offset 18); save it as UTF-8")
    assert tree(exp) == before
    (exp / "design.yaml").unlink()
    (exp / "runs.json").write_bytes((exp / "runs.json").read_bytes().replace(b'"imdb"', b'"imdb\xe9"', 1))
    before = tree(exp)
    refused(lab("experiments", "--task", "imdb", "--preset", "cpu", "--methods", "ppo", "--seeds", "0", "--steps",
                "20", "--out", exp), "runs.json is not valid UTF-8 JSON; fix or remove it")
    assert tree(exp) == before


# ----------------------------------------------------------------------------- the search

@pytest.fixture
def search(tmp_path):
    out = tmp_path / "search"
    out.mkdir()
    for name in ("base", "lr1e-4"):
        shutil.copytree(SEARCH / name, out / name)
    return out


def summarised(search, *args) -> str:
    before = tree(search)
    succeeded(lab("search", search, *args))
    assert {k: v for k, v in tree(search).items() if not k.startswith(("SUMMARY", "fig_"))} == \
        {k: v for k, v in before.items() if not k.startswith(("SUMMARY", "fig_"))}
    return (search / "SUMMARY.md").read_text()


def test_the_search_names_a_held_out_row_without_a_reward(search):
    heldout = search / "lr1e-4" / "runs" / "ppo" / "seed_1" / "eval.jsonl"
    rows = [json.loads(line) for line in heldout.read_text().splitlines()]
    rows[-1]["task_reward"] = None  # a NaN, as JSON writes it
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarised(search)
    assert (f"`lr1e-4/ppo/seed_1`: its held-out row at iteration {rows[-1]['iterations']} has no finite reward, "
            "KL or distinct-2 (eval.jsonl); skipped.") in summary


def test_the_search_names_a_damaged_line_and_a_seed_without_a_base_point(search):
    heldout = search / "base" / "runs" / "ppo" / "seed_0" / "eval.jsonl"
    lines = heldout.read_text().splitlines()
    heldout.write_text("\n".join(lines[1:])[:-5] + "\n")  # no iteration 0, and the last line cut
    summary = summarised(search)
    assert "`base`: `ppo/seed_0`: 1 unreadable line(s) in eval.jsonl skipped." in summary
    assert "`base/ppo/seed_0`: no held-out evaluation of the base model (iteration 0)" in summary


def test_the_search_refuses_a_seed_in_two_folders(search):
    runs = search / "lr1e-4" / "runs" / "ppo"
    shutil.copytree(runs / "seed_0", runs / "seed_00")
    before = tree(search)
    refused(lab("search", search), f"{runs}/seed_0 and {runs}/seed_00 both hold seed 0")
    assert tree(search) == before


@pytest.mark.parametrize("args,message", [
    (["--min_gain", "nan"], "--min_gain: expected a finite number, got nan"),
    (["--min_gan", "0.3"], "unrecognized arguments: --min_gan 0.3"),
    (["--min_gain", "x"], "argument --min_gain: invalid float value: 'x'"),
    (["--max_minutes", "0"], "--max_minutes: expected a positive number of minutes, got 0.0"),
    (["--min_distinct", "-1"], "--min_distinct: expected a finite share of the base model's distinct-2 from 0"),
    (["--within", "0"], "--within: expected a positive number of iterations, got 0"),
    (["--also", "stock=SEARCH/lr1e-4:0,one"], "seeds must be comma-separated integers, got '0,one'"),
    (["--also", "stock=SEARCH/lr1e-4:7"], "has no PPO run of seed 7"),
])
def test_the_searchs_argument_mistakes_are_one_line(search, args, message):
    before = tree(search)
    refused(lab("search", search, *[a.replace("SEARCH", str(search)) for a in args]), message)
    assert tree(search) == before


@pytest.mark.slow
def test_a_seed_without_its_config_is_named_by_the_verdict(exp):
    (exp / "runs" / "ppo" / "seed_2" / "config.yaml").unlink()
    report = reported(exp)
    assert ("**not decided** — `ppo/seed_2/config.yaml` is missing or unreadable, so whether that run was made with "
            "the same settings as the others cannot be told") in report
    assert "adap_kl_ctrl True" not in report
