"""The 8x8 handwritten digits (1797 images, 10 classes) that scikit-learn ships in
its wheel: a small real data set that needs no download.

The data is read straight from the file inside the installed scikit-learn
(``sklearn/datasets/data/digits.csv.gz``: 57 KB, one ``64 pixels,label`` row per
image), found with ``importlib.util.find_spec``, which locates the package without
importing it. Importing scikit-learn (and the SciPy it pulls in) to call
``load_digits`` cost about 1 s of every rank's start on a 2-core VM; reading the file
costs about 10 ms, and gives the same arrays.

Pixels (0..16) are scaled to [0, 1]; the train/test split is deterministic
(``data.seed``, ``data.test_fraction``).
"""

from __future__ import annotations

import gzip
import importlib.util
import zlib
from pathlib import Path

import numpy as np

from . import DataError, Dataset, split_indices

N_IMAGES, N_PIXELS, N_CLASSES = 1797, 64, 10
RELATIVE_PATH = ("datasets", "data", "digits.csv.gz")


def digits_file() -> Path:
    """Path of the digits file in the installed scikit-learn (not imported)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("data.kind = 'digits' reads the digits file that scikit-learn ships; "
                        "install it: pip install 'hpcdp[digits]'")
    path = Path(next(iter(spec.submodule_search_locations)), *RELATIVE_PATH)
    if not path.is_file():
        raise DataError(f"data.kind = 'digits': scikit-learn is installed but has no {path}; "
                        "reinstall it: pip install --force-reinstall 'hpcdp[digits]'")
    return path


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
