"""Reusable host buffers for the asynchronous save's snapshot.

Every save of a run copies the same pieces, so the copy goes into one mapping made
at the first save and reused after (no allocation, no page faults of fresh memory
in the stall), each piece at a page-aligned offset so the writer sends it with
``O_DIRECT`` straight from there (direct.py, no bounce copy). The mapping is an
anonymous shared memory file (``memfd``): the writer process (writerproc.py) maps
the same pages, so nothing is copied between the processes either.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..disk.direct import ALIGN
from .snapshot import Snapshot, TensorPiece


def _aligned(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


class HostBuffers:
    def __init__(self):
        # a file without a name (gone with its last descriptor), so a helper can map it
        self.fd: int | None = os.memfd_create("hpcdp-ckpt-snapshot", 0) if hasattr(os, "memfd_create") else None
        self.size = 0
        self._map = None
        self.array: np.ndarray | None = None   # the whole mapping as uint8

    def _ensure(self, nbytes: int) -> None:
        if nbytes <= self.size:
            return
        # a smaller mapping of an earlier save goes when its last view does
        self.array = self._map = None
        self.size = max(ALIGN, _aligned(nbytes))
        if self.fd is not None:
            os.ftruncate(self.fd, self.size)
            self._map = mmap.mmap(self.fd, self.size)
        else:
            self._map = mmap.mmap(-1, self.size)
        self.array = np.frombuffer(self._map, dtype=np.uint8)

    def layout(self, snap: Snapshot) -> list[int]:
        """Byte offset of each piece of ``snap`` in the mapping (page aligned)."""
        offs, pos = [], 0
        for p in snap.pieces:
            offs.append(pos)
            pos += _aligned(p.data.nbytes)
        return offs

    def copy(self, snap: Snapshot) -> tuple[Snapshot, list[int]]:
        """``snap`` copied into the buffers (the stall of an asynchronous save);
        returns the copy (its pieces view the mapping) and their byte offsets."""
        offs = self.layout(snap)
        total = offs[-1] + _aligned(snap.pieces[-1].data.nbytes) if snap.pieces else 0
        self._ensure(max(total, 1))  # a rank with nothing to write still has a mapping (the writer's base)
        out = []
        for p, off in zip(snap.pieces, offs):
            view = self.array[off:off + p.data.nbytes].view(p.data.dtype)
            np.copyto(view, p.data)
            out.append(TensorPiece(p.tensor, p.offset, view))
        return Snapshot(out, dict(snap.scalars)), offs

    def close(self) -> None:
        self.array = self._map = None  # unmapped when the last snapshot view goes
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.size = 0


__all__ = ["HostBuffers"]
