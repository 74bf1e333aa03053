"""The training layer (imports torch): the engine that trains a scenario and records every
step (``engine``), the LR schedule, the clip policy, the N-rank path (``distributed``) and
one-step probes (``probe``)."""
