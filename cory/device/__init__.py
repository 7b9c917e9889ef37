"""The machine, which a reader of the method may skip: the precision a run computes in (``precision``), peak memory
and the CPU a timing was taken on (``memory``), and the process-wide patches a run applies (``patches``). The PPO
passes' token budget lives with the passes (``cory.passes``)."""
