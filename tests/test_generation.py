"""Sampling reads a beginning all its prompts share (a one-shot example) once per batch (``cory.generation``): the
draws must be the ones trl's own ``generate`` makes on the same prompts with the same seed, since a run's answers,
and so everything it learns, follow from them."""
import pytest
import torch

from conftest import IMDB_PPO
from cory import models
from cory.agent import Agent
from cory.assets import locate
from cory.config import build
from cory.generation import shared_prefix_length
from cory.packing import MIN_SHARED_PREFIX
from cory.rollout import stop_at

SHOT = "Question: What is 12 + 7?\nAnswer: 12 + 7 = 19. The answer is 19.\n\nQuestion: What is "
QUESTIONS = ("4 - 9", "13 + 28", "7 + 1", "60 - 3", "5 + 5", "81 - 17")


def agent_of(spec, tmp_path):
    tok = models.load_tokenizer(locate(spec))
    policy = models.load_policy(locate(spec))
    cfg = build(IMDB_PPO, {"model_name": "tiny", "reward_model": "vader", "batch_size": len(QUESTIONS),
                          "mini_batch_size": len(QUESTIONS), "output_dir": str(tmp_path), "precision": "fp32"})
    return Agent("policy", cfg, policy, models.load_reference(locate(spec)), tok), tok


def draws(generate, kwargs):
    torch.manual_seed(0)
    out = [r.tolist() for r in generate(**kwargs)]
    return out, torch.rand(4)  # the random state after: the next draws follow on alike


@pytest.mark.parametrize("spec", ["tiny", "random:llama-tiny"])
@pytest.mark.parametrize("early_eos", [False, True])
def test_training_draws_are_trls(spec, early_eos, tmp_path):
    """GPT-2 and Llama; answers of a fixed length (EOS masked until then) and answers that end at EOS or the stop
    string, at different lengths, as the arithmetic and GSM8K presets allow."""
    agent, tok = agent_of(spec, tmp_path)
    prompts = [torch.tensor(tok(SHOT + q + "?\nAnswer:")["input_ids"]) for q in QUESTIONS]
    assert shared_prefix_length(prompts) >= MIN_SHARED_PREFIX
    kwargs = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, repetition_penalty=1.0, max_new_tokens=12,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **stop_at(tok, "Question:"))
    if early_eos:
        # a random model seldom draws its EOS: end answers at a token it does draw, so that they end at different
        # lengths and the batch runs on past its first finished row
        kwargs["eos_token_id"] = draws(lambda **kw: agent.generate(prompts, **kw), kwargs)[0][1][2]
    else:
        kwargs["min_new_tokens"] = 12

    ours = draws(lambda **kw: agent.generate(prompts, **kw), kwargs)
    trls = draws(lambda **kw: agent.trainer.generate(prompts, batch_size=len(prompts), return_prompt=False, **kw),
                 kwargs)
    assert ours[0] == trls[0]
    assert torch.equal(ours[1], trls[1])
    lengths = {len(r) for r in ours[0]}
    assert len(lengths) > 1 if early_eos else lengths == {12}


def test_prompts_that_share_nothing_are_trls_left_padded_batch(tmp_path):
    """IMDB's openings share no beginning: the plain left-padded call, as trl makes it."""
    agent, tok = agent_of("tiny", tmp_path)
    prompts = [torch.tensor(tok(t)["input_ids"]) for t in ("A film", "This movie was", "Why", "I")]
    kwargs = dict(do_sample=True, top_k=0, max_new_tokens=6, min_new_tokens=6, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id)
    ours = draws(lambda **kw: agent.generate(prompts, **kw), kwargs)
    trls = draws(lambda **kw: agent.trainer.generate(prompts, batch_size=len(prompts), return_prompt=False, **kw),
                 kwargs)
    assert ours[0] == trls[0] and torch.equal(ours[1], trls[1])
