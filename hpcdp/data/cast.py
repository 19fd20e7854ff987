"""Casting float features to ``run.dtype``, refusing values the cast turns into inf.

The file loaders check that the stored values are finite, but a float64 value near
1e300 is finite in the file and ``inf`` in float32: training would then run on inf
and NaN. The cast result is checked (one pass over the features) and such data is
a :class:`DataError` that says what to change.
"""

from __future__ import annotations

import numpy as np

from .dataset import DataError


def cast_features(ds, dtype: str) -> None:
    """In place: ``ds.x_train`` / ``ds.x_test`` as contiguous ``dtype`` arrays, all finite."""
    for part in ("x_train", "x_test"):
        raw = getattr(ds, part)
        with np.errstate(over="ignore"):  # overflow is reported below, with what to do
            cast = np.ascontiguousarray(raw, dtype=dtype)
        if raw.dtype.kind == "f" and cast.dtype.itemsize < raw.dtype.itemsize and not np.isfinite(cast).all():
            bad = int((~np.isfinite(cast)).sum())
            raise DataError(f"data: {bad} feature value(s) of {part[2:]} overflow run.dtype = {dtype!r} "
                            f"(largest magnitude {float(np.abs(raw).max()):.3g}; {dtype} holds up to "
                            f"{float(np.finfo(dtype).max):.3g}): rescale the data or set "
                            'run.dtype = "float64"')
        setattr(ds, part, cast)
