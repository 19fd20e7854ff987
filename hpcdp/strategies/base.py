"""The strategy seam: how gradients (and parameters) move between ranks.

A strategy sees the model as a :class:`hpcdp.nn.params.FlatParams` (flat data and
grad storage, a layout name -> (offset, shape), and ``flat.units``: one contiguous
range per block, see :mod:`hpcdp.nn.units`) plus these moments, and acts only
through them. Only ``train.py`` wires model, strategy and optimizer together, and one
step is always :func:`hpcdp.step.train_step`::

    strategy.setup(flat, optimizer, world)          # once, before step 1
    if not strategy.is_worker:                       # dedicated server rank
        strategy.serve(on_save=...); return          # (restores first; saves on request)
    for each step:                                   # hpcdp.step.train_step
        strategy.zero_grad()                         # the strategy owns grad storage
        for micro in range(accum):
            strategy.begin_backward(last_micro=(micro == accum - 1))
            loss = model.loss(x, y) * (local_samples / global_samples)
            #   forward: unit pre-/post-forward hooks (Module.register_forward_*_hook)
            loss.backward()
            #   backward: a unit's pre-backward hook (on its output tensor), then the
            #   grad-ready hook of each parameter when its gradient is final
        strategy.finish_gradients()                  # wait for communication
        #   (False: a gradient codec asks for the step's micro-batches again)
        strategy.step()                              # optimizer update(s)
        metrics.update(strategy.step_stats())
    strategy.close()

The loss given to backward is already scaled by ``local_samples / global_samples``,
so summing gradients over ranks (op = sum) gives the gradient of the global mean
loss, also when the last global batch is short.

Storage: a replicated strategy (none, ddp, ps) keeps ``flat.data`` and ``flat.grad``
whole and reduces in place on views of them. A sharded one binds and releases a
unit's parameter and gradient storage explicitly (``FlatParams.bind`` /
``release``), so no full-size buffer needs to exist. What a rank owns of the
parameters, gradients and optimizer state is :meth:`Strategy.owned_ranges`
(global flat coordinates, built on :func:`hpcdp.ownership.owned_ranges`).

What the gradient collectives carry: the run's dtype, unless a gradient codec is
installed with :meth:`Strategy.set_grad_codec` (after setup): then each micro-batch's
gradient is encoded into the codec's payload dtype before a bucket's collective is
launched and decoded when it is done (hpcdp/strategies/codec.py; exact mode's int64
fixed point is one). A strategy that cannot carry one refuses it.

Checkpoints: a strategy that supports them has the four methods of
:mod:`hpcdp.io.protocol` (``checkpoint_pieces``, ``checkpoint_targets``,
``checkpoint_restored``, ``checkpoint_scalars``); a replicated one mixes in
``ReplicatedCheckpoint``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from hpcdp.io.protocol import ReplicatedCheckpoint


class Strategy(ABC):
    name: str = "abstract"

    # Data-parallel role of this rank, set by setup(). A rank that is not a worker
    # (a dedicated parameter server) gets no data: train.py calls serve() on it
    # instead of running the step loop. dp_rank/dp_size decide this rank's slice of
    # the global batch (shard_range(global_batch, dp_size, dp_rank)).
    is_worker: bool = True
    dp_rank: int = 0
    dp_size: int = 1
    # The full buffers (FlatParams.materialize) this strategy keeps: a replica keeps
    # both; ZeRO-2 only "data", ZeRO-3 none. train.py builds the model without
    # storage and materializes exactly these before setup().
    full_storage: tuple = ("data", "grad")
    # ZeRO stage of the state this strategy shards (0: a full replica).
    stage: int = 0

    def serve(self, on_save=None) -> None:
        """Run the server loop on a rank that is not a worker (until workers finish);
        ``on_save(step, wait)``: the run's checkpointer, for the workers' save requests."""
        raise NotImplementedError(f"strategy {self.name!r} has no server role")

    @abstractmethod
    def setup(self, flat, optimizer, world) -> None:
        """Make replicas identical (broadcast or verify) and register hooks."""

    def zero_grad(self) -> None:
        """Start a step with zero gradients (before the first micro-batch). The
        default zeroes the full grad buffer in place; a strategy that shards
        gradients zeroes what it holds."""
        self.flat.zero_grad()

    def loss_scale(self, batch) -> float:
        """The factor on this step's loss weights for backward (``batch``: this rank's
        LocalBatch, before its first micro-batch). 1: the weights are shares of the
        global batch and the gradient sum over every rank is the global mean's. A
        strategy whose gradient sum spans only a group of ranks returns ``global /
        group`` share (DiLoCo: each replica group trains on its own part of the batch)."""
        return 1.0

    def begin_backward(self, last_micro: bool = True) -> None:
        """Called before each micro-batch's backward. A replicated strategy starts
        communication only during the last micro-batch's backward (gradients
        accumulate locally before); a strategy without a full gradient buffer may
        reduce every micro-batch."""

    @abstractmethod
    def finish_gradients(self) -> bool | None:
        """Block until the gradients every rank needs are reduced. With a gradient
        codec: False if the codec rejected this pass set (the driver runs the step's
        micro-batches again); anything else means the gradients are ready."""

    # -- the gradient codec (hpcdp/strategies/codec.py) ---------------------------
    grad_codec = None

    def set_grad_codec(self, codec) -> None:
        """Carry gradients as ``codec``'s payload from the next step on (after setup).
        The default: this strategy has no codec support."""
        raise NotImplementedError(f"strategy {self.name!r} cannot carry a gradient codec")

    @abstractmethod
    def step(self) -> None:
        """Apply the optimizer (locally, sharded, or on a server)."""

    def owned_ranges(self, kind: str) -> list[tuple[int, int]]:
        """Global flat ``(offset, size)`` ranges of ``kind`` ("params", "grads" or
        "optim") this rank holds; the optimizer's state buffers are those ranges
        concatenated. The default is a full replica."""
        from hpcdp.ownership import owned_ranges
        return owned_ranges(kind, 0, [(0, self.flat.numel)], 1, 0)

    def step_stats(self) -> dict:
        """Per-step figures for metrics.jsonl (bytes, comm time, hidden time...)."""
        return self.clip_stats()

    # -- gradient-norm clipping (optim.clip_grad_norm), for step() ------------------
    grad_norm: float = float("nan")

    def clip_gradients(self, pieces, reduce=None) -> None:
        """If ``optimizer.clip_grad_norm`` is set, scale the reduced gradient this
        rank holds (``pieces``: 1-D arrays) so the global L2 norm is at most that;
        ``reduce`` sums squared norms over the ranks holding the other pieces (see
        hpcdp.optim.clip). Call between finish_gradients and the optimizer update."""
        max_norm = getattr(self.optimizer, "clip_grad_norm", 0.0)
        if max_norm:
            from hpcdp.optim.clip import clip_
            self.grad_norm = clip_(self.flat.backend, pieces, max_norm, reduce)

    def clip_stats(self) -> dict:
        """``grad_norm`` (before clipping) when clipping is on, else nothing."""
        return {"grad_norm": self.grad_norm} if getattr(self.optimizer, "clip_grad_norm", 0.0) else {}

    def finish_updates(self) -> None:
        """Make the parameters final after the last step (an asynchronous strategy
        applies its outstanding updates); the strategy stays usable for evaluation
        until close()."""

    def close(self) -> None:
        """Complete or cancel outstanding requests (clean shutdown)."""

    def abandon(self) -> None:
        """The job is failing (an exception is on its way out of the step loop): drop
        outstanding requests and hooks WITHOUT waiting for any peer, which may be dead
        or stuck; the caller then ends the job. Default: nothing to drop."""

    # -- failure.on_rank_loss = "continue" (hpcdp.failure.lasting) ------------------------
    def comms(self) -> list:
        """Communicators of the strategy's own besides the world's (a repair revokes
        them, with every communicator hpcdp derived from them). Default: none."""
        return []

    def failure_domain(self) -> tuple | None:
        """``(domain, index in it, ranks per domain)`` when ranks hold the state only
        together with the other ranks of their domain (hybrid ZeRO: the node); None
        when every rank holds all of it (DDP: any rank can be lost alone)."""
        return None

    def replica_arrays(self) -> list:
        """The parameters a rank holds and its replicas hold alike (1-D numpy arrays, a
        repair writes them in place from one replica). Default: the full buffer."""
        return [self.flat.data]


class SingleRank(ReplicatedCheckpoint, Strategy):
    """No communication: plain one-rank training (world size must be 1)."""

    name = "none"

    def setup(self, flat, optimizer, world) -> None:
        if world.size != 1:
            raise ValueError(
                f"multi-rank training ({world.size} ranks) needs a strategy: set "
                "parallel.strategy (e.g. --set parallel.strategy=ddp); without one "
                "each rank would silently train its own copy"
            )
        self.flat, self.optimizer = flat, optimizer
        self.dp_rank, self.dp_size = 0, 1

    def set_grad_codec(self, codec) -> None:
        from hpcdp.strategies.codec import FullGradPayload
        self.grad_codec, self._payload = codec, FullGradPayload(self.flat, codec)

    def zero_grad(self) -> None:
        self.flat.zero_grad()
        if self.grad_codec is not None:
            self._payload.zero()

    def begin_backward(self, last_micro: bool = True) -> None:
        if self.grad_codec is not None:
            self._payload.begin_micro()

    def finish_gradients(self) -> bool | None:
        if self.grad_codec is None:
            return None
        self._payload.fold()               # the last micro-batch's gradient
        ok = self.grad_codec.finish()
        if ok:
            self._payload.decode_into_grad()
        return ok

    def step(self) -> None:
        self.clip_gradients([self.flat.grad])
        self.optimizer.step(self.flat.data, self.flat.grad)
