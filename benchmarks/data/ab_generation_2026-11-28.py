import time, torch, sys, tempfile
import arithmetic_train.ppo as script
from cory.config import build, load_yaml
from cory.train import prepare_run
from pathlib import Path
torch.set_num_threads(1)
s = load_yaml(Path("configs/arithmetic/ppo_cpu.yaml")); s.update(output_dir=tempfile.mkdtemp(), seed=6, steps=1, eval_every=0)
run = prepare_run(build(script.Hyperparameters, s))
(name, agent), = run.agents.items()
batch = run.task.sample(32); prompts = run.rollout.prompts(batch)
from cory.generation import shared_prefix_length
print("shared", shared_prefix_length(prompts), "lens", sorted({len(p) for p in prompts}))
kw = dict(run.rollout.gen_kwargs, max_new_tokens=20)
agent.trainer.model.eval()
for i in range(2):
    torch.manual_seed(0); t=time.perf_counter(); a = agent.generate(prompts, **kw); t1=time.perf_counter()
    torch.manual_seed(0)
    with torch.inference_mode(): b = agent.trainer.generate(prompts, batch_size=32, return_prompt=False, **kw)
    t2=time.perf_counter()
    print(f"new {t1-t:.1f}s trl {t2-t1:.1f}s equal {[x.tolist() for x in a]==[x.tolist() for x in b]}", flush=True)
