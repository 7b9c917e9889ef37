"""What a run cannot take, refused in one line through the training script (exit 2) before it trains: a tokenizer
with nothing to pad a batch with, and a batch or answer length that cannot fit this machine's memory (refused before
any model loads, in seconds); the paper's sizes are accepted."""
import json
import resource
import shutil

import pytest

from conftest import TINY, rejected, run_script
from entry_points import refused


@pytest.mark.slow
def test_a_tokenizer_with_no_pad_eos_bos_or_unk_token(tmp_path):
    from cory import assets

    model = tmp_path / "model"
    shutil.copytree(assets.tiny_model_dir(), model)
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config.update(pad_token=None, eos_token=None, bos_token=None, unk_token=None)
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    run = tmp_path / "run"
    refused(run_script("imdb_train/ppo.py", *TINY, "--model_name", model, "--output_dir", run),
            f"error: model_name: the tokenizer of {model} has no pad token and no end-of-sequence token",
            "set eos_token (and pad_token, if it has one) in its tokenizer_config.json")
    assert not run.exists()  # the folder it made for the run is gone again


@pytest.mark.slow
def test_a_model_folder_whose_config_does_not_fit_its_weights(tmp_path):
    """transformers would start the weights of a third layer random (and only warn): training refuses instead."""
    from cory import assets

    model = tmp_path / "model"
    shutil.copytree(assets.tiny_model_dir(), model)
    config = json.loads((model / "config.json").read_text())
    config["n_layer"] += 1
    (model / "config.json").write_text(json.dumps(config))
    run = tmp_path / "run"
    refused(run_script("imdb_train/ppo.py", *TINY, "--model_name", model, "--output_dir", run),
            f"error: model_name: {model}'s config.json does not match its weights",
            "missing from its weights (they would start random)")
    assert not run.exists()


# a billion queries: its logits alone are hundreds of TiB, more than any machine has
HUGE = ["--batch_size", "1000000000", "--adap_kl_ctrl", "false"]  # (adaptive KL refuses it first, on the horizon)


@pytest.mark.slow
def test_a_batch_that_cannot_fit_is_refused_before_anything_loads(tmp_path):
    run = tmp_path / "run"
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = refused(run_script("imdb_train/ppo.py", *TINY, *HUGE, "--output_dir", run),
                   "error: batch_size: 1,000,000,000 queries cannot fit this machine's memory",
                   "per query: 2 x 50,257 float32 logits and probabilities and 9 token ids", "at most ")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # its processor time: a busy machine's clock says little
    assert after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime < 60 and not run.exists(), line
    # in-process, with the model loaders made to fail: it is refused before any would be called
    rejected("imdb", "ppo", TINY + HUGE + ["--output_dir", run])
    rejected("imdb", "cory", ["--config", "configs/imdb/cory_tiny.yaml", *HUGE, "--output_dir", run])


def test_a_mini_batch_as_large_is_refused_too(tmp_path):
    line = rejected("imdb", "ppo", TINY + HUGE + ["--mini_batch_size", "1000000000", "--output_dir", tmp_path])
    assert line.startswith("error: batch_size: 1,000,000,000 queries cannot fit")


def test_an_answer_length_that_cannot_fit_a_model_of_unknown_size(tmp_path):
    # a hub id not downloaded: neither its context nor its vocabulary is known, the token ids alone are too many
    line = rejected("imdb", "ppo", TINY + ["--model_name", "some-org/not-downloaded", "--response_length_max",
                                           "1000000000000", "--output_dir", tmp_path / "run"])
    assert line.startswith("error: response_length_max: 1,000,000,000,000 tokens cannot fit this machine's memory")
    assert "logits not counted: some-org/not-downloaded's vocabulary is not known here" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("script,args", [
    ("imdb_train/ppo.py", ["--model_name", "random:gpt2-large", "--reward_model", "vader", "--dataset", "builtin"]),
    ("imdb_train/cory.py", ["--config", "configs/imdb/cory_gpu.yaml"]),
    ("gsm8k_train/cory.py", ["--model_name", "random:llama-2-7b"]),
])
def test_the_papers_sizes_are_accepted(script, args, tmp_path):
    # the paper's batches (IMDB 256 queries of up to 15 tokens, GSM8K 32 of 256) with the vocabulary known
    p = run_script(script, *args, "--output_dir", tmp_path / "run", "--print_config")
    assert p.returncode == 0 and "batch_size: " in p.stdout, p.stderr[-2000:]
