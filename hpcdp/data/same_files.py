"""Ranks agree on their data before training: the same files, the same value checks.

On a cluster every rank opens the data files on its own node. A file missing on
some nodes, or a different copy (an older version, a half-finished copy), would
otherwise surface as one rank's error while the others wait in a collective, or
worse, as silently different batches. :func:`check_same_files` compares, for every
file, whether it exists, its size and a CRC32 of its first 64 KiB across the ranks
and raises the same error on every rank, naming the config key and the ranks.

:func:`combine_max` combines value checks made on each rank's share of a file
(label ranges, NaN counts), and reports an error that one rank met while opening
or scanning its share, the same way, so every rank stops with the same message.

Both go through :func:`hpcdp.failure.agreement.agree` (a deadline-bounded hpcdp.comm
all-gather on the job's agreement channel; bounded by ``comm.setup_timeout`` in
``hpcdp train``): one small exchange each at startup; texts move only when ranks
differ or a rank failed. A disagreement is a :class:`~hpcdp.failure.agreement.JobError`
(a ConfigError: ``hpcdp train`` exits with status 2 on every rank).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np

from .dataset import DataError

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
            seen = "; ".join(f"{_ranks(rs)} {'sees' if len(rs) == 1 else 'see'} {size:,} bytes, "
                             f"header CRC32 {crc:08x}"
                             for (size, crc), rs in groups.items())
            raise DataError(f"{key}: file {path!r} differs between ranks ({seen}); every rank must "
                            "read the same file: copy it again to every node or use a shared file system")


def _timeout(timeout):
    from hpcdp.comm import default_timeout
    return default_timeout() if timeout is None else float(timeout)


def check_same_files(files: list[tuple[str, str]], comm=None, timeout: float | None = None) -> None:
    """Every rank: the files ``[(config key, path), ...]`` exist and are the same everywhere.

    Collective over ``comm`` (every rank calls it with the same keys; the paths may
    differ, e.g. node-local copies); without a communicator, or on one rank, it
    checks that the files exist.
    """
    mine = [file_facts(p) for _, p in files]
    if comm is not None and comm.Get_size() > 1:
        from hpcdp.failure.agreement import agree

        def differences(texts):
            try:
                compare_facts(files, np.array([json.loads(t) for t in texts], dtype=np.int64))
            except DataError as e:
                return str(e)
            return "the data files differ across ranks"

        agree(comm, None, what="the data files", timeout=_timeout(timeout), fingerprint=json.dumps(mine),
              skew=differences)
    compare_facts(files, np.array([mine], dtype=np.int64).reshape(1, len(files), 3))


def combine_max(values, comm=None, timeout: float | None = None, error: BaseException | None = None) -> np.ndarray:
    """Elementwise max of this rank's int ``values`` over the ranks of ``comm`` (collective).

    ``error``: what went wrong on this rank instead (then ``values`` is ignored):
    every rank raises the same JobError naming it. Without ``comm``: ``values``,
    or ``error`` raised.
    """
    if comm is None or comm.Get_size() == 1:
        if error is not None:
            raise error
        return np.array(values, dtype=np.int64)
    from hpcdp.failure.agreement import agree

    share = None if error is not None else json.dumps([int(v) for v in values])
    shares = agree(comm, error, what="the data check", timeout=_timeout(timeout), share=share)
    return np.array([json.loads(t) for t in shares], dtype=np.int64).max(axis=0)
