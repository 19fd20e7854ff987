"""The 8x8 handwritten digits (1797 images, 10 classes) that scikit-learn ships in
its wheel: a small real data set that needs no download.

Pixels (0..16) are scaled to [0, 1]; the train/test split is deterministic
(``data.seed``, ``data.test_fraction``).
"""

from __future__ import annotations

import numpy as np

from . import DataError, Dataset, split_indices


def load_digits_dataset(test_fraction: float, seed: int) -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("data.kind = 'digits' needs scikit-learn, which ships the digits data: "
                        "pip install 'hpcdp[digits]'") from None
    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    tr, te = split_indices(len(x), test_fraction, seed)
    return Dataset("digits", "classification", x[tr], y[tr], x[te], y[te], 10)
