"""Our PPO step (cory.ppo: response window, rollout reuse, token budget per pass, packing) against trl's stock
PPOTrainer.step: the same statistics and the same weight update, up to float rounding, on the tiny model."""
import pytest
import torch

from cory import models, packing, passes
from cory.agent import Agent
from cory.assets import locate
from cory.passes import pass_plan

STATS = ("kl", "sequence_entropy", "total_loss", "policy_loss", "value_loss", "approx_kl", "clip_fraction",
         "mean_value", "mean_return", "token_entropy", "kl_coef", "mean_score")  # StepStats, trl's step read into it


class StockAgent(Agent):
    def trainer_class(self):
        from trl import PPOTrainer
        return PPOTrainer, {}


class PaddedAgent(Agent):
    """Ours with right-padded passes instead of packed ones (models cory.packing cannot serve)."""

    def trainer_class(self):
        from cory.ppo import AgentTrainer
        return AgentTrainer, {"max_pass_tokens": self.cfg.max_pass_tokens, "pack": False}


class NoReuseAgent(Agent):
    """Ours with the rollout pass never reused as epoch 0's training pass."""

    def trainer_class(self):
        from cory.ppo import AgentTrainer
        return AgentTrainer, {"max_pass_tokens": self.cfg.max_pass_tokens, "reuse_rollout": False}


def test_pass_plan_splits_by_tokens_and_covers_every_sample():
    lengths = [5, 40, 12, 33, 7, 21, 40, 3]
    assert pass_plan(lengths, 0) == [list(range(8))]
    assert pass_plan(lengths, 8 * 40) == [list(range(8))]
    for budget in (40, 80, 100, 150, 200):
        plan = pass_plan(lengths, budget)
        assert sorted(i for p in plan for i in p) == list(range(8))
        assert all(len(p) * max(lengths[i] for i in p) <= budget for p in plan)
        assert len(plan) > 1
    # a sequence longer than the budget still gets a pass, alone
    assert sorted(pass_plan([50, 10, 10], 30), key=len)[0] == [0]
    # like lengths share a pass: the two longest first
    assert pass_plan(lengths, 100)[0] == [1, 6]
    # packed passes hold real tokens only: 161 tokens fit in 161, and in two passes of at most 100
    assert pass_plan(lengths, 161, packed=True) == [list(range(8))]
    plan = pass_plan(lengths, 100, packed=True)
    assert len(plan) == 2 and all(sum(lengths[i] for i in p) <= 100 for p in plan)


@pytest.fixture(scope="module")
def setup(ppo_batch):
    return ppo_batch


@pytest.fixture
def run_step(ppo_step):
    def run(cls, tmp_path, **over):
        _, stats, params = ppo_step(tmp_path, cls, **over)
        return stats, params
    return run


CASES = [
    {},                                                                # one pass, rollout reused as epoch 0
    {"max_pass_tokens": 30},                                           # several passes per mini-batch
    {"mini_batch_size": 2, "gradient_accumulation_steps": 2},          # trl's own accumulation
    {"mini_batch_size": 2, "gradient_accumulation_steps": 2, "max_pass_tokens": 16},
    {"max_grad_norm": 0.01, "max_pass_tokens": 30},                    # clipping sees the summed gradient
]


@pytest.mark.parametrize("cls,over", [(Agent, o) for o in CASES] + [(PaddedAgent, o) for o in CASES[:2]]
                         + [(NoReuseAgent, o) for o in CASES[:1]]
                         + [(Agent, dict(o, kl_penalty="kl")) for o in CASES[:2]],
                         ids=[f"packed{i}" for i in range(len(CASES))] + ["padded0", "padded1", "no_reuse0"]
                         + ["kl_estimate0", "kl_estimate1"])
def test_our_step_matches_trl(setup, run_step, tmp_path, cls, over):
    before = torch.cat([p.detach().flatten() for p in setup[2].parameters()])
    stock_stats, stock_params = run_step(StockAgent, tmp_path / "stock", **over)
    stats, params = run_step(cls, tmp_path / "ours", **over)
    for key in STATS:
        assert getattr(stats, key) == pytest.approx(getattr(stock_stats, key), rel=2e-4, abs=1e-5), key
    update = (stock_params - before).norm()
    assert update > 0
    assert float((params - stock_params).norm() / update) < 1e-3


