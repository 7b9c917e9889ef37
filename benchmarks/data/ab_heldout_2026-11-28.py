import time, torch
from cory import heldout, models
from cory.assets import locate
from lab.evaluate import load_model
from cory.tasks.arithmetic import ArithmeticTask
torch.set_num_threads(1)
spec = "embedded:smollm2-135m"
tok = models.load_tokenizer(locate(spec)); ref = load_model(spec); model = load_model(spec)
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for w in model.parameters():
        if w.dim() > 1: w.add_(0.02 * w.std() * torch.randn(w.shape, generator=g))
task = ArithmeticTask(); ex = task.eval_examples(64)
def ev(m):
    return heldout.evaluate_reward(m, ref, tok, task, ex, max_new_tokens=20, batch_size=32, seed=0, reward_name="correctness", allow_early_eos=True, progress=False, greedy=True)
plain_g, plain_k = heldout.GREEDY_CPU_TOKENS, heldout._keeps_logits
for i in range(2):
    for variant in (("old", "new") if i == 0 else ("new", "old")):
        heldout.GREEDY_CPU_TOKENS = 0 if variant == "old" else plain_g
        heldout._keeps_logits = (lambda m: False) if variant == "old" else plain_k
        t = time.perf_counter(); r = ev(model); dt = time.perf_counter() - t
        print(variant, f"{dt:.1f}s", r["task_reward"], r["greedy_reward"], round(r["kl"], 6), flush=True)
