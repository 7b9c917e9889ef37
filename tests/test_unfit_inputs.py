"""What a run cannot take, refused in one line through the training script (exit 2) before it trains: a tokenizer
with nothing to pad a batch with."""
import json
import shutil

from conftest import TINY, run_script
from entry_points import refused


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

