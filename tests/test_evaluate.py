"""lab.evaluate: IMDB reward/KL/diversity and GSM8K pass@k on tiny real models, and its input checks."""
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from conftest import REPO
from cory import assets, models
from cory.assets import locate
from cory.heldout import evaluate_reward, sequence_kl
from lab.evaluate import main
from cory.metrics import degeneration, distinct_n
from cory.run.outputs import json_safe


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run folder as training leaves it: config.yaml naming the base, and two final models, llm1 an
    exact copy of the base and llm2 the base with noise added to every weight."""
    run = tmp_path_factory.mktemp("evalrun") / "run"
    config = yaml.safe_load((REPO / "configs" / "imdb" / "cory_tiny.yaml").read_text())
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "output_dir": str(run)}))
    base = assets.tiny_model_dir()
    shutil.copytree(base, run / "final" / "llm1")
    model = AutoModelForCausalLM.from_pretrained(base)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(run / "final" / "llm2")
    models.load_tokenizer(locate("tiny")).save_pretrained(run / "final" / "llm2")
    return run


def test_distinct_n_hand_examples():
    texts = ["the cat sat", "the cat ran"]
    assert distinct_n(texts, 1) == pytest.approx(4 / 6)   # the, cat, sat, ran out of 6 words
    assert distinct_n(texts, 2) == pytest.approx(3 / 4)   # (the cat) twice; bigrams never span two texts
    collapsed = ["great great great great"]
    assert distinct_n(collapsed, 1) == pytest.approx(1 / 4)
    assert distinct_n(collapsed, 2) == pytest.approx(1 / 3)
    # undefined, not 0, where no answer is n words long: one-word answers say nothing of collapse
    assert distinct_n([], 1) is None and distinct_n(["word"], 2) is None and distinct_n(["7", "12"], 2) is None
    assert distinct_n(["7", "twelve words", "twelve words"], 2) == pytest.approx(1 / 2)  # over the two-word answers
    row = json.loads(json.dumps(json_safe(degeneration(["7", "12"], [[7], [1, 2]]))))
    assert row["distinct_2"] is None and row["distinct_1"] == 1.0 and row["repeat4_share"] == 0.0


def _hand_kl(model, reference, prompt, response):
    """sum_t sum_v p(v|x<t) log(p(v|x<t) / q(v|x<t)) over the response positions, one unpadded sequence."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        p = torch.softmax(model(ids).logits[0].double(), -1)
        q = torch.softmax(reference(ids).logits[0].double(), -1)
    total = 0.0
    for t in range(len(prompt), len(prompt) + len(response)):  # token t is predicted at position t - 1
        total += float((p[t - 1] * (p[t - 1].log() - q[t - 1].log())).sum())
    return total


def test_sequence_kl_matches_hand_computation(tiny_run):
    base = AutoModelForCausalLM.from_pretrained(tiny_run / "final" / "llm1").eval()
    other = AutoModelForCausalLM.from_pretrained(tiny_run / "final" / "llm2").eval()
    tok = models.load_tokenizer(locate("tiny"))
    # different prompt and response lengths, so the batch has left padding to mask
    prompts = [tok("This movie", add_special_tokens=False).input_ids,
               tok("I watched it twice and", add_special_tokens=False).input_ids]
    responses = [tok(" was fun", add_special_tokens=False).input_ids,
                 tok(" loved every minute of it", add_special_tokens=False).input_ids]
    assert len(prompts[0]) != len(prompts[1]) and len(responses[0]) != len(responses[1])
    got = sequence_kl(other, base, prompts, responses, tok.pad_token_id)
    want = [_hand_kl(other, base, p, r) for p, r in zip(prompts, responses)]
    assert got == pytest.approx(want, rel=1e-4)
    assert min(got) > 0
    # two separately loaded copies of the same weights: exactly no divergence
    same = AutoModelForCausalLM.from_pretrained(assets.tiny_model_dir()).eval()
    assert sequence_kl(same, base, prompts, responses, tok.pad_token_id) == pytest.approx([0, 0], abs=1e-6)


