"""One save, from host snapshots to a committed checkpoint (every rank calls it).

The phases and who runs them (each ends with an agreement, see hpcdp/failure/agreement.py, so a
failure anywhere stops every rank with the same message instead of a hang)::

    rank 0      prepare <root>/.step-S.tmp/                      (commit.prepare)
    every rank  write its data: rank-<r>.h5 (layout "split"), or its hyperslabs of
                shared.h5 (layout "shared", collective, h5py's mpio driver); fsync
    rank 0      read the data files' metadata, check every tensor is covered once,
                write index.h5, rename into place, write the marker, prune old ones

Nothing here touches training state: the caller built a :class:`SaveJob` from host
copies (or, for a synchronous save, views of buffers that do not change meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcdp.failure.agreement import allgather_rows, allgather_slots

from ..errors import AGREEMENT, CheckpointError, os_error_text
from ..format.commit import commit, prepare, prune, tmp_dir
from ..failpoint import failpoint
from ..format.names import step_dir_name
from ..format.h5 import open_read
from ..format.index import build_tables, write_index
from ..format.layouts import get_layout


@dataclass
class SaveJob:
    root: Path                  # the checkpoints folder (checkpoint.dir)
    step: int
    snapshot: object            # this rank's Snapshot
    expected: dict              # tensor -> (shape, dtype name), in index order
    attrs: dict                 # index root attributes (strategy, config, ...)
    state: dict                 # index /state attributes
    arrays: dict = field(default_factory=dict)   # index /state datasets
    layout: str = "split"
    keep: int = 0
    threads: int = 1            # hashing threads of this rank (checksum.hash_threads)
    writer: object = None       # a layout whose files need no MPI (``separate_writer``): who
    #                             writes this rank's file (writerproc.WriterProcess.write_rank_file)
    guard: object = None        # rank 0, before the commit: raises if this job may no longer
    #                             write into ``root`` (its writer lock was taken over: lock.check_held)


def save(job: SaveJob, comm, *, timeout: float = 300.0) -> Path:
    """Write ``job`` as the checkpoint of ``job.step``; returns its directory."""
    rank = comm.Get_rank() if comm is not None else 0
    size = comm.Get_size() if comm is not None else 1
    # rank 0 makes the temporary directory; its name is known to all (commit.tmp_dir)
    AGREEMENT.on_root(comm, _writing(lambda: prepare(job.root, job.step)), timeout=timeout, share=False)
    tmp = tmp_dir(job.root, job.step)
    mine = AGREEMENT.all_ok(comm, lambda: _piece_rows(job), timeout=timeout)
    layout = get_layout(job.layout)
    files = layout.files(size)
    AGREEMENT.all_ok(comm, _writing(lambda: layout.write(tmp, job, comm, rank, size, timeout)), timeout=timeout)
    # Every rank's piece table reaches rank 0 (its files are not reopened to learn it).
    every = allgather_rows(comm, mine, timeout=timeout)
    names = list(job.expected)
    found = layout.per_file([[(names[t], o, n, job.expected[names[t]][1]) for t, o, n in rows]
                             for rows in every])
    AGREEMENT.on_root(comm, _writing(lambda: _finish(job, tmp, files, found)), timeout=timeout, share=False)
    return Path(job.root) / step_dir_name(job.step)


def _writing(fn):
    """``fn`` with its OSError (a full disk, the file-size limit, a read-only folder)
    said in one phrase that names the file and what to do, for the agreement."""
    def run():
        try:
            return fn()
        except OSError as e:
            raise CheckpointError(os_error_text(e)) from e
    return run


def _piece_rows(job: SaveJob) -> np.ndarray:
    """(tensor index, offset, size) of this rank's pieces; a piece of the wrong dtype
    is refused here, naming the tensor."""
    ids = {t: i for i, t in enumerate(job.expected)}
    rows = []
    for p in job.snapshot.pieces:
        want = job.expected.get(p.tensor)
        if want is None:
            raise CheckpointError(f"save of step {job.step}: tensor {p.tensor} is not one of the model's "
                                  "or optimizer's")
        if p.data.dtype != np.dtype(want[1]):
            raise CheckpointError(f"save of step {job.step}: tensor {p.tensor} is {p.data.dtype} here, "
                                  f"the model's is {want[1]}")
        rows.append((ids[p.tensor], p.offset, p.size))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _finish(job: SaveJob, tmp: Path, files: list, found: list | None = None) -> Path:
    """Rank 0: index, rename, marker, prune. ``found``: per file, its pieces
    ``(tensor, offset, size, dtype)``; None reads them from the files' metadata."""
    where = f"checkpoint of step {job.step} in {tmp}"
    if found is None:
        found = []
        layout = get_layout(job.layout)
        for name in files:
            with open_read(tmp / name) as f:
                found.append(layout.list_pieces(f))
    failpoint("ckpt-before-index", step=job.step, rank=0)
    table = build_tables(job.expected, found, files, where)
    write_index(tmp, {**job.attrs, "layout": job.layout, "step": job.step}, job.expected, table, files,
                job.state, job.arrays)
    if job.guard is not None:
        job.guard()
    final = commit(tmp, job.step, lineage=job.attrs.get("lineage"))
    prune(job.root, job.keep)
    return final


def rank_scalar_arrays(comm, scalars: dict, *, timeout: float = 300.0) -> dict:
    """``{key: (world size,) array}`` of every rank's scalars (the same keys on every
    rank; float64, exact for integers below 2**53). One small all-gather."""
    keys = sorted(scalars)
    size = comm.Get_size() if comm is not None else 1
    rank = comm.Get_rank() if comm is not None else 0
    table = np.zeros((size, len(keys)), dtype=np.float64)
    table[rank] = [float(scalars[k]) for k in keys]
    if size > 1 and keys:
        allgather_slots(comm, table, timeout=timeout)
    return {k: table[:, i].copy() for i, k in enumerate(keys)}


__all__ = ["SaveJob", "save", "rank_scalar_arrays"]
