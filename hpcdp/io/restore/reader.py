"""Read element ranges of logical tensors from a checkpoint, verifying as it goes.

A rank asks for ``[lo, lo + n)`` of one tensor; the reader intersects that with the
tensor's pieces (``index.pieces``), and for each overlap reads the checksum blocks
that cover it (never the whole piece), checks their digests (XXH3-128, or SHA-256 in
a format-1 checkpoint: checksum.py; in a thread, while the next block is read) and copies the wanted elements out. So a rank restoring 1/M of the state reads about 1/M of the bytes.

With :meth:`Reader.prepare` (the restores call it with everything they will read),
the blocks' byte ranges are merged by (file, offset) into large page-aligned reads
read ahead in the order they are wanted (coalesce.py), and each block is copied out
of its extent's buffer and verified as before.

Files are opened once (HDF5 metadata through h5py, bulk bytes with ``pread`` at the
dataset's offset: the pages around each block with O_DIRECT, direct.DirectReads,
where the file system takes it) and their size is compared with the index first: a
missing or truncated file is named before anything else is read.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from ..format.checksum import ALGORITHMS, TITLE, digest, stored_digests
from ..disk.coalesce import Extents, merge, wanted as coalesce_wanted
from ..disk.direct import DirectReads, open_direct
from ..errors import EARLIER, CheckpointError, damaged_file
from ..format.names import BLOCK_BYTES
from ..format.h5 import QuickDataset, pread_into
from ..format.layouts import get_layout
from ..format.ranges import Span, blocks_covering, intersect

READ_AHEAD = 4   # blocks in flight per reader (each a 4 MiB request)
QUEUED = 32      # blocks queued, read or not, before the oldest is waited for


class Reader:
    def __init__(self, ckpt_dir, index, threads: int = 1):
        self.dir, self.index = Path(ckpt_dir), index
        self.layout = get_layout(index.attrs.get("layout", "split"))
        self._open_files: dict = {}
        self._direct_fds: dict = {}   # O_DIRECT read descriptors (None: refused)
        self._direct = threading.local()   # one O_DIRECT bounce buffer per reading thread
        self.bytes_read = 0
        # Each block is read and checked by a task of its own, READ_AHEAD (or ``threads``)
        # at a time: preadv, xxhash and NumPy's copies release the GIL, so the disk sees
        # several requests at once (one O_DIRECT read at a time left it idle between them)
        # and a block is verified while the next ones are read.
        self._pool = ThreadPoolExecutor(max_workers=max(int(threads), READ_AHEAD))
        self._pending: list = []
        self._pieces: dict = {}   # (file, tensor, piece offset) -> what _read_piece needs
        self._queued = 0          # blocks queued so far
        self._extents = None      # coalesced reads (prepare), None: one read per block
        self._in_extent: dict = {}   # (file, byte offset, bytes) -> extent number

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
        from ..format.probe import check_in_child, crash_prone_build
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
        self._pool.shutdown(wait=True, cancel_futures=True)  # no read still running on a closed descriptor
        if self._extents is not None:   # after the blocks: a running block may wait for its extent
            self._extents.close()
            self._extents, self._in_extent = None, {}
        for h5, fd, _ in self._open_files.values():
            h5.close()
            os.close(fd)
        for dfd in self._direct_fds.values():
            if dfd is not None:
                os.close(dfd)
        self._open_files, self._direct_fds, self._pending, self._pieces = {}, {}, [], {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reading ---------------------------------------------------------------
    def read(self, tensor: int, lo: int, out: np.ndarray, wait: bool = True) -> None:
        """Fill host array ``out`` (1-D) with elements ``[lo, lo + len(out))`` of tensor
        number ``tensor`` (an index into ``index.tensors``). ``wait`` False: return
        once the reads are queued (the next pieces are read meanwhile); ``out`` is
        filled and verified when :meth:`wait` returns."""
        n = int(out.shape[0])
        got = 0
        for fi, off, size, span in self._overlaps(tensor, lo, n):
            self._read_piece(fi, tensor, off, size, span, out[off + span.offset - lo:off + span.end - lo])
            got += span.size
        if got != n:
            raise CheckpointError(f"checkpoint {self.dir}: tensor {self.index.tensors[tensor]}: elements "
                                  f"[{lo}, {lo + n}) are not all in the index's pieces")
        if wait:
            self.wait()

    def locate(self, tensor: int, lo: int, n: int) -> None:
        """Open the files and check the stored pieces that elements ``[lo, lo + n)`` of
        tensor number ``tensor`` come from, reading nothing else. Done for everything
        before the first block is queued, the pieces' HDF5 metadata (small reads spread
        over an evicted file) does not wait behind the bulk reads in the disk's queue
        (measured: ~3 ms per piece then, against ~0.3 ms with the disk idle)."""
        for t, fi, off, size in self.index.pieces_of(tensor):
            if intersect([(lo, n)], [(int(off), int(size))]):
                self._piece(int(fi), tensor, int(off), int(size))

    def prepare(self, reads) -> None:
        """Announce the reads to come, ``(tensor, lo, n)`` in the order :meth:`read`
        will be called: their pieces are located (as :meth:`locate`) and their blocks'
        byte ranges merged into large reads (coalesce.py) that the blocks are then
        copied out of. Reads not announced (or all, with ``HPCDP_CKPT_COALESCE=0``)
        are read block by block as before."""
        if not coalesce_wanted():
            for tensor, lo, n in reads:
                self.locate(tensor, lo, n)
            return
        ranges = []
        for tensor, lo, n in reads:
            for fi, piece_off, piece_size, span in self._overlaps(tensor, lo, n):
                info = self._piece(fi, tensor, piece_off, piece_size)
                if info[8] is None:   # not contiguous: read through HDF5
                    continue
                b0, b1 = blocks_covering(span, info[5])
                for b in range(b0, b1):
                    ranges.append(self._block_bytes(fi, info[8], info[7], info[9], b * info[5],
                                                    min((b + 1) * info[5], piece_size)))
        if self._extents is not None:
            self._extents.close()
        extents, where = merge(ranges)
        uses = [0] * len(extents)
        for e in where:
            uses[e] += 1
        self._in_extent = {r: e for r, e in zip(ranges, where)}
        self._extents = Extents(extents, uses, lambda fi: (self._direct_fds.get(fi), self._file(fi)[1]))

    @property
    def coalesced_requests(self) -> int:
        """Coalesced reads issued so far (0 without :meth:`prepare`)."""
        return self._extents.requests if self._extents is not None else 0

    def _overlaps(self, tensor, lo, n):
        """``(file, piece offset, piece size, span inside the piece)`` of each stored
        piece that elements ``[lo, lo + n)`` of ``tensor`` meet."""
        for t, fi, off, size in self.index.pieces_of(tensor):
            for span in intersect([(lo, n)], [(int(off), int(size))]):
                yield int(fi), int(off), int(size), Span(span.offset - int(off), span.size)

    @staticmethod
    def _block_bytes(fi, offset, ds_start, dtype, lo, hi) -> tuple[int, int, int]:
        """``(file, byte offset, byte end)`` of elements ``[lo, hi)`` of a contiguous
        piece stored from byte ``offset`` (its first element ``ds_start`` there)."""
        at = offset + (ds_start + lo) * dtype.itemsize
        return fi, at, at + (hi - lo) * dtype.itemsize

    def wait(self, keep: int = 0) -> None:
        """Wait for the queued block reads (all but the newest ``keep``), oldest first;
        the first failure or checksum mismatch raises."""
        while len(self._pending) > keep:
            self._check(self._pending.pop(0))

    def poll(self) -> None:
        """Check the oldest queued blocks whose reads have finished, in order, without
        waiting for any other (the first failure or mismatch raises)."""
        while self._pending and self._pending[0][-1].done():
            self._check(self._pending.pop(0))

    @property
    def queued(self) -> int:
        """Blocks queued so far (read or not)."""
        return self._queued

    @property
    def checked(self) -> int:
        """Blocks read and verified so far; blocks are checked in queue order, so the
        first ``checked`` queued blocks are all in their targets."""
        return self._queued - len(self._pending)

    def oldest(self):
        """The future of the oldest block not yet checked (None: none queued)."""
        return self._pending[0][-1] if self._pending else None

    def _check(self, entry) -> None:
        where, algo, piece_off, b, lo, hi, want, got = entry
        if got.result() != want:
            raise CheckpointError(f"{where}: {TITLE[algo]} checksum mismatch in block {b} (elements "
                                  f"[{piece_off + lo}, {piece_off + hi}) of the tensor): the file "
                                  "is corrupt; use an earlier checkpoint")

    def _dataset(self, h5, name: str, tensor: str, piece_off: int):
        path = self.layout.dataset_path(tensor, piece_off)
        with damaged_file(f"checkpoint {self.dir}: file {name}, dataset /{path} (tensor {tensor})"):
            try:
                return QuickDataset(h5, path)
            except KeyError:
                if path in h5:  # there, but not a dataset we can open: its metadata
                    raise
            raise CheckpointError(f"checkpoint {self.dir}: file {name} has no dataset /{path} "
                                  f"(tensor {tensor}) although the index says it holds it; {EARLIER}")

    def _piece(self, fi, tensor_id, piece_off, piece_size):
        """What reading stored piece ``(file fi, tensor, its first element)`` needs,
        checked once per piece and kept: a restore cuts a piece into many reads (one
        per checksum block and target range), and the HDF5 metadata behind it (the
        dataset's header and attributes) costs more than reading a block."""
        key = (fi, tensor_id, piece_off)
        info = self._pieces.get(key)
        if info is not None:
            return info
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
        info = self._pieces[key] = (fd, name, ds, where, algo, block, digests, ds_start, offset, dtype)
        return info

    def _read_piece(self, fi, tensor_id, piece_off, piece_size, span: Span, out) -> None:
        fd, name, ds, where, algo, block, digests, ds_start, offset, dtype = \
            self._piece(fi, tensor_id, piece_off, piece_size)
        b0, b1 = blocks_covering(span, block)
        for b in range(b0, b1):  # one checksum block per task, READ_AHEAD at once
            lo, hi = b * block, min((b + 1) * block, piece_size)
            self.bytes_read += (hi - lo) * dtype.itemsize
            e = None if offset is None or self._extents is None else \
                self._in_extent.get(self._block_bytes(fi, offset, ds_start, dtype, lo, hi))
            got = self._pool.submit(self._read_block, fi, fd, name, ds, where, algo, dtype, offset, ds_start,
                                    lo, hi, span, out, e)
            self._pending.append((where, algo, piece_off, b, lo, hi, digests[b].tobytes(), got))
            self._queued += 1
            self.wait(keep=QUEUED)  # bounded: a partial block's buffer lives until it is checked

    def _read_block(self, fi, fd, name, ds, where, algo, dtype, offset, ds_start, lo, hi, span, out,
                    extent=None) -> bytes:
        """Read elements ``[lo, hi)`` of a piece (one checksum block; from coalesced
        read ``extent`` where prepared), copy the part ``span`` wants into ``out`` and
        return the block's digest (in a pool thread)."""
        inside = lo >= span.offset and hi <= span.end
        # a block the span covers whole is read straight into `out` (no copy)
        buf = out[lo - span.offset:hi - span.offset] if inside else np.empty(hi - lo, dtype=dtype)
        if extent is not None:
            at = offset + (ds_start + lo) * dtype.itemsize
            try:
                got = self._extents.view(extent, at, at + buf.nbytes)
                if got.shape[0] == buf.nbytes:
                    buf.reshape(-1).view(np.uint8)[:] = got
            finally:
                self._extents.release(extent)
            if got.shape[0] < buf.nbytes:
                pread_into(fd, buf, at, self.dir / name)  # names where the file ends
        elif offset is not None:
            at = offset + (ds_start + lo) * dtype.itemsize
            direct = getattr(self._direct, "reads", None)
            if direct is None:
                direct = self._direct.reads = DirectReads(BLOCK_BYTES)
            if buf.nbytes > BLOCK_BYTES or direct.read_into(self._direct_fds.get(fi), fd, buf, at) < buf.nbytes:
                pread_into(fd, buf, at, self.dir / name)  # names where the file ends
        else:
            with damaged_file(where):
                buf[...] = ds[ds_start + lo:ds_start + hi]
        if not inside:
            c0, c1 = max(lo, span.offset), min(hi, span.end)
            out[c0 - span.offset:c1 - span.offset] = buf[c0 - lo:c1 - lo]
        return digest(buf, algo)

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
