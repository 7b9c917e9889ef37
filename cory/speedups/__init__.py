"""Speed and memory tricks behind the paper's game, each optional (``fast_ppo: false`` turns the PPO ones off)
and each giving the same results as trl's stock path up to float rounding (tests/test_ppo_passes.py):

* ``windowed``: trl's PPOTrainer computing logits only on the response window, reusing the rollout pass as
  epoch 0's training pass, and splitting a mini-batch into passes within ``max_pass_tokens``;
* ``packing``: padding-free forward passes (every sequence of a pass in one row);
* ``passes``: the pass planner (which samples go into which forward pass);
* ``budget``: ``max_pass_tokens: auto``, the token budget of one pass measured from the GPU's free memory;
* ``patches``: glibc's allocator returning freed memory, and accelerate leaving frozen models unwrapped.

Measured effects: benchmarks/README.md. Shapes in the docstrings: B samples of a pass or mini-batch, T tokens
of a sequence, W the response window (the longest response of the batch), V the vocabulary, N the tokens of a
packed row.
"""
