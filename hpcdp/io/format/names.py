"""The checkpoint format's names and constants (docs/checkpoints.md describes it).

A checkpoint is a directory ``<dir>/step-<NNNNNNNN>/``::

    index.h5          rank 0: run state, config, and where every logical tensor lives
    rank-00000.h5 ... layout "split": what each rank owns, one file per writing rank
    shared.h5         layout "shared": one file, every rank wrote its hyperslabs (mpio)
    COMMITTED         written last; a directory without it is never loaded

Logical tensors are named ``<buffer>/<parameter>``: ``param/h.0.attn.c_attn.weight``,
``optim/m/h.0.attn.c_attn.weight``, ``optim/v/...`` (AdamW), ``optim/momentum_buf/...``
(SGD). Each is stored as 1-D pieces of its flattened elements (C order); the index
records the tensor's shape and dtype and, per piece, the file, element offset and
size. The pieces depend on how many ranks wrote and under which strategy; the
logical content does not.

Checksums: a digest of every ``BLOCK_BYTES`` block of every stored dataset, XXH3-128
since format 2, SHA-256 in format 1 (which one: the attribute's name; checksum.py says
why, and why not an HDF5 filter). Format 1 checkpoints are read as before.
"""

from __future__ import annotations

import re

FORMAT_NAME = "hpcdp-checkpoint"
FORMAT_VERSION = 2   # 2: data blocks carry XXH3-128 (attribute xxh3_128), 1: SHA-256

INDEX_FILE = "index.h5"
MARKER_FILE = "COMMITTED"
SHARED_FILE = "shared.h5"
STEP_DIR_RE = re.compile(r"step-(\d{8,})")

# Checksum block: a reader verifies only the blocks its range touches, so reading
# 1/M of a checkpoint reads about 1/M of it (plus at most one block per piece end).
BLOCK_BYTES = 4 << 20

# HDF5 library-version bounds of every file: "v108" is the lowest that stores
# attributes larger than 64 KiB (the digests of a big piece); "v110" the highest so
# that Debian's HDF5 1.10 (parallel h5py builds) reads what PyPI's HDF5 2.x wrote.
# Fixed bounds are also one half of byte-identical saves (the other: no timestamps).
LIBVER = ("v108", "v110")

PARAM = "param"
OPTIM = "optim"


def step_dir_name(step: int) -> str:
    return f"step-{int(step):08d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{int(rank):05d}.h5"


def tensor_name(buffer: str, param: str) -> str:
    """``("param", "wte.weight") -> "param/wte.weight"``; ``("optim/m", ...)``."""
    return f"{buffer}/{param}"


def optim_buffer(state_name: str) -> str:
    """The buffer name of an optimizer state array (``"m" -> "optim/m"``)."""
    return f"{OPTIM}/{state_name}"


def split_tensor_name(name: str) -> tuple[str, str]:
    """``"optim/m/wte.weight" -> ("optim/m", "wte.weight")`` (parameter names hold no '/')."""
    buffer, _, param = name.rpartition("/")
    return buffer, param


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "INDEX_FILE", "MARKER_FILE", "SHARED_FILE", "STEP_DIR_RE",
           "BLOCK_BYTES", "LIBVER", "PARAM", "OPTIM", "step_dir_name", "rank_file_name", "tensor_name",
           "optim_buffer", "split_tensor_name"]