def assert_step_matches_trl(ppo_step, tmp_path, policy, batch, over):
    """Our step and trl's stock step on ``batch``: the same statistics and, relative to the update, the same weights."""
    before = torch.cat([p.detach().flatten() for p in policy.parameters()])
    _, stock_stats, stock_params = ppo_step(tmp_path / "stock", StockAgent, batch=batch, **over)
    _, stats, params = ppo_step(tmp_path / "ours", Agent, batch=batch, **over)
    for key in STATS:
        assert getattr(stats, key) == pytest.approx(getattr(stock_stats, key), rel=2e-4, abs=1e-5), key
    assert float((params - stock_params).norm() / (stock_params - before).norm()) < 1e-3


def _one_shot_batch(tok):
    """Four arithmetic-style queries after the same worked example, as the arithmetic and GSM8K prompts are."""
    shot = "Question: What is 12 + 7?\nAnswer: 12 + 7 = 19. The answer is 19.\n\nQuestion: What is "
    queries = [torch.tensor(tok(shot + q + "?\nAnswer:")["input_ids"]) for q in ("4 - 9", "13 + 28", "7 + 1", "60")]
    responses = [torch.tensor(tok(r)["input_ids"]) for r in (" 4 - 9 = -5.", " 41", " 7 + 1 = 8. The answer", " 60")]
    return queries, responses


@pytest.mark.parametrize("over", CASES, ids=[f"packed{i}" for i in range(len(CASES))])
def test_our_step_matches_trl_on_queries_sharing_a_one_shot_example(setup, ppo_step, tmp_path, over):
    """Queries that begin with the same worked example: our packed passes hold it once per pass (cory.packing), and
    the step is still trl's, in every pass case."""
    tok, _, policy, _, _ = setup
    batch = _one_shot_batch(tok)
    assert passes.shared_tokens(batch[0], True) >= 8
    assert_step_matches_trl(ppo_step, tmp_path, policy, batch, over)


@pytest.mark.parametrize("spec", ["tiny", "random:llama-tiny"])
def test_a_shared_example_held_once_gives_the_same_pass(setup, monkeypatch, spec):
    """The window's logits, values and labels with the shared example held once equal those of every query packed
    whole, and of right-padded passes, on the response tokens; the row holds the example once (GPT-2's learned
    positions, Llama's rotary ones)."""
    tok, _, policy, _, _ = setup
    if spec != "tiny":
        tok, policy = models.load_tokenizer(locate(spec)), models.load_policy(locate(spec))
    queries, responses = _one_shot_batch(tok)
    window = max(len(r) for r in responses)
    inside = torch.arange(window)[None, :] < torch.tensor([len(r) for r in responses])[:, None]
    rows = []
    real = packing.Layout.__init__
    monkeypatch.setattr(packing.Layout, "__init__", lambda self, lengths, device, prefix=0: (
        rows.append(prefix + sum(lengths)), real(self, lengths, device, prefix))[1])

    def forward(pack, min_shared):
        monkeypatch.setattr(packing, "MIN_SHARED_PREFIX", min_shared)
        with torch.no_grad():
            return passes.window_forward(policy, queries, responses, window, pack=pack, pad_id=0, device="cpu")

    shared, whole, padded = forward(True, 8), forward(True, 10 ** 6), forward(False, 8)
    prefix = packing.shared_prefix_length(queries)
    assert rows == [sum(len(q) + len(r) for q, r in zip(queries, responses)) - 3 * prefix,
                    sum(len(q) + len(r) for q, r in zip(queries, responses))]
    for a, b, c in zip(shared, whole, padded):
        assert torch.allclose(a[inside].float(), b[inside].float(), atol=1e-5)
        assert torch.allclose(a[inside].float(), c[inside].float(), atol=1e-4)


def test_pass_plan_counts_a_shared_prefix_once_per_packed_pass():
    lengths = [50, 45, 40, 42]  # each begins with the same 30 tokens
    assert pass_plan(lengths, 177, packed=True) == [[0, 1, 2, 3]]
    assert pass_plan(lengths, 30 + 20 + 15 + 10 + 12, packed=True, shared=30) == [[0, 1, 2, 3]]
    plan = pass_plan(lengths, 70, packed=True, shared=30)
    assert sorted(i for p in plan for i in p) == [0, 1, 2, 3]
    assert all(30 + sum(lengths[i] - 30 for i in p) <= 70 for p in plan) and len(plan) == 2
    assert pass_plan(lengths, 70, packed=False, shared=30) == pass_plan(lengths, 70)  # padding: no sharing


