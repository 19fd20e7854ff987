"""What every dataset is: :class:`Dataset` (host arrays, split into train and test),
:class:`DataError` (a dataset that cannot be used as configured) and the deterministic
train / test split. The modules of hpcdp.data import these from here; ``hpcdp.data``
re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class DataError(ValueError):
    """A dataset that cannot be used as configured; the message says what to fix."""


@dataclass
class Dataset:
    name: str
    task: str  # "classification" | "sequence"
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int  # classes, or vocabulary size for sequences
    # Extra facts, e.g. {"loss_floor": ...} for the synthetic Markov-chain sequences,
    # {"storage": "disk"} for views, {"tokenizer": ...} for a token corpus.
    info: dict = field(default_factory=dict)

    @property
    def n_train(self) -> int:
        return len(self.x_train)

    @property
    def n_test(self) -> int:
        return len(self.x_test)

    def describe(self) -> str:
        shape = "x".join(str(d) for d in self.x_train.shape[1:])
        where = ", on disk (read per step)" if self.info.get("storage") == "disk" else ""
        if "train_tokens" in self.info:  # a token corpus: samples are windows
            tok = self.info["tokenizer"]
            return (f"{self.name}: {self.info['train_tokens']:,} train / {self.info['val_tokens']:,} val "
                    f"tokens ({tok.kind} tokenizer, vocabulary {tok.vocab_size}), windows of "
                    f"{self.x_train.shape[1]} + 1 tokens, {self.n_test} evaluation windows{where}")
        return (f"{self.name}: {self.n_train} train / {self.n_test} test samples, "
                f"x {shape} {self.x_train.dtype}, {self.n_classes} "
                f"{'classes' if self.task == 'classification' else 'tokens'}{where}")


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic shuffled split of ``range(n)`` into (train, test) index arrays.

    The number of test samples is ``round(n * test_fraction)``; the split depends
    only on (n, test_fraction, seed).
    """
    perm = np.random.default_rng([seed, 0x5EED5]).permutation(n)
    n_test = int(round(n * test_fraction))
    if n - n_test < 1:
        raise DataError(f"data.test_fraction = {test_fraction} leaves no training samples out of {n}")
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


__all__ = ["DataError", "Dataset", "split_indices"]