def test_imdb_evaluation_of_a_run_folder(tiny_run, capsys):
    doc = main(["--task", "imdb", "--model", str(tiny_run), "--limit", "6", "--max_new_tokens", "5",
                "--batch_size", "4"])
    out = capsys.readouterr().out
    rows = {r["name"]: r for r in doc["results"]}
    assert list(rows) == ["base", "run/llm1", "run/llm2"]
    assert doc["settings"]["reference"] == "tiny"       # from the run's config.yaml
    assert doc["settings"]["reward"] == "vader"
    for r in rows.values():
        assert -1 <= r["task_reward"] <= 1 and math.isfinite(r["task_reward"])
        assert 0 < r["distinct_1"] <= 1 and 0 < r["distinct_2"] <= 1
        assert 1 <= r["response_length"] <= 5
        assert r["n_prompts"] == 6
    assert abs(rows["base"]["kl"]) < 1e-5
    assert abs(rows["run/llm1"]["kl"]) < 1e-5
    assert rows["run/llm2"]["kl"] > 1e-3
    # same seed for every model: identical weights give identical answers
    assert rows["run/llm1"]["samples"] == rows["base"]["samples"]
    assert rows["run/llm2"]["samples"] != rows["base"]["samples"]
    assert "distinct-2" in out and "run/llm2" in out
    saved = json.loads((tiny_run / "eval_imdb.json").read_text())
    assert saved["results"] == json.loads(json.dumps(doc["results"]))


def test_rows_of_several_folders_are_named_by_their_path_from_the_common_parent(tiny_run, tmp_path, capsys):
    """Two runs of the same seed in two method folders: ``ppo/seed_0/llm1`` and ``cory/seed_0/llm1``, not
    ``seed_0/llm1`` and ``seed_0/llm1#2``; a model given twice keeps #2, and the printout says what it means."""
    from lab.evaluation_plan import expand_model

    for method in ("ppo", "cory"):
        shutil.copytree(tiny_run, tmp_path / "exp" / method / "seed_0", ignore=shutil.ignore_patterns("eval_*"))
    gae, grpo = tmp_path / "exp" / "ppo" / "seed_0", tmp_path / "exp" / "cory" / "seed_0"
    assert [e.label for e in expand_model(str(gae))] == ["seed_0/llm1", "seed_0/llm2"]  # alone: as before
    doc = main(["--task", "imdb", "--model", str(gae), "--model", str(grpo), "--model", str(grpo / "final" / "llm2"),
                "--limit", "2", "--max_new_tokens", "2", "--batch_size", "2", "--json", str(tmp_path / "e.json")])
    assert [r["name"] for r in doc["results"]] == ["base", "ppo/seed_0/llm1", "ppo/seed_0/llm2", "cory/seed_0/llm1",
                                                    "cory/seed_0/llm2", "cory/seed_0/llm2#2"]
    out = capsys.readouterr().out
    assert "ppo/seed_0/llm2" in out and "cory/seed_0/llm2#2" in out
    assert (f"note: cory/seed_0/llm2#2 is cory/seed_0/llm2 given again (the same model, {grpo / 'final' / 'llm2'}; "
            "row 2 of it)") in out