@pytest.mark.parametrize("over", [{}, {"mini_batch_size": 2, "gradient_accumulation_steps": 2}], ids=["one", "two"])
def test_our_step_matches_trl_on_answers_ending_at_eos(setup, ppo_step, tmp_path, over):
    """Answers of 1 to 7 tokens, three of them ending at EOS, as a task with a stop (arithmetic, GSM8K) trains on:
    EOS is a token like any other, so both steps must agree on it too, here where the pad token is EOS itself."""
    tok, _, policy, queries, responses = setup
    eos = torch.tensor([tok.eos_token_id])
    batch = (queries, [torch.cat([responses[0][:3], eos]), responses[1], eos, torch.cat([responses[3], eos])])
    assert_step_matches_trl(ppo_step, tmp_path, policy, batch, over)


def test_full_kl_in_chunks_of_rows_equals_the_whole(monkeypatch):
    """Where a pass's log-softmaxes would be large the KL is taken a few rows at a time: the same numbers."""
    from cory import passes

    g = torch.Generator().manual_seed(0)
    logits, ref = torch.randn(9, 5, 31, generator=g), torch.randn(9, 5, 31, generator=g)
    whole = passes.token_kl(logits, ref)
    expected = torch.nn.functional.kl_div(torch.log_softmax(ref, -1), torch.log_softmax(logits, -1),
                                          log_target=True, reduction="none").sum(-1)
    assert torch.allclose(whole, expected, atol=1e-6)
    monkeypatch.setattr(passes, "KL_CHUNK_BYTES", 0)
    assert torch.equal(passes.token_kl(logits, ref), whole)


def test_per_token_rewards_is_trls_rule():
    """The score at the last response token, -eta * KL at every token: what trl's compute_rewards gives."""
    from cory.ppo import per_token_rewards

    kl = torch.tensor([[0.5, 0.25, 0.1], [0.2, 0.4, 0.0]])
    masks = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, non_score = per_token_rewards(torch.tensor([1.0, -2.0]), kl, masks, 0.1)
    assert torch.allclose(non_score, -0.1 * kl)
    assert torch.allclose(rewards, torch.tensor([[-0.05, -0.025, -0.01 + 1.0], [-0.02, -0.04 - 2.0, 0.0]]))


def test_packed_attention_is_plain_sdpa_outside_a_packed_pass():
    from cory import packing

    tok = models.load_tokenizer(locate("tiny"))
    model = models.load_policy(locate("tiny")).pretrained_model.eval()
    ids = torch.tensor([tok("The film was very good")["input_ids"], tok("I did not like it")["input_ids"]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        packing.register()
        model.config._attn_implementation = packing.NAME
        try:
            dispatched = model(input_ids=ids).logits
        finally:
            model.config._attn_implementation = "sdpa"
        with packing.packed(model.config, [ids.shape[1], ids.shape[1]], ids.device) as layout:
            packed = model(input_ids=ids.reshape(1, -1), position_ids=layout.position_ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.allclose(dispatched, plain, atol=1e-5)
    assert torch.allclose(packed.reshape(plain.shape), plain, atol=1e-4)


def test_budget_does_not_change_the_step(setup, run_step, tmp_path):
    before = torch.cat([p.detach().flatten() for p in setup[2].parameters()])
    one_stats, one_params = run_step(Agent, tmp_path / "one")
    for budget in (12, 30, 45):
        stats, params = run_step(Agent, tmp_path / f"b{budget}", max_pass_tokens=budget)
        for key in STATS:
            assert getattr(stats, key) == pytest.approx(getattr(one_stats, key), rel=1e-4, abs=1e-6), (budget, key)
        # Adam divides by the gradient's running scale: compare updates, not single weights
        assert float((params - one_params).norm() / (one_params - before).norm()) < 1e-3


class _Unreadable:
    """Stands for trl's PPOConfig after the trainer is built: reading any setting from it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"the step read {name} from trl's PPOConfig, not from the run's config")


class ConfigReadOnceAgent(Agent):
    """Ours with trl's PPOConfig made unreadable once trl's trainer is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trainer.config = _Unreadable()


@pytest.mark.parametrize("over", [{}, {"kl_penalty": "kl", "mini_batch_size": 2, "max_grad_norm": 0.01}],
                         ids=["full_kl", "kl_estimate"])
def test_the_step_reads_its_settings_from_the_run_config_only(setup, run_step, tmp_path, over):
    """Issue 61: one config object reaches the learner. trl's PPOConfig is built from the run's config for trl's
    trainer; the step reads nothing back from it, and gives the same step."""
    stats, params = run_step(Agent, tmp_path / "plain", **over)
    guarded_stats, guarded_params = run_step(ConfigReadOnceAgent, tmp_path / "guarded", **over)
    assert torch.equal(params, guarded_params)
    assert guarded_stats.scalars() == stats.scalars()
