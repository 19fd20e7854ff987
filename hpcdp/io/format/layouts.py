"""Checkpoint layouts: how a checkpoint's data files are cut (``checkpoint.layout``).

One registry, one protocol: save, the index builder and the reader ask the layout
object, never compare its name. A layout is one file holding one class with these
methods, plus one line in ``LAYOUTS`` (and its name in the config's allowed values)::

    check_available()                   # refuse early (e.g. no parallel HDF5)
    files(world_size) -> [names]        # the data files of one checkpoint
    write(tmp, job, comm, rank, size, timeout)   # this rank's part of a save
    per_file(rows_per_rank) -> [rows]   # each file's piece table from each rank's
    list_pieces(h5) -> [(tensor, offset, size, dtype)]   # read back from a file
    dataset_path(tensor, piece_offset) -> str            # where a piece lives
    dataset_len(piece_size, tensor_numel) -> int         # that dataset's length
    piece_digests(ds, piece_offset, piece_size, block, digests, where)
        -> (the piece's block digests, its first element in the dataset)
    separate_writer                     # optional, True: a rank's file needs no MPI, so
                                        # the asynchronous save's writer process may write it
    probe_first                         # optional, True: readers walk a file's metadata in a
                                        # child process before opening it (probe.py: a damaged
                                        # file may crash the HDF5 build that reads this layout)

Layouts: ``split`` (hpcdp/io/format/shardfile.py: one file per writing rank, one dataset
per piece) and ``shared`` (hpcdp/io/format/shared.py: one file written collectively with
h5py's mpio driver, one dataset per tensor).
"""

from __future__ import annotations

import importlib

# name -> "module:attribute" (imported when first asked for: shared needs parallel h5py)
LAYOUTS = {
    "split": "hpcdp.io.format.shardfile:SPLIT",
    "shared": "hpcdp.io.format.shared:SHARED",
}


def get_layout(name: str):
    """The layout object called ``name`` (a checkpoint's ``layout`` attribute, or
    ``checkpoint.layout``)."""
    spec = LAYOUTS.get(name)
    if spec is None:
        from ..errors import CheckpointError
        raise CheckpointError(f"checkpoint layout {name!r} is unknown; known: {', '.join(LAYOUTS)}")
    module, attr = spec.split(":")
    return getattr(importlib.import_module(module), attr)


__all__ = ["LAYOUTS", "get_layout"]
