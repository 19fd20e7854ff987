"""Exact mode = a gradient codec + the fixed micro-batch plan.

:class:`ExactMode` installs :class:`hpcdp.exact.codec.IntegerCodec` on the strategy
through the seam's one hook (``Strategy.set_grad_codec``) and cuts each step's
global batch with :func:`hpcdp.data.micro.rank_micro_batches`; the step itself is
:func:`hpcdp.step.train_step`, as in fast mode. Every strategy that can carry a
codec is exact: none, ddp, zero 1-3 and the synchronous parameter server
(hpcdp/strategies/codec.py says what each does with it); any other is a clear
error at setup, before step 1.
"""

from __future__ import annotations

from hpcdp.config_error import ConfigError
from hpcdp.data.micro import LocalBatch, rank_micro_batches

from .codec import IntegerCodec


class ExactMode:
    """Built after ``strategy.setup`` on every rank (a dedicated server too)."""

    def __init__(self, cfg_train, strategy, world, flat):
        self.micro = int(cfg_train.exact_micro_batch)
        self.chosen = bool(getattr(cfg_train, "exact_micro_chosen", False))
        self.strategy, self.world, self.flat = strategy, world, flat
        # The workers' communicator: the codec's agreements run among them only (a
        # dedicated parameter server never runs a step). Collective over the world.
        self.worker_comm, self._own_comm = world.comm, False
        if world.size > 1:
            from mpi4py import MPI
            sub = world.comm.Split(0 if strategy.is_worker else MPI.UNDEFINED, world.rank)
            self.worker_comm = sub if strategy.is_worker else None  # a server gets COMM_NULL
            self._own_comm = strategy.is_worker
        self.codec = IntegerCodec(flat.layout, self.micro, self.worker_comm, getattr(world, "ledger", None))
        try:
            strategy.set_grad_codec(self.codec)
        except NotImplementedError as e:
            self.close()
            name = getattr(strategy, "name", type(strategy).__name__)
            raise ConfigError(f"parallel.strategy: {name!r} has no exact mode yet ({e}; exact mode "
                              "supports 'none', 'ddp', 'zero' and 'ps' with mode = 'sync'); use "
                              "train.reproducible = 'fast'") from None

    def describe(self) -> str:
        how = (" (train.exact_micro_batch unset: chosen from the global batch; set it to choose)"
               if self.chosen else "")
        return (f"reproducible = exact: micro-batches of {self.micro} samples{how}, gradients summed in "
                f"int64 fixed point at one agreed scale; weights are bit-identical for any rank count")

    def local_batch(self, sampler, step0: int) -> LocalBatch:
        """This rank's whole micro-batches of 0-based step ``step0`` (hpcdp.data.micro)."""
        s = self.strategy
        micro, n = rank_micro_batches(sampler, step0, s.dp_size, s.dp_rank, exact_micro=self.micro)
        return LocalBatch(micro, n, filler=sampler.global_indices(step0)[:1], step=step0)

    # the codec's scale state, for tests and figures
    @property
    def guess(self):
        return self.codec.guess

    @guess.setter
    def guess(self, band) -> None:
        self.codec.guess = band

    @property
    def guesses(self) -> int:
        return self.codec.guesses

    @property
    def misses(self) -> int:
        return self.codec.misses

    def step_stats(self) -> dict:
        """This step's figures (merged over the strategy's in metrics.jsonl)."""
        return self.codec.step_stats()

    def close(self) -> None:
        if self._own_comm and self.worker_comm is not None:
            self.worker_comm.Free()
            self.worker_comm = None
            self._own_comm = False

    def abandon(self) -> None:
        """A rank was lost and the workers' communicator revoked (failure.on_rank_loss =
        "continue"): forget it without freeing it (a free could wait on the lost rank);
        the caller builds a new ExactMode on the survivors. close() is then a no-op."""
        if self._own_comm and self.worker_comm is not None:
            from hpcdp.comm import forget
            forget(self.worker_comm, free=False)
        self._own_comm = False


__all__ = ["ExactMode"]
