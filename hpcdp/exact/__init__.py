"""Exact mode (``train.reproducible = "exact"``): weights bit-identical for any rank
count, any supported strategy, and across a restart on another rank count.

Exact mode is a gradient codec plus a micro-batch plan (docs/reproducibility.md):

1. fixed micro-batches (hpcdp/data/micro.py): the global batch is cut into
   micro-batches of ``train.exact_micro_batch`` samples by global position; a rank
   computes whole micro-batches, each with the same shape and contents whichever
   rank holds it, on one BLAS thread, so each micro-batch's gradient has the same
   bits anywhere;
2. integer fixed point (fixed.py, codec.py): each micro-batch's gradient becomes
   int64 at one power-of-two scale agreed by a MAX reduction, integers are summed
   (locally, through the ring, on a server: any order) and converted back once.
   The codec plugs into the strategy seam's one hook, ``Strategy.set_grad_codec``
   (hpcdp/strategies/codec.py); ``hpcdp.step.train_step`` drives the step;
3. keyed random streams (hpcdp/nn/streams.py, hpcdp/backend/philox.py): every
   dropout mask is a function of (seed, step, global sample index, layer).

Modules: fixed.py (the integer kernels and the scale), codec.py (IntegerCodec:
the guessed and agreed scale, the parameter server's wire, the ZeRO clipping
norm), mode.py (ExactMode: builds and installs the codec, cuts batches),
digest.py (SHA-256 of the weights). The config rules live in hpcdp/config.py; the
tools ``hpcdp check-exact`` and ``hpcdp bench exact`` sit above the library.

Nothing is imported here.
"""
