"""Speed and memory tricks behind the paper's game, each optional (``fast_ppo: false`` turns the PPO ones off)
and each giving the same results as trl's stock path up to float rounding (tests/test_ppo_passes.py):

* ``passes``: PPO's forward passes on the response window only, within ``max_pass_tokens`` (the pass planner),
  packed, with the reference's log-probs and the full KL from the same pass (``cory.ppo`` calls them; its
  ``reuse_rollout`` makes the rollout pass epoch 0's training pass);
* ``packing``: padding-free forward passes (every sequence of a pass in one row);
* ``budget``: ``max_pass_tokens: auto``, the token budget of one pass measured from the GPU's free memory;
* ``patches``: glibc's allocator returning freed memory, and accelerate leaving frozen models unwrapped.

Measured effects: benchmarks/README.md. Shapes in the docstrings: B samples of a pass or mini-batch, T tokens
of a sequence, W the response window (the longest response of the batch), V the vocabulary, N the tokens of a
packed row.
"""
