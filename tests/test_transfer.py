"""CORY's knowledge transfer, measured: the three transfer numbers on hand-written rewards, the arithmetic answer cut
at its first line (what the reward reads is what the observer sees), a tiny CORY run recording them on every row and
at every held-out evaluation, the report's section on synthetic runs, and the transfer check's command."""
import json

import numpy as np
import pytest

from conftest import trained
from lab.report import build_report
from lab.results import load_experiment
from lab.transfer import heldout_rows, sawtooth_lines, stints, training_windows, transfer_section
from lab.transfer_check import echo, main as transfer_check, rates, table as transfer_table, wilson
from cory.metrics import TRANSFER_KEYS, knowledge_transfer
from cory.run.outputs import read_jsonl
from cory.tasks.arithmetic import ArithmeticTask, build_observer_prompt, first_line
from cory.tasks.base import Example, zero_one_reward
from cory.tasks.gsm8k_answers import trim_at_stop
from test_report import cory_rows, ppo_rows, write_run

GAP, COPY, CORRECTION = TRANSFER_KEYS


@pytest.fixture(autouse=True)
def _registry_as_it_was():
    """The tasks a test registers (a task file, a hostile declaration) leave with it: the registry is the process's,
    and the next test file on this worker reads its list of tasks."""
    from cory.tasks import registry
    before = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)


# ----------------------------------------------------------------------------- the numbers


def test_transfer_of_hand_written_rewards():
    pioneer = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    observer = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]  # copies 3 of 4 right answers, corrects 1 of 6 wrong ones
    t = knowledge_transfer(pioneer, observer, zero_one=True)
    assert t[COPY] == 0.75 and t[CORRECTION] == pytest.approx(1 / 6)
    assert t[GAP] == pytest.approx(0.4 - 0.4)
    t = knowledge_transfer([0.0, 0.0], [1.0, 0.0], zero_one=True)
    assert np.isnan(t[COPY]) and t[CORRECTION] == 0.5 and t[GAP] == 0.5  # no right pioneer answer: undefined
    t = knowledge_transfer([0.2, -0.4], [0.5, 0.1], zero_one=False)  # a subjective reward: the gap alone
    assert t[GAP] == pytest.approx(0.4) and np.isnan(t[COPY]) and np.isnan(t[CORRECTION])
    with pytest.raises(ValueError):
        knowledge_transfer([1.0], [1.0, 0.0], zero_one=True)


def test_the_unrelated_reference_control_by_hand():
    from cory.metrics import UNRELATED_KEYS, unrelated_reference
    unrelated_copy, echo = UNRELATED_KEYS
    pioneer = [1, 1, 0, 0]         # the pioneer's own answers to questions 0-3 (not shown)
    observer = [1, 0, 1, 0]        # the observer on questions 0-3, shown the answers to questions 1, 2, 3, 0
    shown = [1, 0, 0, 1]           # those shown answers, right where they belong
    right_for_shown = [0, 1, 1, 1]  # the observer's answers, read against the shown answer's question
    t = unrelated_reference(pioneer, observer, shown, right_for_shown)
    assert t[unrelated_copy] == 0.5  # right on 1 of the 2 questions the pioneer got right
    assert t[echo] == 0.5  # of the 2 right answers shown, 1 written down (a wrong one echoed does not count)
    assert np.isnan(unrelated_reference([0], [1], [0], [1])[echo])
    with pytest.raises(ValueError):
        unrelated_reference([1], [1], [1, 0], [1])


def test_only_a_task_that_says_so_has_a_zero_one_reward():
    assert zero_one_reward(ArithmeticTask("sums_2x1"))
    assert not zero_one_reward(object())  # a declaration that is not a bool is refused (below)


