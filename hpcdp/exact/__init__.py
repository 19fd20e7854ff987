"""Exact mode (``train.reproducible = "exact"``): weights bit-identical for any rank
count, any supported strategy, and across a restart on another rank count.

Three things make a step's result independent of N (docs/reproducibility.md):

1. fixed micro-batches (batches.py): the global batch is cut into micro-batches of
   ``train.exact_micro_batch`` samples by global position; a rank computes whole
   micro-batches, each with the same shape and contents whichever rank holds it,
   on one BLAS thread, so each micro-batch's gradient has the same bits anywhere;
2. integer fixed point (fixed.py): each micro-batch's gradient becomes int64 with a
   per-tensor power-of-two scale agreed by a MAX reduction, integers are summed
   (locally, through the ring, on a server: any order) and converted back once;
3. keyed random streams (hpcdp/nn/streams.py, hpcdp/backend/philox.py): every
   dropout mask is a function of (seed, step, global sample index, layer).

Modules: rules.py (config checks, light: no numba), batches.py (the micro-batch
plan), fixed.py (the codec), reducers.py (how each strategy sums the integers),
ps.py (synchronous parameter server on integers), mode.py (the exact step),
digest.py (SHA-256 of the weights), check.py (``hpcdp check-exact``).

Nothing is imported here: parsing a config imports only rules.py.
"""
