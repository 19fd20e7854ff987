"""SHA-256 of the weights: the fingerprint exact mode promises is the same for any N.

The digest covers the parameters' bytes in flat layout order (names and shapes are
fixed by the model config) in the run's dtype, little-endian as stored. A rank
that holds the whole parameter buffer (none, ddp, ps workers, ZeRO 1-2) hashes it
directly; under ZeRO-3 every worker gathers the units first.
"""

from __future__ import annotations

import hashlib

import numpy as np


def weights_sha256(flat, strategy=None) -> str:
    """SHA-256 of every parameter; a strategy that holds only a shard of them (ZeRO-3:
    ``flat.data`` is None) gathers them first, a collective every worker must join."""
    data = flat.data
    if data is None:
        host = strategy.gather_full_params()
    else:
        host = data if isinstance(data, np.ndarray) else flat.backend.to_numpy(data)
    host = np.ascontiguousarray(host)
    if host.dtype.byteorder == ">":
        host = host.byteswap().view(host.dtype.newbyteorder("<"))
    return hashlib.sha256(host.view(np.uint8)).hexdigest()


__all__ = ["weights_sha256"]
