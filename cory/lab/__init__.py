"""The lab bench: what runs, evaluates and reports experiments around the method. No training code imports it.

experiments  ``python -m cory.lab.experiments``: every (method, seed[, eta]) run of a comparison, then the report
evaluate     ``python -m cory.lab.evaluate``: trained models on held-out prompts (reward, KL, distinct-n; pass@k)
report       ``python -m cory.lab.report``: REPORT.md and the figures of an experiment folder
results      an experiment folder loaded: runs, curves, final values
verdict      the report's statistical answer: does CORY beat PPO as the paper claims?
figures      the plots
passk        the unbiased pass@k estimator
"""
