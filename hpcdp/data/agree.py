"""Ranks agree on their data before training: the same files, the same value checks.

On a cluster every rank opens the data files on its own node. A file missing on
some nodes, or a different copy (an older version, a half-finished copy), would
otherwise surface as one rank's error while the others wait in a collective, or
worse, as silently different batches. :func:`check_same_files` compares, for every
file, whether it exists, its size and a CRC32 of its first 64 KiB on every rank,
with one all-gather under hpcdp.comm's deadline (``comm.timeout``), and raises
the same :class:`DataError` on every rank, naming the config key and the ranks.

:func:`reduce_max` combines value checks made on each rank's share of a file
(label ranges, NaN counts) the same way, so a bad value found by one rank stops
every rank with the same message. Both cost one small collective at startup.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from . import DataError

HEADER_BYTES = 64 * 1024  # bytes of each file that are checksummed


def file_facts(path: str) -> tuple[int, int, int]:
    """(exists as a file, size in bytes, CRC32 of the first HEADER_BYTES); (0, 0, 0) if absent."""
    p = Path(path)
    if not p.is_file():
        return 0, 0, 0
    try:
        with open(p, "rb") as f:
            head = f.read(HEADER_BYTES)
        return 1, os.path.getsize(p), zlib.crc32(head)
    except OSError:
        return 0, 0, 0


def _ranks(rs) -> str:
    rs = list(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"


def compare_facts(files: list[tuple[str, str]], facts: np.ndarray) -> None:
    """Raise the DataError for ``facts[rank, file] = (exists, size, crc)``; pure (no MPI)."""
    n_ranks = facts.shape[0]
    for j, (key, path) in enumerate(files):
        col = facts[:, j, :]
        missing = [r for r in range(n_ranks) if col[r, 0] == 0]
        if len(missing) == n_ranks:
            raise DataError(f"{key}: file not found: {path!r}")
        if missing:
            have = [r for r in range(n_ranks) if r not in missing]
            raise DataError(f"{key}: file {path!r} is missing on {_ranks(missing)} of {n_ranks} "
                            f"(found on {_ranks(have)}); every rank reads it: put it on a file system "
                            "every node mounts, or copy it to the same path on every node")
        groups: dict[tuple[int, int], list[int]] = {}
        for r in range(n_ranks):
            groups.setdefault((int(col[r, 1]), int(col[r, 2])), []).append(r)
        if len(groups) > 1:
            seen = "; ".join(f"{_ranks(rs)} see {size:,} bytes, header CRC32 {crc:08x}"
                             for (size, crc), rs in groups.items())
            raise DataError(f"{key}: file {path!r} differs between ranks ({seen}); every rank must "
                            "read the same file: copy it again to every node or use a shared file system")


def check_same_files(files: list[tuple[str, str]], comm=None, timeout: float | None = None) -> None:
    """Every rank: the files ``[(config key, path), ...]`` exist and are the same everywhere.

    Collective over ``comm`` (every rank calls it with the same list); without a
    communicator, or on one rank, it checks that the files exist.
    """
    mine = np.array([file_facts(p) for _, p in files], dtype=np.int64).reshape(-1)
    if comm is None or comm.Get_size() == 1:
        compare_facts(files, mine.reshape(1, len(files), 3))
        return
    from hpcdp.comm import all_gather

    n = comm.Get_size()
    full = np.empty(n * mine.size, dtype=np.int64)
    all_gather(mine, full, comm=comm, timeout=timeout)
    compare_facts(files, full.reshape(n, len(files), 3))


def reduce_max(values: np.ndarray, comm=None, timeout: float | None = None) -> np.ndarray:
    """Elementwise max of int64 ``values`` over the ranks of ``comm`` (a copy; local without comm)."""
    out = np.array(values, dtype=np.int64)
    if comm is None or comm.Get_size() == 1:
        return out
    from hpcdp.comm import allreduce

    return allreduce(out, comm=comm, op="max", timeout=timeout)
