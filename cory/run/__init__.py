"""The run folder's guard, which a reader of the method may skip: what a run may start, resume or overwrite
(``run_rules``, ``targets``), the checks before anything loads (``preflight``), the files a run writes
(``outputs``), its checkpoints (``checkpoint``) and its final models (``final``)."""
