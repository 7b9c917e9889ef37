"""Learning and collapse, measured: the degeneration measures of every metrics row, the run's own held-out
evaluation (eval_every), and the shaped VADER rewards the CPU search tries."""
import pytest

from conftest import GSM8K_PPO, IMDB_CORY, IMDB_PPO, REPO, rejected
from cory.config import build, load_yaml
from cory.metrics import degeneration, distinct_n, longest_run, repeat_share
from cory.run.outputs import read_jsonl
from cory.train import prepare_run

TIME_KEYS = ("time/", "memory/")


def tiny(cls, name, tmp_path, **over):
    base = load_yaml(REPO / "configs" / "imdb" / f"{name}_tiny.yaml")
    base.update(output_dir=str(tmp_path / "run"), **over)
    return build(cls, base)


# ----------------------------------------------------------------------------- degeneration on crafted answers

def test_longest_run_counts_a_token_following_itself():
    assert longest_run([]) == 0
    assert longest_run([5]) == 1
    assert longest_run([1, 2, 3]) == 1
    assert longest_run([1, 1, 2, 2, 2, 1]) == 3
    assert longest_run([7, 7, 7, 7]) == 4
    assert longest_run([7, 7, 3, 7, 7]) == 2  # the same token, but not in a row


def test_repeat_share_is_the_share_of_answers_with_four_in_a_row():
    answers = [[1, 2, 3, 4], [9, 9, 9, 9, 2], [5, 5, 5, 6, 5], [8, 8, 8, 8, 8, 8]]
    assert repeat_share(answers) == pytest.approx(2 / 4)  # the second and the last; three in a row is not enough
    assert repeat_share(answers, run=3) == pytest.approx(3 / 4)
    assert repeat_share([]) == 0.0


