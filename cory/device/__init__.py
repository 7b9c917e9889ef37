"""The machine, which a reader of the method may skip: the precision a run computes in (``precision``), peak memory
and the CPU a timing was taken on (``memory``), the PPO passes' token budget on a GPU (``budget``), and the
process-wide patches a run applies (``patches``)."""
