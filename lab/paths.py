"""The held-out paths read at matched iterations, and each path's fall from its peak: secondary readings the
objective task's design names before its runs (results/arithmetic_cpu_comparison/DESIGN.md, "Secondary"), shown for
a task whose held-out evaluations record greedy accuracy (one that parses its answers). Descriptive: no answer is
drawn from them, and their p values are not corrected for the many readings.

The fall from the peak is a collapse reading that needs no diversity measure: a path that learned and then lost
it falls; one still climbing does not. Read at the last evaluation it favours a slower learner (a path that has not
yet gone far has had less room to fall), so it is read at matched held-out KL too, as the claim's reward is.
"""
from __future__ import annotations

from dataclasses import replace

from lab.collapse import markdown_table
from lab.design import load_design
from lab.matched_kl import HeldoutPath, heldout_path, paired_diff, value_at
from lab.results import POLICY, Experiment, Group, fmt
from lab.stats import Diff, p_two_sided

MEASURES = (("task_reward", "accuracy (sampled)"), ("greedy_reward", "greedy accuracy"), ("kl", "held-out KL"))

RULE = (
    "_Secondary, descriptive_ (named in DESIGN.md before the runs; no answer is drawn from them and their p values are "
    "not corrected for the many readings). **At matched iterations**: each model's held-out accuracy as sampled in "
    "training (the reward), greedy accuracy and held-out KL at each evaluation, mean ± SE over seeds, and each CORY "
    "agent minus PPO paired by seed (two-sided paired t-test's p). A method that learns slower shows lower KL at lower "
    "accuracy here whatever its trade-off: the claim is read at matched KL above. **The fall from the peak**: a path's "
    "best held-out accuracy so far minus its accuracy then (0 for a path at its best), at the last evaluation and "
    "where the path first reaches each KL of the design's grid (the best of its evaluations before that point and "
    "of the interpolated value there); a path that learned and lost it falls, one still climbing does not.")


def fall_at(path: HeldoutPath, k: float | None = None) -> float | None:
    """The path's best value so far minus its value where its KL first reaches ``k`` (``None``: at its last
    evaluation); None if it never reaches ``k``."""
    if k is None:
        return float(path.values.max() - path.values[-1])
    for n in range(1, len(path.kl) + 1):  # the first n evaluations that reach k: those before it, and k's value
        now = value_at(HeldoutPath(path.iterations[:n], path.kl[:n], path.values[:n], path.key), k)
        if now is not None:
            return float(max([now, *path.values[:n - 1]]) - now)
    return None


def _summary(values: list[float]) -> Diff:
    """Mean and SE over seeds; float noise (seeds with equal values) read as no spread."""
    d = paired_diff(values)
    return replace(d, mean=0.0 if abs(d.mean) < 1e-12 else d.mean, se=0.0 if d.se < 1e-12 else d.se)


def _mean_se(values: list[float], of: int) -> str:
    if not values:
        return "–"
    d = _summary(values)
    out = fmt(d.mean) + (f" ± {fmt(d.se)}" if d.n > 1 else "")
    return out + ("" if d.n == of else f" ({d.n})")


def _signed(values: list[float], of: int) -> str:
    if not values:
        return "–"
    d = _summary(values)
    out = ("+" if d.mean >= 0 else "") + fmt(d.mean) + (f" ± {fmt(d.se)}, p {fmt(p_two_sided(d))}" if d.n > 1 else "")
    return out + ("" if d.n == of else f" ({d.n})")


def _at(group: Group, seed: int, agent: str, key: str, it: int) -> float | None:
    return group.runs[seed].heldout_series(agent, key).get(it)


def _run_cell(group: Group, seed: int, agent: str, it: int) -> str:
    """One run at one evaluation: "sampled / greedy, KL", and "[copy, correction]" where the agent was read as the
    observer of the other's held-out answers."""
    value = {key: _at(group, seed, agent, key, it) for key in
             ("task_reward", "greedy_reward", "kl", "transfer/copy_rate", "transfer/correction_rate")}
    if value["task_reward"] is None:
        return "–"
    cell = f"{fmt(value['task_reward'])} / {fmt(value['greedy_reward'])}, {fmt(value['kl'])}"
    if value["transfer/copy_rate"] is not None or value["transfer/correction_rate"] is not None:
        cell += f" [{fmt(value['transfer/copy_rate'])}, {fmt(value['transfer/correction_rate'])}]"
    return cell


