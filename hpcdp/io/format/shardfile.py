"""Layout "split": one HDF5 file per writing rank, one dataset per piece.

``rank-00003.h5`` holds the pieces rank 3 owns, each a 1-D dataset named
``/<logical tensor>/<element offset>`` (e.g. ``/optim/m/h.0.mlp.c_fc.weight/1536``)
with attributes ``offset`` (element offset in the flattened tensor), ``block``
(elements per checksum block) and ``xxh3_128`` (block digests; ``sha256`` in format 1). The root's attributes
carry the rank, the world size and this rank's scalars (optimizer step count, PS
server version).

Write order, in one pass over the open file: the HDF5 structure (small), the bulk
bytes at the page-aligned offsets HDF5 allocated (descriptors of our own, O_DIRECT
where the file system takes it: direct.py; HDF5 itself writes only metadata,
elsewhere in the file), then the digests, which threads have been computing
meanwhile, as attributes; close, one ``fsync``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .checksum import WRITE, block_elements, submit_digests
from ..failpoint import failpoint
from .names import FORMAT_NAME, FORMAT_VERSION
from ..disk.direct import PieceWriter
from .h5 import create, fsync_file, put_attr, raw_dataset


def set_attrs(obj, attrs: dict) -> None:
    """Plain attributes in sorted order (deterministic bytes)."""
    for key in sorted(attrs):
        value = attrs[key]
        if isinstance(value, bool):
            value = np.int64(value)
        elif isinstance(value, int):
            value = np.int64(value)
        elif isinstance(value, float):
            value = np.float64(value)
        obj.attrs[key] = value


def write_rank_file(path, snap, attrs: dict, *, step: int, rank: int, threads: int = 1) -> dict:
    """Write ``snap`` (a :class:`~hpcdp.io.save.snapshot.Snapshot`) to ``path`` and fsync it;
    ``threads`` hash (checksum.hash_threads). Returns how the bytes went
    (``direct``: O_DIRECT was used; ``direct_bytes``, ``buffered_bytes``)."""
    pieces = snap.pieces
    blocks = [block_elements(p.data.dtype.itemsize) for p in pieces]
    groups = {}
    with create(path) as f, ThreadPoolExecutor(max_workers=threads) as pool:
        # digests in threads from now on, while the structure is made and the bytes
        # written (xxhash and pwrite release the GIL)
        digests = [submit_digests(pool, p.data, b) for p, b in zip(pieces, blocks)]
        set_attrs(f, {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": "rank",
                      **attrs, **snap.scalars})
        datasets = []
        for p, block in zip(pieces, blocks):
            ds = raw_dataset(f, f"{p.tensor}/{p.offset}", p.size, p.data.dtype, groups)
            put_attr(ds, "offset", np.int64(p.offset))
            put_attr(ds, "block", np.int64(block))
            datasets.append(ds)
        # The bulk bytes go to the storage HDF5 allocated (early, never filled, page
        # aligned) through descriptors of our own, O_DIRECT where the file system takes
        # it (direct.py): HDF5 writes only metadata, elsewhere in the file.
        with PieceWriter(path) as w:
            for i, (p, ds) in enumerate(zip(pieces, datasets)):
                w.write(p.data, ds.id.get_offset())
                if i == len(pieces) // 2:
                    failpoint("ckpt-mid-write", step=step, rank=rank)
        stats = {"direct": w.direct, "direct_bytes": w.direct_bytes, "buffered_bytes": w.buffered_bytes}
        for ds, d in zip(datasets, digests):
            put_attr(ds, WRITE, d())
    fsync_file(path)  # the one fsync of this file: data (O_DIRECT or not) and metadata
    return stats


def list_pieces(f) -> list[tuple[str, int, int, str]]:
    """``(tensor, offset, size, dtype)`` of every piece dataset in an open rank file."""
    out = []

    def visit(name, obj):
        if hasattr(obj, "shape") and "offset" in obj.attrs:
            tensor = name.rpartition("/")[0]
            out.append((tensor, int(obj.attrs["offset"]), int(obj.shape[0]), str(obj.dtype)))
    f.visititems(visit)
    return out


class SplitLayout:
    """``checkpoint.layout = "split"``: one file per writing rank (hpcdp/io/format/layouts.py)."""

    name = "split"
    separate_writer = True   # a rank's file needs no MPI: another process may write it


    def check_available(self) -> None:
        pass

    def files(self, world_size: int) -> list[str]:
        from .names import rank_file_name
        return [rank_file_name(r) for r in range(world_size)]

    def write(self, tmp, job, comm, rank: int, size: int, timeout: float) -> None:
        attrs = {"rank": rank, "world_size": size, "step": job.step}
        write = job.writer or write_rank_file   # the writer process's, for an asynchronous save
        write(tmp / self.files(size)[rank], job.snapshot, attrs, step=job.step, rank=rank, threads=job.threads)

    def per_file(self, rows_per_rank: list) -> list:
        return rows_per_rank            # file r holds rank r's pieces

    def list_pieces(self, f) -> list:
        return list_pieces(f)

    def dataset_path(self, tensor: str, piece_off: int) -> str:
        return f"{tensor}/{piece_off}"

    def dataset_len(self, piece_size: int, tensor_numel: int) -> int:
        return piece_size

    def piece_digests(self, ds, piece_off, piece_size, block, digests, where):
        return digests, 0               # the dataset is the piece


SPLIT = SplitLayout()

__all__ = ["write_rank_file", "list_pieces", "set_attrs", "SplitLayout", "SPLIT"]
