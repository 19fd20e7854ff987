"""The compute-only baseline of a scaling point: the same job with communication off.

``python -m hpcdp.scale.compute_only train --config C --set ...`` (under ``mpiexec -n K``)
runs ``hpcdp train`` exactly as the study's DDP point does (same ranks, same data
slices of the same global batch, same model, optimizer and step) except that the
strategy is :class:`ComputeOnly`: gradients are never exchanged, every rank applies
its own update. The weights then drift apart between ranks, which changes nothing
about the cost of a step, and is why this is a benchmark baseline and not a strategy
(it lives here, not in ``hpcdp/strategies``).

Weak-scaling efficiency then splits in two (``hpcdp scale`` reports both):

- contention: ``t(1) / t_compute_only(K)``: compute slowed by sharing the node (memory
  bandwidth, caches, cores when oversubscribed);
- communication: ``t_compute_only(K) / t(K)``: the exposed collectives and their CPU cost.

The baseline passes its strategy factory to the training entry point
(``hpcdp.train.main_train(..., build_strategy=build)``); every step record carries
``compute_only = 1``, and ``hpcdp scale`` refuses a baseline run whose records lack it
(so a training loop that ignored the factory would fail loudly instead of timing DDP).
"""

from __future__ import annotations

import sys

from hpcdp.strategies.base import Strategy


class ComputeOnly(Strategy):
    """Data slices like DDP (rank r of K takes slice r of the global batch), no messages."""

    name = "compute-only"

    def setup(self, flat, optimizer, world) -> None:
        self.flat, self.optimizer = flat, optimizer
        self.dp_rank, self.dp_size = world.rank, world.size

    def finish_gradients(self) -> None:
        pass

    def step(self) -> None:
        self.optimizer.step(self.flat.data, self.flat.grad)

    def step_stats(self) -> dict:
        return {"compute_only": 1.0, "comm_s": 0.0, "comm_exposed_s": 0.0, "comm_hidden_s": 0.0,
                "bytes_sent": 0.0, "grad_bytes_sent": 0.0}


def build(parallel_cfg=None, world=None, comm_cfg=None) -> ComputeOnly:
    return ComputeOnly()


def main(argv=None) -> int:
    """``train --config C [--set S ...]``: ``hpcdp train`` with :func:`build` as its
    strategy factory, passed to the training entry point (no module is patched)."""
    import argparse

    from hpcdp.failure.policy import run_job
    from hpcdp.train import main_train

    p = argparse.ArgumentParser(prog="python -m hpcdp.scale.compute_only")
    p.add_argument("command", choices=["train"])
    p.add_argument("--config")
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args(argv)
    return run_job(lambda: main_train(args.config, args.set, build_strategy=build))


if __name__ == "__main__":
    sys.exit(main())