def run_rows(models: list[tuple[Group, str]], iterations: list[int]) -> list[list[str]]:
    """Each run's held-out path, a row per model and seed: what the means above are taken over."""
    return [[f"{g.name(a)}, seed {s}", *(_run_cell(g, s, a, i) for i in iterations)]
            for g, a in models for s in sorted(g.runs)]


def along_paths(exp: Experiment) -> str | None:
    """The section's text, or None where the runs' held-out evaluations record no greedy accuracy or there are no
    held-out paths of PPO and CORY."""
    ppo, cory = exp.main_group("ppo"), exp.main_group("cory")
    if ppo is None or cory is None:
        return None
    models = [(ppo, POLICY)] + [(cory, a) for a in cory.agents]
    if not any(r.heldout_series(a, "greedy_reward") for g, a in models for r in g.runs.values()):
        return None
    design = load_design(exp.path)
    iterations = sorted({i for g, a in models for r in g.runs.values() for i in r.heldout_series(a, "task_reward")})
    paired = sorted(set(ppo.runs) & set(cory.runs))

    rows = [[g.name(a), name] + [_mean_se([v for s in g.runs if (v := _at(g, s, a, key, i)) is not None],
                                          len(g.runs)) for i in iterations]
            for g, a in models for key, name in MEASURES]
    diffs = []
    for a in cory.agents:
        for key, name in MEASURES:
            cells = []
            for i in iterations[1:]:
                pairs = [(_at(cory, s, a, key, i), _at(ppo, s, POLICY, key, i)) for s in paired]
                cells.append(_signed([x - y for x, y in pairs if x is not None and y is not None], len(paired)))
            diffs.append([f"{cory.name(a)} − {ppo.name(eta=False)}", name, *cells])

    points = (None, *design.kl_grid)  # None: the last evaluation
    # per model: seed -> the fall at each point (None where the path never reached that KL)
    falls_of = [{s: [fall_at(p, k) for k in points] for s in g.runs if (p := heldout_path(g, s, a)) is not None}
                for g, a in models]
    falls, fall_diffs = [], []
    for (g, a), mine in zip(models, falls_of):
        cells = [_mean_se([f[j] for f in mine.values() if f[j] is not None], len(mine)) for j in range(len(points))]
        fell = sum(f[0] > design.margin for f in mine.values())
        falls.append([g.name(a), str(len(mine)), *cells, f"{fell} of {len(mine)}"])
    theirs = falls_of[0]
    for a, mine in zip(cory.agents, falls_of[1:]):
        both = [s for s in paired if s in mine and s in theirs]
        fall_diffs.append([f"{cory.name(a)} − {ppo.name(eta=False)}", *(
            _signed([mine[s][j] - theirs[s][j] for s in both if mine[s][j] is not None and theirs[s][j] is not None],
                    len(both)) for j in range(len(points)))])

    at_k = [f"at KL {k:g}" for k in design.kl_grid]
    return "\n".join([
        RULE, "",
        "**At each evaluation** (iteration 0: the base model), mean ± SE over seeds (fewer seeds in brackets):", "",
        markdown_table(["model", "measure", *map(str, iterations)], rows), "",
        "**Each CORY agent minus PPO at matched iterations**, paired by seed (mean ± SE, two-sided p):", "",
        markdown_table(["agent − PPO", "measure", *map(str, iterations[1:])], diffs), "",
        "**The fall from the peak of held-out accuracy** (sampled), mean ± SE over seeds (seeds whose path reached "
        "that KL in brackets where fewer):", "",
        markdown_table(["model", "seeds", "at the last evaluation", *at_k,
                        f"fell more than {design.margin:g} by the end"], falls), "",
        "Each CORY agent's fall minus PPO's, paired by seed (> 0: the agent fell further):", "",
        markdown_table(["agent − PPO", "at the last evaluation", *at_k], fall_diffs), "",
        "**Each run's path**: held-out accuracy sampled / greedy, held-out KL (nats), and for a CORY agent [copy rate, "
        "correction rate] as the observer of the other agent's held-out answers (n/a where undefined; – where the run "
        "has no evaluation there):", "",
        markdown_table(["run", *map(str, iterations)], run_rows(models, iterations))])
