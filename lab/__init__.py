"""The lab bench: what runs, evaluates and reports experiments around the method. No training code imports it.

experiments      ``python -m lab.experiments``: every (method, seed[, eta]) run of a comparison, then the report
experiment_plan  what the runner is asked, checked before anything is written: flags, methods, every run's config
runs             one run of an experiment: what its folder holds, the command that trains it, its record in runs.json
collect          ``python -m lab.collect``: finished runs made in a clone, brought into the repository's folder
heldout_runs     the runner's held-out evaluations of every finished run's final models and of the base model
evaluate         ``python -m lab.evaluate``: trained models on held-out prompts (reward, KL, distinct-n; pass@k)
evaluation_plan  what lab.evaluate is asked, checked before any model loads: flags, models, base, data, reward
report           ``python -m lab.report``: REPORT.md and the figures of an experiment folder
results          an experiment folder loaded: its runs by method and eta, and what could not be read
curves           a run group's curves (one metric aligned over its seeds) and final values
labels           what a document names a method, an agent and a learner ("PPO (GRPO, K = 4)"); its number formats
compute          what a run computed in, as its log says: the precision and the CPU kind
design           an experiment folder's design.yaml, fixed before its runs: the primary endpoint and its settings
learning         did the baseline learn? asked before any comparison
matched_kl       the paper's claim read at matched KL: CORY's held-out reward against PPO's at the same held-out KL
collapse         the collapse test: do the final models' answers degenerate (CORY against PPO, paired by seed)?
verdict          the reading at matched iterations: does CORY beat PPO as the paper claims?
paths            the held-out paths at matched iterations, and each one's fall from its peak (secondary readings)
frontier         the eta sweep's frontier (paper Fig. 2c), read at matched KL
stats            the statistics behind the verdicts: one-sided t-tests, their power, Holm's correction
figures          the plots
equivalence      ``python -m lab.equivalence``: does a run in one precision learn what a run in another learns?
search           ``python -m lab.search``: a hyperparameter search's summary (which settings made PPO learn)
learners         ``python -m lab.learners``: a learner pilot's summary (does each method learn with RLOO or GRPO?)
gate             ``python -m lab.gate``: the over-optimisation gate (does PPO learn and then degrade at a rung?)
transfer         does CORY's observer use the pioneer's answer? the transfer a run recorded, for a report
transfer_check   ``python -m lab.transfer_check``: the same asked of a base model, before any training
passk            the unbiased pass@k estimator
errors           the lab commands' errors, and how a command ends on one (one line, exit status 2, 1 or 130)
"""