def test_degeneration_of_fluent_and_collapsed_batches():
    fluent = degeneration(["a fine film with a warm heart", "the cast shines in every scene"],
                          [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    collapsed = degeneration(["great great great great", "great great great great"], [[3, 3, 3, 3], [3, 3, 3, 3]])
    assert fluent == {"distinct_1": pytest.approx(12 / 13), "distinct_2": 1.0, "repeat4_share": 0.0}
    assert collapsed == {"distinct_1": 1 / 8, "distinct_2": 1 / 6, "repeat4_share": 1.0}
    assert distinct_n(["great great great great"] * 2, 2) == pytest.approx(1 / 6)


# ----------------------------------------------------------------------------- shaped VADER rewards

def test_shaped_vader_rewards_against_plain_vader():
    from cory.tasks.imdb import VADER_SCALE, make_reward

    plain, scaled, gain = make_reward("vader"), make_reward("vader-scaled"), make_reward("vader-gain")
    queries = ["What a wonderful, joyful", "This was a terrible", "The film"]
    responses = [" film.", " waste of time, truly awful.", " is a delight, great fun and lovely"]
    p = plain(queries, responses)
    assert scaled(queries, responses) == pytest.approx([VADER_SCALE * x for x in p])
    alone = plain(queries, [""] * 3)
    assert gain(queries, responses) == pytest.approx([x - q for x, q in zip(p, alone)])
    assert alone[0] > 0.5 and gain(queries, responses)[0] < 0.2  # the query's own praise is not the answer's
    assert gain(["The film"], [""]) == [0.0]
    assert VADER_SCALE == 3.0


def test_a_shaped_reward_is_evaluated_with_plain_vader(tmp_path):
    from lab.evaluate import plan

    import shutil

    from cory import assets

    run = tmp_path / "run"
    # a finished run's final/ holds whole weights (evaluate checks them against the config before any load)
    shutil.copytree(assets.tiny_model_dir(), run / "final" / "policy")
    (run / "config.yaml").write_text("task: imdb\nmodel_name: tiny\nreward_model: vader-gain\ndataset: builtin\n")
    assert plan(["--task", "imdb", "--model", str(run)]).reward == "vader"
    assert plan(["--task", "imdb", "--model", str(run), "--reward", "vader-gain"]).reward == "vader-gain"


@pytest.mark.parametrize("name", ["vader-scaled", "vader-gain"])
def test_shaped_rewards_are_named_values_off_in_the_paper_presets(name):
    from cory.tasks.imdb import REWARD_NAMES

    assert name in REWARD_NAMES
    assert IMDB_PPO.reward_model == "distilbert-imdb"
    for preset in ("ppo_paper", "cory_paper", "ppo_gpu", "cory_gpu"):
        assert load_yaml(REPO / "configs" / "imdb" / f"{preset}.yaml").get("reward_model") in (None, "vader",
                                                                                               "distilbert-imdb")


# ----------------------------------------------------------------------------- the run's own held-out evaluation

@pytest.mark.slow
@pytest.mark.parametrize("method,cls", [("ppo", IMDB_PPO), ("cory", IMDB_CORY)])
def test_eval_every_scores_each_agent_and_leaves_training_alone(tmp_path, method, cls):
    plain = prepare_run(tiny(cls, method, tmp_path / "a", steps=3)).fit()
    evaluated = prepare_run(tiny(cls, method, tmp_path / "b", steps=3, eval_every=2)).fit()
    assert not (plain / "eval.jsonl").exists()
    rows = read_jsonl(evaluated / "eval.jsonl")
    agents = ["policy"] if method == "ppo" else ["llm1", "llm2"]
    # before the first update (the base model), every eval_every iterations, and after the last
    assert [(r["iterations"], r["agent"]) for r in rows] == [(i, a) for i in (0, 2, 3) for a in agents]
    for r in rows:
        assert {"task_reward", "kl", "distinct_1", "distinct_2", "repeat4_share", "response_length"} <= set(r)
        assert r["n_prompts"] == 110 and r["response_length"] == 15  # the task's held-out openings, 15 tokens
    assert all(r["kl"] == 0 for r in rows if r["iterations"] == 0)
    assert all(r["kl"] > 0 for r in rows if r["iterations"] == 3)
    # the evaluation samples on a forked random state: training is exactly as without it
    strip = [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in read_jsonl(plain / "metrics.jsonl")]
    assert strip == [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)}
                     for r in read_jsonl(evaluated / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("name,cls", [("ppo", IMDB_PPO), ("cory", IMDB_CORY)])
def test_eval_every_matches_the_evaluation_of_the_saved_model(tmp_path, name, cls):
    """The run's last held-out row is what `python -m lab.evaluate` reports for its final models, sampled
    again; and what it reads from the run's own final_evaluation.json instead (same numbers, same samples)."""
    from lab.evaluate import main as evaluate

    out = prepare_run(tiny(cls, name, tmp_path, steps=2, eval_every=2)).fit()
    last = {r["agent"]: r for r in read_jsonl(out / "eval.jsonl") if r["iterations"] == 2}
    command = ["--task", "imdb", "--model", str(out), "--no_base", "--json"]
    read = evaluate([*command, str(tmp_path / "read.json")])["results"]
    (out / "final_evaluation.json").unlink()
    sampled = evaluate([*command, str(tmp_path / "sampled.json")])["results"]
    assert [r["name"].split("/")[-1] for r in sampled] == sorted(last) == [r["name"].split("/")[-1] for r in read]
    for again, own in zip(sampled, read):
        assert "read_from" in own and "read_from" not in again
        assert own["samples"] == again["samples"]
        for key in ("task_reward", "kl", "base_logprob", "distinct_1", "distinct_2", "repeat4_share",
                    "response_length"):
            assert own[key] == pytest.approx(again[key], rel=1e-4, abs=1e-6), key
            assert own[key] == last[again["name"].split("/")[-1]][key], key


@pytest.mark.slow
def test_the_runs_own_final_evaluation_is_read_only_for_its_weights_and_settings(tmp_path, monkeypatch):
    """Other settings than the run's (a seed, an answer length, a dtype) or final models replaced since (other
    contents, even of the same size) are evaluated afresh; a read row loads no model."""
    import json

    import lab.evaluate as evaluate_module
    from lab.evaluate import main as evaluate

    out = prepare_run(tiny(IMDB_PPO, "ppo", tmp_path, steps=1, eval_every=1)).fit()
    own = json.loads((out / "final_evaluation.json").read_text())
    assert own["iterations"] == 1 and own["settings"]["dtype"] == "float32" and set(own["results"]) == {"policy"}

    def read(*flags):
        doc = evaluate(["--task", "imdb", "--model", str(out), "--no_base", "--json", str(tmp_path / "e.json"),
                        "--force", *flags])
        return "read_from" in doc["results"][0]

    loaded = []
    load_model = evaluate_module.load_model
    monkeypatch.setattr(evaluate_module, "load_model", lambda *a: loaded.append(a[0]) or load_model(*a))
    assert read() and loaded == []  # every row read: no model loads, not even the reference
    assert not read("--seed", "1") and len(loaded) == 2  # the reference, then the policy
    assert not read("--max_new_tokens", "3")
    assert not read("--dtype", "bfloat16")
    weights = out / "final" / "policy" / "model.safetensors"  # other weights of the same size, the marker kept
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert not read()


@pytest.mark.slow
@pytest.mark.parametrize("kept,restart", [(2, 1), (1, 0)])
def test_a_resumed_run_keeps_the_evaluations_up_to_its_checkpoint(tmp_path, kept, restart):
    import shutil

    cfg = tiny(IMDB_PPO, "ppo", tmp_path, steps=2, eval_every=1, save_every=1, keep_checkpoints=kept)
    out = prepare_run(cfg).fit()
    # cut off after its checkpoint at 1 (or before any, restarting from 0) with later evaluations logged: the
    # resumed run redoes them, once each
    shutil.rmtree(out / "checkpoints" / "step_000002")
    if not restart:  # no checkpoint left: cut off in its last iteration, before its final models and last row
        shutil.rmtree(out / "final")  # (a finished run's results are never started again: test_runs_read_only)
        rows = (out / "metrics.jsonl").read_text().splitlines()
        (out / "metrics.jsonl").write_text(rows[0] + "\n")
    resumed = tiny(IMDB_PPO, "ppo", tmp_path, steps=2, eval_every=1, resume=str(out))
    run = prepare_run(resumed)
    assert run.start_step == restart
    run.fit()
    assert [r["iterations"] for r in read_jsonl(out / "eval.jsonl")] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("method,cls", [("ppo", IMDB_PPO), ("cory", IMDB_CORY)])
def test_a_lora_run_evaluates_along_training_against_its_base_with_the_adapters_off(tmp_path, method, cls):
    """trl's reference for a peft policy is the base with its adapters disabled: the held-out KL is read against it.
    CORY's two agents share one base (shared_base), each read with its own adapter active."""
    full = prepare_run(tiny(cls, method, tmp_path / "full", steps=1, eval_every=1)).fit()
    lora = prepare_run(tiny(cls, method, tmp_path / "lora", steps=2, eval_every=1, use_peft=True, lora_r=4,
                            lora_alpha=8, learning_rate=1e-2)).fit()
    rows = read_jsonl(lora / "eval.jsonl")
    agents = ["policy"] if method == "ppo" else ["llm1", "llm2"]
    assert [(r["iterations"], r["agent"]) for r in rows] == [(i, a) for i in (0, 1, 2) for a in agents]
    base = {r["agent"]: r for r in read_jsonl(full / "eval.jsonl") if r["iterations"] == 0}
    for r in rows[:len(agents)]:  # LoRA's B starts at 0: the policy is its base, answering as the full model's
        assert r["kl"] == pytest.approx(0.0, abs=1e-4)
        assert r["task_reward"] == pytest.approx(base[r["agent"]]["task_reward"], abs=1e-4)
    last = [r for r in rows if r["iterations"] == 2]
    assert all(r["kl"] > 1e-3 for r in last)
    if method == "cory":  # two adapters on one base, trained apart, read apart
        assert last[0]["kl"] != last[1]["kl"]


def test_an_adapter_view_reads_the_base_and_its_own_adapter_only():
    """Two agents' adapters on one base: each view names the base's weights and its own adapter's, the base view
    none of the adapters' (peft's names: ``...lora_A.<adapter>.weight``), so no two views pass for the same weights."""
    from cory.models import AdapterView

    names = ["q.base_layer.weight", "q.lora_A.llm1.weight", "q.lora_B.llm2.weight", "q.lora_embedding_A.llm1",
             "q.lora_A.llm10.weight"]
    read = {adapter: [n for n in names if AdapterView(None, adapter).reads(n)] for adapter in (None, "llm1", "llm2")}
    assert read == {None: ["q.base_layer.weight"],
                    "llm1": ["q.base_layer.weight", "q.lora_A.llm1.weight", "q.lora_embedding_A.llm1"],
                    "llm2": ["q.base_layer.weight", "q.lora_B.llm2.weight"]}


def test_eval_every_refusals_are_one_line():
    assert "eval_every: must be >= 0" in rejected("imdb", "ppo", ["--config", "configs/imdb/ppo_tiny.yaml",
                                                                  "--eval_every", "-1"])
    line = rejected("gsm8k", "ppo", ["--config", "configs/gsm8k/ppo_tiny.yaml", "--eval_every", "2"])
    assert "eval_every" in line and "pass@k" in line
    assert GSM8K_PPO  # the GSM8K script's own class is what refused


@pytest.mark.slow
def test_resuming_a_run_drops_the_evaluation_of_the_model_it_replaces(tmp_path):
    out = prepare_run(tiny(IMDB_PPO, "ppo", tmp_path, steps=2)).fit()
    (out / "eval_imdb.json").write_text("{}")
    (out / "eval_gsm8k_authors.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    prepare_run(tiny(IMDB_PPO, "ppo", tmp_path, steps=3, resume=str(out))).fit()
    assert not (out / "eval_imdb.json").exists() and not (out / "eval_gsm8k_authors.json").exists()
    assert (out / "notes.txt").read_text() == "mine"
