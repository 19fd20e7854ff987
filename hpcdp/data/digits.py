"""The 8x8 handwritten digits (1797 images, 10 classes): a small real data set that
needs no download and no extra package.

The file ships inside hpcdp (``hpcdp/data/digits.csv.gz``, 57 KB, one ``64 pixels,label``
row per image): byte for byte the file scikit-learn ships, with its attribution in
``digits.NOTICE``. Reading it costs about 10 ms. Earlier hpcdp read it from the installed
scikit-learn; installing scikit-learn brought SciPy, and numba imports ``scipy.linalg``
at its first jitted call whenever SciPy is installed (a BLAS probe): about 0.1-0.15 s of
CPU in every rank's start, for nothing hpcdp uses.

Pixels (0..16) are scaled to [0, 1]; the train/test split is deterministic
(``data.seed``, ``data.test_fraction``).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from .dataset import DataError, Dataset, split_indices

N_IMAGES, N_PIXELS, N_CLASSES = 1797, 64, 10
FILE = Path(__file__).with_name("digits.csv.gz")


def digits_file() -> Path:
    """Path of the digits file shipped with hpcdp."""
    if not FILE.is_file():
        raise DataError(f"data.kind = 'digits': {FILE} is missing from this hpcdp install; "
                        "reinstall hpcdp (pip install --force-reinstall hpcdp, or pip install -e . "
                        "in a checkout)")
    return FILE


def read_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(pixels uint8 (1797, 64) in 0..16, labels int64 (1797,)) from the gzipped CSV."""
    try:
        text = gzip.decompress(path.read_bytes())
        values = np.array(text.replace(b"\n", b",").rstrip(b",").split(b","), dtype=np.int64)
    except (OSError, EOFError, zlib.error, ValueError) as e:
        raise DataError(f"data.kind = 'digits': cannot read {path}: {e}") from None
    if values.size != N_IMAGES * (N_PIXELS + 1):
        raise DataError(f"data.kind = 'digits': {path} holds {values.size} numbers, expected "
                        f"{N_IMAGES} rows of {N_PIXELS} pixels and a label")
    table = values.reshape(N_IMAGES, N_PIXELS + 1)
    x, y = table[:, :N_PIXELS], table[:, N_PIXELS]
    if x.min() < 0 or x.max() > 16 or y.min() < 0 or y.max() >= N_CLASSES:
        raise DataError(f"data.kind = 'digits': {path} has pixels outside 0..16 or labels outside 0..9")
    return x.astype(np.uint8), y


def load_digits_dataset(test_fraction: float, seed: int) -> Dataset:
    pixels, labels = read_digits(digits_file())
    x = pixels.astype(np.float64) / 16.0
    tr, te = split_indices(len(x), test_fraction, seed)
    return Dataset("digits", "classification", x[tr], labels[tr], x[te], labels[te], N_CLASSES)