def test_the_checks_intervals():
    assert wilson(0, 0) is None
    lo, hi = wilson(20, 40)
    assert lo == pytest.approx(0.3520, abs=1e-4) and hi == pytest.approx(0.6480, abs=1e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    r = rates([1, 1, 0, 0], [1, 0, 1, 0])
    assert (r["copy_rate"], r["copy_n"], r["correction_rate"], r["correction_n"]) == (0.5, 2, 0.5, 2)
    assert r["observer_minus_pioneer"] == 0.0 and r["observer_accuracy"] == 0.5


# ----------------------------------------------------------------------------- the reference is what the reward read

RUN_ON = " 4 - 9 = -5. The answer is -5.\n\nWhat is 3 + 4?\n3 + 4 = 7. The answer is 7.\nWhat is 1 + 1?"


@pytest.mark.parametrize("answer, line", [
    (" 85 + 91 = 176. The answer is 176.\nQuestion", " 85 + 91 = 176. The answer is 176."),
    (" 85 + 91 = 176. The answer is 176. Question: What is 2 + 2?", " 85 + 91 = 176. The answer is 176."),
    (RUN_ON, " 4 - 9 = -5. The answer is -5."),
    ("\n 4 - 9 = -5.\nmore", "\n 4 - 9 = -5."),        # the first line that holds anything
    (" 4 - 9 = -5. The answer is -5.  ", " 4 - 9 = -5. The answer is -5."),
    ("", ""), ("  \n ", ""),
])
def test_an_arithmetic_answer_is_its_first_line(answer, line):
    assert first_line(answer) == line and answer.startswith(line)  # a prefix: the tokens can be cut to match
    assert ArithmeticTask("sums_2x1").clean_response(answer) == line


def test_the_reward_reads_the_first_line_and_the_observer_sees_it():
    task = ArithmeticTask("sums_2x1")
    ex = Example(query="What is 4 - 9?", prompt="", reference="-5")
    # the run-on answer's last "answer is" (7) no longer decides its reward: its first line does
    assert task.score([ex], [task.clean_response(RUN_ON)]) == [1.0]
    wrong_first = " 4 - 9 = 5. The answer is 5.\n4 - 9 = -5. The answer is -5."
    assert task.score([ex], [task.clean_response(wrong_first)]) == [0.0]
    prompt = task.observer_prompt(ex, RUN_ON)
    assert prompt == build_observer_prompt(ex.query, " 4 - 9 = -5. The answer is -5.")
    assert prompt.endswith("Question: What is 4 - 9?\nReference: 4 - 9 = -5. The answer is -5.\nAnswer:")
    assert "3 + 4" not in prompt and prompt.count("Question") == 2


def test_gsm8k_cuts_a_bare_question_at_the_end_too():
    assert trim_at_stop("He has 9.\n#### 9\nQuestion") == "He has 9.\n#### 9"
    assert trim_at_stop("He has 9.\n#### 9\nQuest") == "He has 9.\n#### 9"
    assert trim_at_stop("He has 9.\nQuestion: next") == "He has 9."
    assert trim_at_stop("Question") == "Question"  # nothing before it: not an answer's tail
    assert trim_at_stop("He has 9.\nQuestions remain") == "He has 9.\nQuestions remain"


# ----------------------------------------------------------------------------- a run records it


@pytest.mark.slow
def test_a_tiny_cory_run_records_transfer_on_every_row_and_evaluation(tmp_path):
    out = tmp_path / "cory"
    rows = trained("arithmetic_train/cory.py", out, "--config", "configs/arithmetic/cory_tiny.yaml",
                   "--steps", "3", "--eval_every", "2")
    samples = read_jsonl(out / "samples.jsonl")
    for r in rows:
        assert set(TRANSFER_KEYS) <= set(r)
        pio, obs = (r[f"{r['pioneer']}/task_reward"], r[f"{'llm2' if r['pioneer'] == 'llm1' else 'llm1'}/task_reward"])
        assert r[GAP] == pytest.approx(obs - pio)
    # the observer's reference is the pioneer's answer as the reward read it: one line
    assert all("\n" not in s["observer_prompt"].split("Reference:")[1].split("\nAnswer:")[0] for s in samples)
    evals = read_jsonl(out / "eval.jsonl")
    assert {(e["iterations"], e["agent"]) for e in evals} == {(i, a) for i in (0, 2, 3) for a in ("llm1", "llm2")}
    assert all(set(TRANSFER_KEYS) <= set(e) for e in evals)
    from cory.metrics import UNRELATED_KEYS
    assert all(set(UNRELATED_KEYS) <= set(e) for e in evals)  # the unrelated-reference control at every evaluation
    base = [e for e in evals if e["iterations"] == 0]
    assert base[0][GAP] == base[1][GAP]  # both agents are the base model: one reading


# ----------------------------------------------------------------------------- the report draws it


def write_transfer(root, seeds=3):
    flat = np.zeros(10)
    for s in range(seeds):
        write_run(root, "ppo", s, ppo_rows(flat, flat))
        rows = cory_rows(flat, flat, flat, flat)
        for r in rows:  # the observer copies more and more: 0.5 in the first stint, 0.9 in the second
            r.update({GAP: -0.1 + 0.01 * s, COPY: 0.5 if r["step"] < 5 else 0.9, CORRECTION: None})
        d = write_run(root, "cory", s, rows, config={"swap_period": 5}, heldout=None)
        evals = [{"iterations": it, "agent": a, "task_reward": 0.3, "kl": 0.0, GAP: gap, COPY: copy,
                  CORRECTION: 0.02}
                 for it, gap, copy in ((0, -0.1, 0.5), (5, 0.0, 0.8), (10, 0.1, 0.9)) for a in ("llm1", "llm2")]
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_the_report_reads_transfer_along_training(tmp_path):
    write_transfer(tmp_path)
    group = load_experiment(tmp_path).main_group("cory")
    windows = training_windows(group)
    assert windows[0][:2] == ["0-4", "CORY-LLM2"] and windows[1][:2] == ["5-9", "CORY-LLM1"]
    assert windows[0][2] == "-0.09 ± 0.00577" and windows[0][3] == "0.5 ± 0" and windows[1][3] == "0.9 ± 0"
    assert windows[0][4] == "–"  # no seed's correction rate defined
    iterations, rows = heldout_rows(group)
    assert iterations == [0, 5, 10]
    assert rows[1] == ["CORY-LLM1", "copy rate", "0.5 ± 0", "0.8 ± 0", "0.9 ± 0"]
    report = build_report(tmp_path).read_text()
    assert "## Knowledge transfer (descriptive)" in report and "fig_transfer.png" in report
    assert (tmp_path / "fig_transfer.png").stat().st_size > 0


def test_the_alone_control_is_the_observer_with_the_reference_against_itself_alone(tmp_path):
    write_run(tmp_path, "cory", 0, cory_rows(*[np.zeros(5)] * 4), config={"swap_period": 5}, heldout=None)
    # LLM1 alone 0.40, LLM2 alone 0.30; LLM1 observing LLM2's answers: 0.30 + 0.15 = 0.45, i.e. 0.05 over itself
    evals = [{"iterations": 5, "agent": a, "task_reward": acc, "kl": 1.0, GAP: gap, COPY: 0.9, CORRECTION: 0.1}
             for a, acc, gap in (("llm1", 0.40, 0.15), ("llm2", 0.30, -0.05))]
    (tmp_path / "runs/cory/seed_0/eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    _, rows = heldout_rows(load_experiment(tmp_path).main_group("cory"))
    alone = {r[0]: r[2] for r in rows if r[1] == "observer − itself alone"}
    assert alone == {"CORY-LLM1": "0.05", "CORY-LLM2": "0.05"}  # LLM2: 0.40 − 0.05 − 0.30
    assert not any("unrelated" in r[1] for r in rows)  # not recorded: no rows for it


def test_the_held_out_table_shows_the_unrelated_reference_control_beside_the_others(tmp_path):
    from cory.metrics import UNRELATED_KEYS
    from lab.transfer import CONTROL_RULE, heldout_lines
    write_run(tmp_path, "cory", 0, cory_rows(*[np.zeros(5)] * 4), config={"swap_period": 5}, heldout=None)
    evals = [{"iterations": 5, "agent": a, "task_reward": 0.4, "kl": 1.0, GAP: 0.1, COPY: 0.9, CORRECTION: 0.1,
              UNRELATED_KEYS[0]: 0.55, UNRELATED_KEYS[1]: 0.7} for a in ("llm1", "llm2")]
    (tmp_path / "runs/cory/seed_0/eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    group = load_experiment(tmp_path).main_group("cory")
    _, rows = heldout_rows(group)
    measures = [r[1] for r in rows if r[0] == "CORY-LLM1"]
    assert measures == ["observer − pioneer", "copy rate", "correction rate", "observer − itself alone",
                        "copy rate, unrelated ref.", "echo, unrelated ref."]
    assert [r[2] for r in rows if r[0] == "CORY-LLM1"][4:] == ["0.55", "0.7"]
    assert CONTROL_RULE in heldout_lines(group)


def test_the_sawtooth_reads_each_stints_change_by_the_role_the_agent_had(tmp_path):
    # LLM1 is the pioneer in stints 0 and 2 (cory_rows), the observer in 1 and 3; it gains 0.1 as the pioneer and
    # loses 0.05 as the observer; LLM2 the other way round, a seed-dependent size
    for seed in (0, 1):
        rows = [{**r, GAP: 0.0} for r in cory_rows(*[np.zeros(20)] * 4)]  # a run that recorded the transfer
        d = write_run(tmp_path, "cory", seed, rows, config={"swap_period": 5}, heldout=None)
        llm1 = [0.3, 0.4, 0.35, 0.45, 0.40]
        llm2 = [0.3, 0.3 - 0.02 * (seed + 1), 0.3, 0.3 - 0.02 * (seed + 1), 0.3]
        evals = [{"iterations": 5 * i, "agent": a, "task_reward": acc[i], "kl": 1.0}
                 for i in range(5) for a, acc in (("llm1", llm1), ("llm2", llm2))]
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    group = load_experiment(tmp_path).main_group("cory")
    found = {(a, start): (role, changes) for a, start, role, changes in stints(group)}
    assert found["llm1", 0][0] == "pioneer" and found["llm1", 5][0] == "observer"
    assert found["llm1", 5][1] == {0: pytest.approx(-0.05), 1: pytest.approx(-0.05)}
    assert found["llm2", 0] == ("observer", {0: pytest.approx(-0.02), 1: pytest.approx(-0.04)})
    assert found["llm2", 5][0] == "pioneer" and len(found) == 8
    text = "\n".join(sawtooth_lines(group))
    assert "| CORY-LLM1 | 5-10 | observer | -0.05 ± 0 | 2 of 2 |" in text
    assert "- CORY-LLM1 as the pioneer: 0.1 ± 0 per stint" in text and "fell in 0 of 4" in text
    assert "- CORY-LLM1 as the observer: -0.05 ± 0 per stint" in text and "fell in 4 of 4" in text
    assert "- CORY-LLM2 as the observer: -0.03 ± 0.00577 per stint" in text
    assert "**Per stint of roles**" in transfer_section(load_experiment(tmp_path))


def test_no_sawtooth_without_role_exchanges_or_evaluations_at_their_ends(tmp_path):
    d = write_run(tmp_path, "cory", 0, cory_rows(*[np.zeros(10)] * 4), config={"swap_period": 5}, heldout=None)
    evals = [{"iterations": i, "agent": a, "task_reward": 0.3, "kl": 1.0} for i in (0, 3, 7) for a in ("llm1", "llm2")]
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert sawtooth_lines(load_experiment(tmp_path).main_group("cory")) == []


def test_no_transfer_section_for_runs_that_did_not_record_it(tmp_path):
    flat = np.zeros(6)
    write_run(tmp_path, "ppo", 0, ppo_rows(flat, flat))
    write_run(tmp_path, "cory", 0, cory_rows(flat, flat, flat, flat), heldout=None)
    assert transfer_section(load_experiment(tmp_path)) is None
    assert "Knowledge transfer" not in build_report(tmp_path).read_text()


# ----------------------------------------------------------------------------- the check's command


@pytest.mark.parametrize("argv, says", [
    (["--task", "nope"], "--task nope: not a registered task"),
    (["--task", "arithmetic", "--n", "0"], "--n 0: must be an integer of at least 2"),
    (["--task", "arithmetic", "--n", "1"], "--n 1: must be an integer of at least 2"),
    (["--task", "arithmetic", "--batch_size", "-1"], "--batch_size -1: must be an integer of at least 1"),
])
def test_the_checks_mistakes_are_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        transfer_check(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_the_check_refuses_a_task_without_a_zero_one_reward(capsys):
    with pytest.raises(SystemExit) as e:
        transfer_check(["--task", "imdb", "--model", "tiny", "--n", "2"])
    assert e.value.code == 2 and "its reward is not 0/1" in capsys.readouterr().err


def test_the_check_runs_on_the_tiny_model(tmp_path):
    doc = transfer_check(["--task", "arithmetic", "--model", "tiny", "--n", "12", "--batch_size", "8",
                          "--max_new_tokens", "4", "--json", str(tmp_path / "t.json")])
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["n"] == doc["n"] == 12 and set(written["observer"]) == {"greedy", "sampled"}
    assert written["command"].startswith("python -m lab.transfer_check --task arithmetic")
    for r in written["observer"].values():
        assert r["copy_n"] + r["correction_n"] == 12
    assert "\nReference: " in written["example_observer_prompt"]
    controls = written["controls"]
    assert set(controls) == {"no_reference", "unrelated_reference"}
    for control in controls.values():
        assert set(control) == {"greedy", "sampled"}
        for r in control.values():
            assert r["copy_n"] + r["correction_n"] == 12  # conditioned on the same pioneer answers
    assert all(r["echo_n"] <= 12 for r in controls["unrelated_reference"].values())
    # the first question is shown the answer to another question: the same question, another reference
    observer, unrelated = written["example_observer_prompt"], written["example_unrelated_prompt"]
    assert observer.rsplit("\nReference: ", 1)[0] == unrelated.rsplit("\nReference: ", 1)[0]
    assert "controls (each observer mode)" in transfer_table(doc)
    # its own --json is replaced by a rerun; a file it did not write is refused, and left as it was
    again = transfer_check(["--task", "arithmetic", "--model", "tiny", "--n", "12", "--batch_size", "8",
                            "--max_new_tokens", "4", "--json", str(tmp_path / "t.json")])
    assert json.loads((tmp_path / "t.json").read_text())["n"] == again["n"] == 12


def test_the_echo_rate_counts_only_the_references_that_were_right_where_they_belong():
    # shown answers right, wrong, right, right; the observer's answer right for their questions: yes, yes, no, yes
    r = echo([1, 0, 1, 1], [1, 1, 0, 1])
    assert r["echo_n"] == 3 and r["echo_rate"] == pytest.approx(2 / 3) and r["echo_ci95"] == wilson(2, 3)
    assert echo([0, 0], [1, 1]) == {"echo_rate": None, "echo_n": 0, "echo_ci95": None}


# a task in one file (docs/adding_a_task.md) with a 0/1 reward: 1 when the answer holds a word, else 0
ONE_FILE_TASK = '''
from cory.tasks import Example, TaskBase, register_task


class SaysSomething(TaskBase):
    name = "says_something"
    zero_one_reward = True

    def __init__(self, seed):
        self.position = seed

    def sample(self, batch_size):
        self.position += batch_size
        return [Example(query=str(i), prompt=f"Say a word ({i}):") for i in range(self.position - batch_size,
                                                                                  self.position)]

    def eval_examples(self, limit=None):
        return [Example(query="x", prompt="Say a word:")]

    def observer_prompt(self, example, pioneer_response):
        return f"{example.prompt}{pioneer_response}\\nAgain:"

    def score(self, examples, responses):
        return [float(bool(r.split())) for r in responses]

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


register_task("says_something", lambda cfg, tokenizer, seed: SaysSomething(seed), rewards=("says",))
'''


def test_the_check_takes_a_task_file(tmp_path):
    (tmp_path / "says.py").write_text(ONE_FILE_TASK)
    doc = transfer_check(["--task_file", str(tmp_path / "says.py"), "--task", "says_something", "--model", "tiny",
                          "--n", "4", "--batch_size", "4", "--max_new_tokens", "3"])
    assert doc["task"] == "says_something" and doc["reward"] == "says" and doc["n"] == 4
    assert doc["example_observer_prompt"].endswith("\nAgain:")
    for r in doc["observer"].values():
        assert r["copy_n"] + r["correction_n"] == 4


def test_the_check_and_the_held_out_evaluation_read_the_unrelated_reference_alike(tmp_path, monkeypatch):
    """One control, two readers: on the same questions, pioneer answers and observer answers, lab.transfer_check's
    unrelated-reference copy and echo rates are the held-out evaluation's ``UNRELATED_KEYS``."""
    import lab.transfer_check as check
    from cory import heldout
    from cory.assets import locate
    from cory.metrics import UNRELATED_KEYS
    from cory.models import load_tokenizer
    from cory.tasks import make_task

    def answer(model, tokenizer, prompts, max_new_tokens, extra=None, greedy=False):
        # set by the whole prompt, greedy or not: the observer's answer turns with the reference it is shown, and
        # both readers see the same answers
        return [tokenizer.encode(" x" * (sum(p) % 3 + 1)) for p in prompts]

    monkeypatch.setattr(heldout, "sample", answer)
    # right by the answer's words and the question together: an answer is right for one question, not the next
    task_file = tmp_path / "parity.py"
    task_file.write_text(ONE_FILE_TASK.replace("says_something", "says_parity").replace(
        "return [float(bool(r.split())) for r in responses]",
        "return [float((len(r.split()) + int(e.query)) % 2 == 0) for e, r in zip(examples, responses)]"))
    argv = ["--task_file", str(task_file), "--task", "says_parity", "--model", "tiny", "--n", "12",
            "--batch_size", "5", "--max_new_tokens", "3"]
    read = transfer_check(argv)["controls"]["unrelated_reference"]
    args = check.plan(argv)
    tokenizer = load_tokenizer(locate("tiny"))
    task = make_task(args.config, tokenizer)
    examples = task.sample(args.n)
    pioneer_answers, pioneer = heldout.answers_and_rewards(None, tokenizer, task, examples, max_new_tokens=3,
                                                           batch_size=5, reward_name=args.reward, extra={})
    held_out = heldout.observer_transfer(None, tokenizer, task, examples, pioneer_answers, pioneer, max_new_tokens=3,
                                         batch_size=5, seed=0, reward_name=args.reward)
    unrelated_copy, echo_rate = (held_out[k] for k in UNRELATED_KEYS)
    assert 0 < unrelated_copy < 1 and 0 < echo_rate < 1  # neither undefined nor at a bound: something to agree on
    assert 0 < read["sampled"]["echo_n"] < 12 and 0 < read["sampled"]["copy_n"] < 12
    for mode in ("greedy", "sampled"):
        assert read[mode]["copy_rate"] == unrelated_copy and read[mode]["echo_rate"] == echo_rate


@pytest.mark.parametrize("text, says", [
    (None, "task_file: {file} not found"),
    ("def broken(:\n", "task_file: {file} line 1: "),
    ("raise RuntimeError('no data here')\n", "task_file: {file} line 1: RuntimeError: no data here"),
])
def test_a_bad_task_file_is_one_line(tmp_path, capsys, text, says):
    file = tmp_path / "task.py"
    if text is not None:
        file.write_text(text)
    with pytest.raises(SystemExit) as e:
        transfer_check(["--task_file", str(file), "--task", "says_something", "--model", "tiny"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert says.format(file=file) in err


def _refused(argv, capsys, monkeypatch, *, unbuilt=("load_causal_lm",)) -> str:
    """The check's one-line refusal of ``argv`` (status 2), given before any of ``unbuilt`` is called."""
    import lab.transfer_check as check

    for name in unbuilt:
        monkeypatch.setattr(check, name, lambda *a, **k: pytest.fail(f"{name} was called"))
    with pytest.raises(SystemExit) as e:
        transfer_check(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_an_answer_past_the_models_context_is_refused_before_it_loads(capsys, monkeypatch):
    # the tiny model takes 512 positions: 600 tokens never fit; 300 fit the pioneer's prompt, but not the observer's,
    # which holds the pioneer's answer too
    err = _refused(["--task", "arithmetic", "--model", "tiny", "--n", "2", "--max_new_tokens", "600"], capsys,
                   monkeypatch)
    assert "with answers of up to 600 tokens does not fit tiny's context of 512 tokens" in err
    assert err.endswith("lower --max_new_tokens")
    err = _refused(["--task", "arithmetic", "--model", "tiny", "--n", "2", "--max_new_tokens", "300"], capsys,
                   monkeypatch)
    assert "with answers of up to 600 tokens does not fit tiny's context" in err
    assert "the observer's prompt holds the pioneer's answer too" in err


def test_a_bad_task_setting_is_refused_before_the_task_is_built(capsys, monkeypatch):
    err = _refused(["--task", "arithmetic", "--model", "tiny", "--dataset", "bogus"], capsys, monkeypatch,
                   unbuilt=("load_tokenizer", "make_task", "load_causal_lm"))
    assert err.startswith("error: --dataset: 'bogus' is not one of auto, ")


def test_the_checks_documented_commands_plan(monkeypatch):
    """Its docstring's examples write into folders that exist, and docs/evaluation.md's command is accepted as written
    (its --json is a file this command wrote)."""
    import re

    import lab.transfer_check as check
    from conftest import REPO

    monkeypatch.chdir(REPO)
    for json_path in re.findall(r"--json (\S+)", check.__doc__):
        assert (REPO / json_path).parent.is_dir(), json_path
    documented = re.findall(r"^python -m lab\.transfer_check (.+)$", (REPO / "docs" / "evaluation.md").read_text(),
                            flags=re.M)
    assert documented
    for command in documented:
        check.plan(command.split())


# ----------------------------------------------------------------------------- a task's word on its reward


class Declared:
    name = "declared"

    def __init__(self, value):
        self.zero_one_reward = value


@pytest.mark.parametrize("value", ["yes", 1.0, 1, None])
def test_a_zero_one_declaration_that_is_not_a_bool_is_refused(value):
    from cory.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        zero_one_reward(Declared(value))
    assert str(e.value) == f"task declared: zero_one_reward is {value!r}; it must be True or False"
    assert zero_one_reward(Declared(True)) is True and zero_one_reward(Declared(False)) is False
    assert zero_one_reward(object()) is False  # optional for a plug-in task


def test_a_task_built_with_a_non_bool_declaration_is_refused_where_it_enters():
    from cory.errors import ConfigError
    from cory.tasks import make_task, register_task
    from types import SimpleNamespace

    register_task("declares_yes", lambda cfg, tokenizer, seed: _yes_task())
    cfg = SimpleNamespace(task="declares_yes", dataset="auto", reward_model=None, seed=0)
    with pytest.raises(ConfigError, match=r"^task declares_yes: zero_one_reward is 'yes'; it must be True or False "
                                          r"\(registered at .*test_transfer.py:\d+\)$"):
        make_task(cfg, None)


def _yes_task():
    task = ArithmeticTask()
    task.name, task.zero_one_reward = "declares_yes", "yes"  # type: ignore[assignment]
    return task


def test_rewards_that_break_a_zero_one_declaration_leave_the_rates_out_with_a_warning(monkeypatch):
    from cory.tasks import base

    monkeypatch.setattr(base, "_WARNED", set())
    task = Declared(True)
    assert base.right_or_wrong(task, [1.0, 0.0], [0, 1]) is True
    with pytest.warns(UserWarning, match=r"task declared: declares zero_one_reward, but its score\(\) returned 0\.3, "
                                         r"neither 0 nor 1, .* set zero_one_reward = False \(the rates are left out"):
        assert base.right_or_wrong(task, [1.0, 0.0], [0.3, 1.0]) is False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per task, not every iteration
        assert base.right_or_wrong(task, [0.7], [0.0]) is False
    assert base.right_or_wrong(Declared(False), [0.3], [0.7]) is False  # no claim, nothing to warn of
    t = knowledge_transfer([1.0, 0.0], [0.3, 1.0], base.right_or_wrong(task, [1.0, 0.0], [0.3, 1.0]))
    assert np.isnan(t[COPY]) and np.isnan(t[CORRECTION]) and t[GAP] == pytest.approx(0.15)


@pytest.mark.parametrize("change, says", [
    (("zero_one_reward = True", "zero_one_reward = 'yes'"),
     "error: task {name}: zero_one_reward is 'yes'; it must be True or False (registered at "),
    (("float(bool(r.split()))", "0.3"),
     "error: task {name}: declares zero_one_reward, but its score() returned 0.3, neither 0 nor 1, so copy and "
     "correction rates cannot be read from it; return 0 or 1, or set zero_one_reward = False"),
])
def test_the_check_takes_no_zero_one_declaration_its_task_breaks(tmp_path, capsys, change, says):
    name = f"says_{len(change[1])}"  # a task name of its own: a name is registered from one file only
    (tmp_path / "says.py").write_text(ONE_FILE_TASK.replace(*change).replace("says_something", name))
    with pytest.raises(SystemExit) as e:
        transfer_check(["--task_file", str(tmp_path / "says.py"), "--task", name, "--model", "tiny", "--n", "2",
                        "--max_new_tokens", "2"])
    err = capsys.readouterr().err  # the second is found once the pioneer has answered: after its progress bar
    assert e.value.code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].split("\r")[-1].startswith(says.format(name=name))
