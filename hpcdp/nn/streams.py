"""Random streams of a model: every draw is keyed by (seed, step, sample, layer).

A dropout mask must not depend on which rank computes it, on how many micro-batches
came before it, or on the backend: element j of sample s in layer L at optimizer
step t is a pure function of (model seed, t, s, L, j) through Philox4x32-10
(hpcdp/backend/philox.py). So N ranks draw, for each sample, the mask one rank
would draw for it, and a resumed run draws what the uninterrupted one did, with no
generator state to save.

The step and the global sample indices of the batch are not something a layer can
know: :func:`hpcdp.step.train_step` sets them on the model's ``streams`` before each
micro-batch's forward (``model.streams.set(step, samples)``). This is a small
context object per model, not a global. A training-mode forward with dropout
before anything set them is an error that says so; evaluation (``model.eval()``)
draws nothing.
"""

from __future__ import annotations

import numpy as np


class RandomStreams:
    """The draw context of one model: its seed, plus the step and the sample indices
    of the batch being run (set by train_step)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.step: int | None = None
        self.samples: np.ndarray | None = None
        self._layers = 0

    def new_layer(self) -> int:
        """A distinct stream id for one random layer, in construction order (1, 2, ...)."""
        self._layers += 1
        return self._layers

    def set(self, step: int, samples) -> None:
        """The next forwards run 0-based optimizer step ``step`` on the samples with
        these global (dataset) indices, in batch order."""
        samples = np.asarray(samples)
        if samples.ndim != 1 or not np.issubdtype(samples.dtype, np.integer):
            raise ValueError(f"streams.set: samples must be a 1-D array of integer sample indices, "
                             f"got {samples.dtype} of shape {samples.shape}")
        if int(step) < 0:
            raise ValueError(f"streams.set: step must be >= 0, got {step}")
        self.step, self.samples = int(step), samples.astype(np.int64, copy=False)

    def clear(self) -> None:
        self.step = self.samples = None

    def key(self, layer: int, batch: int, who: str = "dropout") -> dict:
        """The key of layer ``layer``'s draw for a batch of ``batch`` samples."""
        if self.samples is None:
            raise RuntimeError(
                f"{who} in training mode needs the step and the global sample indices of the "
                "batch: hpcdp.step.train_step sets them; in a loop of your own call "
                "model.streams.set(step, sample_indices) before the forward (or model.eval())")
        if len(self.samples) != batch:
            raise ValueError(f"{who}: the batch has {batch} samples but model.streams holds "
                             f"{len(self.samples)} sample indices (set them for this batch)")
        return {"seed": self.seed, "step": self.step, "layer": layer, "samples": self.samples}


__all__ = ["RandomStreams"]
