"""Layout "shared": one HDF5 file written collectively through h5py's mpio driver.

Every logical tensor is one 1-D dataset of all its elements (``/param/wte.weight``,
attribute ``shape`` for its real shape); each rank writes the hyperslabs it owns.
Checksums stay per piece (a rank hashes only what it wrote): the dataset's
attributes ``pieces`` ((P, 2) int64: element offset, size, sorted) and ``xxh3_128``
(``sha256`` in format 1: the block digests of piece 0, then piece 1, ...) with ``block`` elements per block.

HDF5 metadata (dataset creation, attributes) is collective in parallel HDF5: every
rank makes the same calls with the same values, so the pieces' offsets and digests
are first shared with small all-gathers (hpcdp.failure.agreement's ``allgather_rows``,
through :mod:`hpcdp.comm`, deadline-bounded).
The bulk data then goes, each rank its own hyperslabs, straight to the offsets HDF5
allocated (``pwrite``, O_DIRECT for the whole pages: direct.py), not through MPI-IO.

Needs h5py built against the same MPI as mpi4py (``bash .ci/parallel-hdf5.sh``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hpcdp.failure.agreement import allgather_rows

from .checksum import ALGORITHMS, WRITE, block_elements, submit_digests
from ..errors import CheckpointError
from ..failpoint import failpoint
from ..disk.direct import PieceWriter
from .names import FORMAT_NAME, FORMAT_VERSION
from .h5 import create, fsync_file, has_mpi, raw_dataset
from .shardfile import set_attrs

NO_MPI = ("checkpoint.layout = \"shared\" needs h5py built with MPI (parallel HDF5), but this h5py "
          "is serial (PyPI's wheel): build one with `bash .ci/parallel-hdf5.sh` (Open MPI, its own "
          "venv) and run from that venv, or use checkpoint.layout = \"split\"")


def check_available() -> None:
    if not has_mpi():
        raise CheckpointError(NO_MPI)


def write_shared(path, snap, expected: dict, comm, *, step: int, timeout: float = 300.0,
                 threads: int = 1) -> None:
    """Collective: every rank of ``comm`` calls it with its snapshot; ``expected``
    (tensor -> (shape, dtype), the same everywhere) fixes the datasets and their order."""
    check_available()
    tensors = list(expected)
    ids = {t: i for i, t in enumerate(tensors)}
    rows, digs = [], []
    with ThreadPoolExecutor(max_workers=threads) as pool:  # xxhash releases the GIL
        pending = [submit_digests(pool, p.data, block_elements(p.data.dtype.itemsize)) for p in snap.pieces]
        for p, result in zip(snap.pieces, pending):
            d = result()
            rows.append((ids[p.tensor], p.offset, p.size, len(d)))
            digs.append(d)
    rows_a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    digs_a = np.concatenate(digs) if digs else np.zeros((0, ALGORITHMS[WRITE][0]), np.uint8)
    every_rows = np.concatenate(allgather_rows(comm, rows_a, timeout=timeout))
    every_dig = np.concatenate(allgather_rows(comm, digs_a, timeout=timeout))
    starts = np.concatenate([[0], np.cumsum(every_rows[:, 3])]).astype(np.int64)
    mine, groups = {}, {}
    with create(path, driver="mpio", comm=comm) as f:
        set_attrs(f, {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": "shared",
                      "world_size": comm.Get_size(), "step": step})
        for ti, name in enumerate(tensors):
            sel = np.nonzero(every_rows[:, 0] == ti)[0]
            if sel.size == 0:
                continue
            order = sel[np.argsort(every_rows[sel, 1], kind="stable")]
            shape, dtype = expected[name]
            ds = raw_dataset(f, name, int(np.prod(shape, dtype=np.int64)), dtype, groups)
            ds.attrs["shape"] = np.array(shape, dtype=np.int64)
            ds.attrs["pieces"] = every_rows[order][:, 1:3]
            ds.attrs["block"] = np.int64(block_elements(ds.dtype.itemsize))
            ds.attrs[WRITE] = np.concatenate([every_dig[starts[i]:starts[i + 1]] for i in order])
            mine[name] = ds
        # Each rank's hyperslabs go straight to the storage HDF5 allocated (early, never
        # filled, page aligned), through this rank's own descriptors, O_DIRECT where the
        # file system takes it (direct.py); HDF5 writes only the metadata, collectively.
        with PieceWriter(path) as w:
            for i, p in enumerate(snap.pieces):
                ds = mine[p.tensor]
                w.write(p.data, ds.id.get_offset() + p.offset * ds.dtype.itemsize)
                if i == len(snap.pieces) // 2:
                    failpoint("ckpt-mid-write", step=step, rank=comm.Get_rank())
        f.flush()  # MPI_File_sync
    fsync_file(path)  # every rank: its own writes are durable (one fsync per rank)


def list_shared_pieces(f) -> list[tuple[str, int, int, str]]:
    """``(tensor, offset, size, dtype)`` of every piece in an open shared file."""
    out = []

    def visit(name, obj):
        if hasattr(obj, "shape") and "pieces" in obj.attrs:
            for off, size in np.asarray(obj.attrs["pieces"]).reshape(-1, 2):
                out.append((name, int(off), int(size), str(obj.dtype)))
    f.visititems(visit)
    return out


class SharedLayout:
    """``checkpoint.layout = "shared"``: one file, every rank's hyperslabs (hpcdp/io/format/layouts.py)."""

    name = "shared"
    probe_first = True   # Debian's parallel HDF5 1.10.8 can segfault on a damaged file (probe.py)

    def check_available(self) -> None:
        check_available()

    def files(self, world_size: int) -> list[str]:
        from .names import SHARED_FILE
        return [SHARED_FILE]

    def write(self, tmp, job, comm, rank: int, size: int, timeout: float) -> None:
        write_shared(tmp / self.files(size)[0], job.snapshot, job.expected, comm, step=job.step,
                     timeout=timeout, threads=job.threads)

    def per_file(self, rows_per_rank: list) -> list:
        return [sum(rows_per_rank, [])]  # the one file holds every rank's pieces

    def list_pieces(self, f) -> list:
        return list_shared_pieces(f)

    def dataset_path(self, tensor: str, piece_off: int) -> str:
        return tensor

    def dataset_len(self, piece_size: int, tensor_numel: int) -> int:
        return tensor_numel

    def piece_digests(self, ds, piece_off, piece_size, block, digests, where):
        """This piece's digests from the dataset's piece table; it starts at its offset."""
        table = np.asarray(ds.attrs["pieces"]).reshape(-1, 2)
        k = np.nonzero(table[:, 0] == piece_off)[0]
        if k.size != 1 or int(table[k[0], 1]) != piece_size:
            raise CheckpointError(f"{where}: the dataset's piece table does not list this piece")
        counts = (table[:, 1] + block - 1) // block
        base = int(counts[:k[0]].sum())
        return digests[base:base + int(counts[k[0]])], piece_off


SHARED = SharedLayout()

__all__ = ["write_shared", "list_shared_pieces", "check_available", "NO_MPI", "SharedLayout", "SHARED"]
