"""Read element ranges of logical tensors from a checkpoint, verifying as it goes.

A rank asks for ``[lo, lo + n)`` of one tensor; the reader intersects that with the
tensor's pieces (``index.pieces``), and for each overlap reads the checksum blocks
that cover it (never the whole piece), checks their digests (XXH3-128, or SHA-256 in
a format-1 checkpoint: checksum.py; in a thread, while the next block is read) and copies the wanted elements out. So a rank restoring 1/M of the state reads about 1/M of the bytes.

Files are opened once (HDF5 metadata through h5py, bulk bytes with ``pread`` at the
dataset's offset: the pages around each block with O_DIRECT, direct.DirectReads,
where the file system takes it) and their size is compared with the index first: a
missing or truncated file is named before anything else is read.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from .checksum import ALGORITHMS, TITLE, digest, stored_digests
from .direct import DirectReads, open_direct
from .errors import EARLIER, CheckpointError, damaged_file
from .format import BLOCK_BYTES
from .h5 import pread_into
from .layouts import get_layout
from .ranges import Span, blocks_covering, intersect


class Reader:
    def __init__(self, ckpt_dir, index, threads: int = 1):
        self.dir, self.index = Path(ckpt_dir), index
        self.layout = get_layout(index.attrs.get("layout", "split"))
        self._open_files: dict = {}
        self._direct_fds: dict = {}   # O_DIRECT read descriptors (None: refused)
        self._direct = DirectReads(BLOCK_BYTES)
        self.bytes_read = 0
        # xxhash and hashlib release the GIL: threads check block k while block k + 1 is read
        self._hasher = ThreadPoolExecutor(max_workers=threads)

    # -- files -----------------------------------------------------------------
    def _file(self, fi: int):
        if fi in self._open_files:
            return self._open_files[fi]
        name = self.index.files[fi]
        path = self.dir / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {self.dir}: data file {name} is missing (the index "
                                  "lists it); the checkpoint is incomplete: use another one "
                                  f"(hpcdp ckpt ls {self.dir.parent})")
        size, want = path.stat().st_size, self.index.file_bytes[fi]
        if size != want:
            how = "truncated" if size < want else "longer than written"
            raise CheckpointError(f"checkpoint {self.dir}: data file {name} has {size} bytes, the index "
                                  f"says {want}: the file is {how}; {EARLIER}")
        from .probe import check_in_child, crash_prone_build
        if getattr(self.layout, "probe_first", False) or crash_prone_build():  # a crash there becomes the line
            check_in_child(path, f"checkpoint {self.dir}: file {name}")
        with damaged_file(f"checkpoint {self.dir}: file {name}"):
            h5 = h5py.File(path, "r")
        fd = os.open(path, os.O_RDONLY)
        self._open_files[fi] = (h5, fd, name)
        self._direct_fds[fi] = open_direct(path, os.O_RDONLY)
        return self._open_files[fi]

    def open_file(self, fi: int) -> str | None:
        """Open data file number ``fi`` (an index into ``index.files``) and check its
        size: None if it can be read, else the one line that says why not."""
        try:
            self._file(fi)
        except CheckpointError as e:
            return str(e)
        return None

    def h5_file(self, fi: int):
        """The open h5py file of data file ``fi`` (opened by :meth:`open_file`)."""
        return self._file(fi)[0]

    def close(self) -> None:
        for h5, fd, _ in self._open_files.values():
            h5.close()
            os.close(fd)
        for dfd in self._direct_fds.values():
            if dfd is not None:
                os.close(dfd)
        self._open_files, self._direct_fds = {}, {}
        self._hasher.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reading ---------------------------------------------------------------
    def read(self, tensor: int, lo: int, out: np.ndarray) -> None:
        """Fill host array ``out`` (1-D) with elements ``[lo, lo + len(out))`` of tensor
        number ``tensor`` (an index into ``index.tensors``)."""
        n = int(out.shape[0])
        rows = self.index.pieces_of(tensor)
        got = 0
        for t, fi, off, size in rows:
            for span in intersect([(lo, n)], [(int(off), int(size))]):
                self._read_piece(int(fi), tensor, int(off), int(size), Span(span.offset - int(off), span.size),
                                 out[span.offset - lo:span.end - lo])
                got += span.size
        if got != n:
            raise CheckpointError(f"checkpoint {self.dir}: tensor {self.index.tensors[tensor]}: elements "
                                  f"[{lo}, {lo + n}) are not all in the index's pieces")

    def _dataset(self, h5, name: str, tensor: str, piece_off: int):
        path = self.layout.dataset_path(tensor, piece_off)
        with damaged_file(f"checkpoint {self.dir}: file {name}, dataset /{path} (tensor {tensor})"):
            if path not in h5:
                raise CheckpointError(f"checkpoint {self.dir}: file {name} has no dataset /{path} "
                                      f"(tensor {tensor}) although the index says it holds it; {EARLIER}")
            return h5[path]

    def _read_piece(self, fi, tensor_id, piece_off, piece_size, span: Span, out) -> None:
        h5, fd, name = self._file(fi)
        tensor = self.index.tensors[tensor_id]
        dtype = np.dtype(self.index.dtypes[tensor_id])
        ds = self._dataset(h5, name, tensor, piece_off)
        where = f"checkpoint {self.dir}: file {name}, tensor {tensor} (piece at element {piece_off})"
        want_len = self.layout.dataset_len(piece_size, self.index.numel(tensor_id))
        with damaged_file(where):  # the dataset's header, attributes and layout
            if ds.dtype != dtype or ds.shape != (want_len,):
                raise CheckpointError(f"{where}: dataset is {ds.dtype} {ds.shape}, the index says "
                                      f"{dtype} ({want_len},): wrong dtype or shape; {EARLIER}")
            algo, block, digests, ds_start = self._digests(ds, piece_off, piece_size, where)
            offset = ds.id.get_offset()  # None: not contiguous (repacked), read through HDF5
        b0, b1 = blocks_covering(span, block)
        checks = []  # (block, lo, hi, future digest): hashing runs while the next block is read
        for b in range(b0, b1):  # one checksum block at a time
            lo, hi = b * block, min((b + 1) * block, piece_size)
            inside = lo >= span.offset and hi <= span.end
            # a block the span covers whole is read straight into `out` (no copy)
            buf = out[lo - span.offset:hi - span.offset] if inside else np.empty(hi - lo, dtype=dtype)
            if offset is not None:
                at = offset + (ds_start + lo) * dtype.itemsize
                if buf.nbytes <= BLOCK_BYTES:
                    if self._direct.read_into(self._direct_fds.get(fi), fd, buf, at) < buf.nbytes:
                        pread_into(fd, buf, at, self.dir / name)  # names where the file ends
                else:
                    pread_into(fd, buf, at, self.dir / name)
            else:
                with damaged_file(where):
                    buf[...] = ds[ds_start + lo:ds_start + hi]
            self.bytes_read += buf.nbytes
            checks.append((b, lo, hi, self._hasher.submit(digest, buf, algo)))
            if not inside:
                c0, c1 = max(lo, span.offset), min(hi, span.end)
                out[c0 - span.offset:c1 - span.offset] = buf[c0 - lo:c1 - lo]
        for b, lo, hi, got in checks:
            if got.result() != digests[b].tobytes():
                raise CheckpointError(f"{where}: {TITLE[algo]} checksum mismatch in block {b} (elements "
                                      f"[{piece_off + lo}, {piece_off + hi}) of the tensor): the file "
                                      "is corrupt; use an earlier checkpoint")

    def _digests(self, ds, piece_off, piece_size, where):
        """(checksum algorithm, block elements, this piece's digests, the piece's first
        element in ``ds``)."""
        try:
            block = int(ds.attrs["block"])
            algo, digests = stored_digests(ds.attrs)
        except KeyError as e:
            raise CheckpointError(f"{where}: attribute {e} is missing; {EARLIER}") from None
        try:
            digests, start = self.layout.piece_digests(ds, piece_off, piece_size, block, digests, where)
        except KeyError as e:
            raise CheckpointError(f"{where}: attribute {e} is missing; {EARLIER}") from None
        if digests.shape != ((piece_size + block - 1) // block, ALGORITHMS[algo][0]):
            raise CheckpointError(f"{where}: {digests.shape[0]} block digests for {piece_size} elements "
                                  f"in blocks of {block}: the checksum attribute is damaged; {EARLIER}")
        return algo, block, digests, start


__all__ = ["Reader"]
