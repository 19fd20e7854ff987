"""One training step: the only place that drives a strategy through its moments.

``train.py``, the benchmarks and the tests all call :func:`train_step`, so a change
to the protocol between model, strategy and optimizer is made here once::

    strategy.zero_grad()                                # the strategy owns grad storage
    for m, micro-batch in enumerate(batch.micro):
        strategy.begin_backward(last_micro=(m == last))
        loss = model.loss(x, y)                         # forward (unit hooks may gather)
        (loss * samples / global_samples).backward()    # grad-ready hooks fire per parameter
    strategy.finish_gradients()                         # wait for the step's communication
    strategy.step()                                     # optimizer update (maybe sharded)

With a gradient codec on the strategy (``strategy.grad_codec``, e.g. exact mode's
integers: hpcdp/strategies/codec.py) the codec is told the step's size first
(``codec.begin_step(global_samples)``), and when ``finish_gradients()`` returns
False (the codec rejected this pass set: exact mode's scale guess was wrong) the
micro-batches run again from ``zero_grad``; recomputation is deterministic.

Rules it owns:

- The loss given to backward is weighted by ``micro_samples / global_samples``, so
  summing gradients over ranks gives the gradient of the global mean loss, also for
  a short last batch or uneven slices. A strategy that sums over a group of ranks
  only (DiLoCo's replica groups) says so with ``strategy.loss_scale(batch)``: the
  weights given to backward are multiplied by it (the reported loss is not).
- The empty-slice rule: a micro-batch with no samples on this rank still runs one
  forward and backward, on ``batch.filler`` (one sample) with weight 0, so its
  hooks fire like every other rank's (collectives started from hooks, or gathers
  started from forward hooks, must be joined by every rank).
- The random context: before each micro-batch's forward, ``model.streams`` (if the
  model has one) is set to (``batch.step``, the micro-batch's dataset indices), so
  every dropout mask is keyed by (seed, step, global sample index, layer), never by
  rank or call count (hpcdp/nn/streams.py).
- The returned ``loss`` is this rank's share of the global mean loss (the sum over
  ranks is the global mean), computed from ``loss.item()`` per micro-batch (one
  device sync per micro-batch on cuda).

Where to add a call: ``after_backward(m)`` runs after micro-batch ``m``'s backward
(tests use it to watch communication; a straggler benchmark sleeps there). Other
additions (a non-finite guard, a data prefetcher, checkpoint hooks) go at the
marked places below, not into callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hpcdp.data.micro import LocalBatch  # the batch record lives with the data (re-exported)


@dataclass
class StepResult:
    loss: float      # this rank's share of the global mean loss
    samples: int     # samples this rank trained on (fillers not counted)


def train_step(model, strategy, batch: LocalBatch, fetch: Callable, *,
               after_backward: Callable[[int], None] | None = None, checks=None) -> StepResult:
    """Run one optimizer step of ``model`` under ``strategy`` (see module docstring).

    ``fetch(indices) -> (x, y)``: the inputs and targets of those samples, as
    Tensors on the model's backend (or arrays ``model.loss`` accepts).
    ``checks``: a :class:`hpcdp.failure.steps.StepChecks` (the non-finite loss check
    and the fault-injection hook), called once the step's backward is done (with a
    gradient codec: once the codec accepted a pass set).
    """
    n_micro = len(batch.micro)
    if n_micro < 1:
        raise ValueError("train_step: a batch needs at least one micro-batch")
    if batch.global_samples < 1:
        raise ValueError(f"train_step: global_samples must be >= 1, got {batch.global_samples}")
    codec = getattr(strategy, "grad_codec", None)
    if codec is not None:
        codec.begin_step(batch.global_samples)
    # The reduction's scope: 1 when the strategy sums over every rank; a strategy whose
    # gradient sum spans a group of ranks (DiLoCo's replica groups) scales the weights
    # so that the group's sum is the gradient of the group's mean loss.
    grad_scale = strategy.loss_scale(batch) if hasattr(strategy, "loss_scale") else 1.0
    while True:
        strategy.zero_grad()
        loss_part = 0.0
        for m, idx in enumerate(batch.micro):
            strategy.begin_backward(last_micro=(m == n_micro - 1))
            loss_part += micro_pass(model, batch, m, fetch, checks, grad_scale=grad_scale)
            if after_backward is not None:
                after_backward(m)
        if checks is not None and codec is None:  # mid-step: DDP's allreduces are in flight
            checks.after_backward(loss_part, model.flat)
        if strategy.finish_gradients() is not False:
            break  # False: the codec rejected this pass set; run it again
    if checks is not None and codec is not None:
        checks.after_backward(loss_part, model.flat)
    strategy.step()
    return StepResult(loss=loss_part, samples=batch.samples)


def micro_pass(model, batch: LocalBatch, m: int, fetch: Callable, checks=None,
               grad_scale: float = 1.0) -> float:
    """Forward and backward of micro-batch ``m``: the random context, the loss weighting
    (and ``checks.loss_weight``, where a fault test's NaN enters) and the empty-slice
    rule. Returns its part of this rank's loss share (``grad_scale`` multiplies only
    the weight given to backward: :meth:`Strategy.loss_scale`)."""
    idx = batch.micro[m]
    weight = len(idx) / batch.global_samples if batch.weights is None else batch.weights[m]
    if len(idx) == 0:  # keep the hooks firing: one sample, weight 0
        idx = batch.filler
    x, y = fetch(idx)
    streams = getattr(model, "streams", None)
    if streams is not None:  # dropout masks keyed by (seed, step, sample, layer)
        streams.set(batch.step, idx)
    loss = model.loss(x, y)
    part = loss.item() * weight
    if checks is not None:
        weight = checks.loss_weight(weight)
    (loss * (weight * grad_scale if grad_scale != 1.0 else weight)).backward()
    return part


__all__ = ["LocalBatch", "StepResult", "train_step", "micro_pass"]