def test_gsm8k_pass_at_k_on_generated_problems(tiny_run, tmp_path, capsys):
    out_json = tmp_path / "sub" / "gsm8k.json"
    doc = main(["--task", "gsm8k", "--model", str(tiny_run / "final" / "llm2"), "--dataset", "generated",
                "--limit", "3", "--n", "4", "--k", "1,2", "--max_new_tokens", "8", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert "pass@1" in out and "pass@2" in out and "hit limit" in out and "NOT GSM8K" in out
    saved = json.loads(out_json.read_text())
    assert saved["task"] == "gsm8k" and saved["settings"]["dataset"] == "generated"
    assert [r["name"] for r in saved["results"]] == ["base", "run/llm2"]
    for r in saved["results"]:
        assert {"pass@1", "pass@2", "accuracy", "hit_limit", "response_length", "n_questions", "n_samples"} <= set(r)
        assert r["n_questions"] == 3 and r["n_samples"] == 4
        assert 0 <= r["pass@1"] <= r["pass@2"] <= 1
        assert r["accuracy"] == pytest.approx(r["pass@1"])  # unbiased pass@1 is the mean accuracy
        assert 0 <= r["hit_limit"] <= 1 and 1 <= r["response_length"] <= 8
    assert doc["results"][0]["model"] == "tiny"


def test_gsm8k_authors_protocol_is_named_and_runs_to_the_limit(tiny_run, tmp_path, capsys):
    out_json = tmp_path / "authors.json"
    main(["--task", "gsm8k", "--model", str(tiny_run / "final" / "llm2"), "--dataset", "generated", "--no_base",
          "--limit", "2", "--n", "2", "--k", "1", "--max_new_tokens", "6", "--protocol", "authors",
          "--json", str(out_json)])
    out = capsys.readouterr().out
    assert out.startswith("protocol: authors (top_k 10, top_p 0.7, temperature 1.0, repetition penalty 1.1, 6 new "
                          "tokens, never stopping early")
    saved = json.loads(out_json.read_text())
    assert saved["settings"]["protocol"] == "authors"
    assert saved["settings"]["sampling"] == {"top_k": 10, "top_p": 0.7, "temperature": 1.0,
                                             "repetition_penalty": 1.1, "stop_early": False}
    (r,) = saved["results"]
    assert r["hit_limit"] == 1.0 and r["response_length"] == 6  # no early stop: every answer runs to the limit
    # the default protocol is named too, and an authors' evaluation gets its own default file beside a run
    from lab.evaluate import plan
    assert plan(["--task", "gsm8k", "--model", str(tiny_run), "--dataset", "generated"]).protocol == "training"
    p = plan(["--task", "gsm8k", "--model", str(tiny_run), "--dataset", "generated", "--protocol", "authors"])
    assert p.json_path.name == "eval_gsm8k_authors.json"


@pytest.mark.parametrize("args,expected", [
    (["--task", "imdb", "--model", "tiny", "--protocol", "authors"], "--protocol: 'authors' is not one of training for"),
    (["--task", "gsm8k", "--model", "tiny", "--protocol", "paper"], "--protocol: 'paper' is not one of training, authors"),
    (["--task", "gsm8k", "--model", "tiny", "--n", "2", "--k", "1,4"], "--k 4 is larger than --n 2"),
    (["--task", "mnist", "--model", "tiny"], "'mnist' is not one of arithmetic, gsm8k, imdb"),
    (["--task", "imdb", "--model", "{tmp}/nope"], "no such directory"),
    (["--task", "imdb", "--model", "tiny", "--limit", "0"], "--limit: must be >= 1"),
    (["--task", "gsm8k", "--model", "tiny", "--n", "abc"], "--n: expected a positive integer"),
    (["--task", "gsm8k", "--model", "tiny", "--k", "1,x"], "--k: expected comma-separated"),
    (["--task", "imdb", "--model", "tiny", "--seed", "-1"], "--seed: must be >= 0"),
    (["--task", "imdb", "--model", "tiny", "--batch_size", "2.5"], "--batch_size: expected a positive integer"),
    (["--task", "imdb", "--model", "tiny", "--k", "1"], "--k applies to pass@k tasks, not --task imdb"),
    (["--task", "imdb", "--model", "tiny", "--reward", "sentiment"], "--reward: 'sentiment' is not one of"),
    (["--task", "imdb", "--model", "tiny", "--dataset", "local"], "--dataset 'local' is not one of auto, hub, builtin"),
    (["--task", "gsm8k", "--model", "tiny", "--dataset_path", "{tmp}"], "no test.jsonl"),
    (["--task", "imdb", "--model", "tiny", "--bogus", "1"], "unrecognized arguments: --bogus"),
    (["--task", "imdb", "--model", "{tmp}/plain"], "--reference: needed"),
    (["--task", "imdb", "--model", "{tmp}/unfinished"], "no trained models in final/"),
    (["--task", "gsm8k", "--model", "{tmp}/plain"], "--reference: needed for the 'base' row"),
    (["--task", "imdb", "--model", "tiny", "--reference", "{tmp}/unfinished"], "not a model folder"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected, tmp_path, capsys):
    shutil.copytree(assets.tiny_model_dir(), tmp_path / "plain")   # a model folder with no run around it
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.yaml").write_text("task: imdb\nmodel_name: tiny\n")
    with pytest.raises(SystemExit) as exc:
        main([a.replace("{tmp}", str(tmp_path)) for a in args])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], captured.err
    assert captured.out == ""


@pytest.mark.parametrize("layers, expected", [(+1, "missing from its weights (they would start random)"),
                                               (-1, "in its weights but not in its config")])
def test_a_config_that_does_not_fit_its_weights_is_refused(layers, expected, tmp_path, capsys):
    """transformers starts missing weights random and drops extra ones with a warning: an evaluation would score a
    half-random model, so the loader refuses in one line naming the folder."""
    folder = tmp_path / "edited"
    shutil.copytree(assets.tiny_model_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    config["n_layer"] += layers
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exc:
        main(["--task", "imdb", "--model", str(folder), "--reference", "tiny", "--limit", "2"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "config.json does not match its weights" in lines[0] and expected in lines[0], \
        captured.err
    assert str(folder) in lines[0]


def test_a_model_folder_with_its_weights_cut_short_is_one_line_naming_the_flag(tmp_path, capsys):
    folder = tmp_path / "cut"
    shutil.copytree(assets.tiny_model_dir(), folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(SystemExit) as exc:
        main(["--task", "imdb", "--model", str(folder), "--reference", "tiny", "--limit", "2"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --model {folder}: cannot load the model of {folder}"), lines


@pytest.mark.slow
def test_cli_error_in_a_fresh_process():
    p = subprocess.run([sys.executable, "-m", "lab.evaluate", "--task", "gsm8k", "--model", "tiny",
                        "--n", "2", "--k", "4"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: --k 4 is larger than --n 2: pass@k needs at least k samples "
                                             "per question"]


@pytest.mark.parametrize("spec", ["tiny", "random:llama-tiny"])
def test_shared_prompt_cache_gives_the_same_answers(spec):
    """Reading each prompt once and sharing its keys and values among its answers changes nothing: greedy
    answers with repeats equal those of the prompts repeated by hand (GPT-2 and Llama, left padding)."""
    from cory import models
    from cory.heldout import sample
    from lab.evaluate import load_model

    tok = models.load_tokenizer(locate(spec))
    model = load_model(spec)
    prompts = [tok("Question: 2 + 3?\nAnswer:")["input_ids"], tok("The film")["input_ids"],
               tok("A rather longer question about apples and oranges?\nAnswer:")["input_ids"]]
    shared = sample(model, tok, prompts, 6, repeats=3, greedy=True)
    by_hand = sample(model, tok, [p for p in prompts for _ in range(3)], 6, greedy=True)
    assert shared == by_hand and len(shared) == 9


def test_shared_prefix_length_hand_examples():
    from cory.generation import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2      # each prompt keeps a token of its own
    assert shared_prefix_length([[7, 2], [1, 2]]) == 0
    assert shared_prefix_length([[1, 2, 3]]) == 0                 # one prompt: nothing to share


@pytest.mark.parametrize("spec", ["tiny", "random:llama-tiny"])
def test_shared_prefix_read_once_changes_nothing(spec, monkeypatch):
    """Prompts beginning with the same one-shot example read it once (batch 1) and share its keys and values: the
    sampled draws, the greedy answers and the KL are those of the plain left-padded batch (GPT-2 and Llama)."""
    from cory import generation, heldout
    from lab.evaluate import load_model

    tok = models.load_tokenizer(locate(spec))
    model, reference = load_model(spec), load_model(spec)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    shot = "Question: What is 12 + 7?\nAnswer: 12 + 7 = 19. The answer is 19.\n\nQuestion: What is "
    prompts = [tok(shot + q + "?\nAnswer:")["input_ids"] for q in ("4 - 9", "13 + 28", "7 + 1", "60 - 3")]
    assert generation.shared_prefix_length(prompts) >= generation.MIN_SHARED_PREFIX

    def read(min_shared):
        monkeypatch.setattr(generation, "MIN_SHARED_PREFIX", min_shared)
        torch.manual_seed(0)
        sampled = heldout.sample(model, tok, prompts, 8)
        greedy = heldout.sample(model, tok, prompts, 8, greedy=True)
        kls, logprobs = heldout.sequence_kl_and_base_logprob(model, reference, prompts, sampled, tok.pad_token_id)
        return sampled, greedy, kls, logprobs

    shared, plain = read(8), read(10 ** 6)
    assert shared[:2] == plain[:2]
    assert shared[2] == pytest.approx(plain[2], rel=1e-4, abs=1e-5)
    assert shared[3] == pytest.approx(plain[3], rel=1e-4, abs=1e-5)
    assert min(shared[2]) > 0


@pytest.mark.parametrize("spec", ["tiny", "random:llama-tiny"])
@pytest.mark.parametrize("shot", ["", "Question: What is 12 + 7?\nAnswer: 12 + 7 = 19. The answer is 19.\n\n"])
def test_kl_from_the_sampling_logits_is_the_second_pass_kl(spec, shot):
    """The held-out KL takes the policy's side from the logits its answers were sampled from: the draws are
    sample()'s, and the KL and base log-likelihood are those of a second forward pass over prompt + answer, up to
    float rounding; with and without a shared prefix, answers stopped early by EOS among them (GPT-2 and Llama)."""
    from cory import heldout
    from lab.evaluate import load_model

    tok = models.load_tokenizer(locate(spec))
    model, reference = load_model(spec), load_model(spec)
    prompts = [tok(shot + "Question: What is " + q + "?\nAnswer:")["input_ids"]
               for q in ("4 - 9", "13 + 28", "7 + 1", "60 - 3", "5 + 5")]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
        # EOS about 8 nats likelier where the prompt's mean last hidden state points: answers end at their own lengths
        h = model(input_ids=torch.tensor([prompts[0]]), output_hidden_states=True).hidden_states[-1][0].mean(0)
        model.get_output_embeddings().weight[tok.eos_token_id] += 8 * h / h.norm() ** 2
    torch.manual_seed(0)
    plain = heldout.sample(model, tok, prompts, 10)
    torch.manual_seed(0)
    drawn, logprobs = heldout.sample_with_logprobs(model, tok, prompts, 10)
    assert drawn == plain
    assert len({len(r) for r in drawn}) > 1 and logprobs.shape == (sum(map(len, drawn)), len(tok))
    two_pass = heldout.sequence_kl_and_base_logprob(model, reference, prompts, drawn, tok.pad_token_id)
    one_pass = heldout.sequence_kl_and_base_logprob(model, reference, prompts, drawn, tok.pad_token_id, logprobs)
    assert one_pass[0] == pytest.approx(two_pass[0], rel=1e-4, abs=1e-5)
    assert one_pass[1] == two_pass[1]  # the reference's side is read as before
    assert min(two_pass[0]) > 0


@pytest.mark.parametrize("spec", ["tiny", "random:llama-tiny"])
def test_evaluation_shortcuts_give_the_plain_numbers(spec, monkeypatch):
    """What a held-out evaluation skips or batches differently for speed gives the plain reading's numbers (GPT-2
    and Llama): greedy answers for every prompt in one call (on a CPU) are the batch-by-batch ones; the KL pass
    projects only the answers' positions onto the vocabulary; the base model (equal weights) is read once for
    both sides of its KL, which stays 0, with the base log-likelihood of two readings."""
    from cory import heldout
    from lab.evaluate import load_model
    from cory.tasks.arithmetic import ArithmeticTask

    tok = models.load_tokenizer(locate(spec))
    model, reference, base = load_model(spec), load_model(spec), load_model(spec)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    task = ArithmeticTask("sums_2x12")
    examples = task.eval_examples(7)

    def evaluate(m):
        return evaluate_reward(m, reference, tok, task, examples, max_new_tokens=8, batch_size=3, seed=0,
                               reward_name="correctness", allow_early_eos=True, progress=False, greedy=True)

    together = evaluate(model)
    monkeypatch.setattr(heldout, "GREEDY_CPU_TOKENS", 0)  # one call per batch of 3, as before
    assert evaluate(model) == together

    prompts = [tok(ex.prompt)["input_ids"] for ex in examples]
    torch.manual_seed(0)
    drawn = heldout.sample(model, tok, prompts, 8)
    window = heldout.sequence_kl_and_base_logprob(model, reference, prompts, drawn, tok.pad_token_id)
    monkeypatch.setattr(heldout, "_keeps_logits", lambda m: False)
    whole = heldout.sequence_kl_and_base_logprob(model, reference, prompts, drawn, tok.pad_token_id)
    assert window[0] == pytest.approx(whole[0], rel=1e-5, abs=1e-6)
    assert window[1] == pytest.approx(whole[1], rel=1e-6, abs=1e-6)

    once = heldout.sequence_kl_and_base_logprob(reference, reference, prompts, drawn, tok.pad_token_id)
    twice = heldout.sequence_kl_and_base_logprob(base, reference, prompts, drawn, tok.pad_token_id)
    assert once == twice and set(once[0]) == {0.0}
    assert evaluate(base)["kl"] == 0.0


def test_periodic_evaluation_reads_agents_with_equal_weights_once(monkeypatch):
    """CORY's two agents before any training are the base model: the run's evaluation reads them once and gives both
    the same row, which is the row a reading of either alone gives; agents that differ are each read."""
    import copy

    from cory import heldout
    from lab.evaluate import load_model
    from cory.tasks.arithmetic import ArithmeticTask

    tok = models.load_tokenizer(locate("tiny"))
    base = load_model("tiny")
    evaluation = heldout.PeriodicEvaluation.__new__(heldout.PeriodicEvaluation)
    task = ArithmeticTask()
    evaluation.__dict__.update(task=task, reward="correctness", examples=task.eval_examples(6), tokenizer=tok,
                               reference=base, max_new_tokens=4, allow_early_eos=True, greedy=True, batch_size=32,
                               transfer=False)
    reads = []
    real = heldout.evaluate_answers
    monkeypatch.setattr(heldout, "evaluate_answers", lambda model, *a, **k: reads.append(model) or real(model, *a, **k))

    llm1, llm2 = copy.deepcopy(base), copy.deepcopy(base)
    rows = evaluation({"llm1": llm1, "llm2": llm2}, 0)
    assert reads == [llm1]
    assert [r["agent"] for r in rows] == ["llm1", "llm2"]
    assert {k: v for k, v in rows[0].items() if k != "agent"} == {k: v for k, v in rows[1].items() if k != "agent"}
    alone = evaluation({"llm2": llm2}, 0)[0]
    assert alone == rows[1]

    with torch.no_grad():
        next(llm2.parameters()).add_(0.05)
    reads.clear()
    rows = evaluation({"llm1": llm1, "llm2": llm2}, 3)
    assert reads == [llm1, llm2] and rows[0]["kl"] != rows[1]["kl"]

    # CORY's transfer: each agent observes the other's held-out answers; equal agents are read once, as the base model
    observed = []
    real_transfer = heldout.observer_transfer
    monkeypatch.setattr(heldout, "observer_transfer",
                        lambda model, *a, **k: observed.append(model) or real_transfer(model, *a, **k))
    evaluation.transfer = True
    twins = copy.deepcopy(base), copy.deepcopy(base)
    rows = evaluation({"llm1": twins[0], "llm2": twins[1]}, 0)
    gap = "transfer/observer_minus_pioneer"
    assert observed == [twins[0]] and rows[0][gap] == rows[1][gap]
    observed.clear()
    rows = evaluation({"llm1": llm1, "llm2": llm2}, 3)
    assert observed == [llm1, llm2] and all("transfer/copy_rate" in r for r in rows)
