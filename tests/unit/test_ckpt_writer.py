"""The writer's way to the disk (hpcdp/io/disk/direct.py, hostbuf.py, writerproc.py):
O_DIRECT of page-aligned HDF5 storage and its fallbacks, the same bytes whichever
way they go, and the asynchronous save's writer process (and its death)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from hpcdp.io.disk import direct
from hpcdp.io.errors import CheckpointError
from hpcdp.io.save.hostbuf import HostBuffers
from hpcdp.io.format.shardfile import write_rank_file
from hpcdp.io.save.snapshot import Snapshot, TensorPiece


def _snapshot() -> Snapshot:
    rng = np.random.default_rng(5)
    base = rng.standard_normal(3_000_000 + 7).astype(np.float32)
    # views at odd addresses (as a flat buffer's parameters are): the bounce path
    return Snapshot([TensorPiece("param/a", 0, base[1:1_000_001]),
                     TensorPiece("param/b", 0, base[1_000_001:1_000_100]),            # small: packed
                     TensorPiece("optim/m/a", 17, base[1_000_100:3_000_003])],       # > 1 chunk
                    {"optimizer_steps": 3})


def _write(path, snap=None):
    return write_rank_file(path, snap or _snapshot(), {"rank": 0, "world_size": 1, "step": 1}, step=1, rank=0,
                           threads=2)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _check_readable(path, snap) -> None:
    with h5py.File(path, "r") as f:
        for p in snap.pieces:
            ds = f[f"{p.tensor}/{p.offset}"]
            np.testing.assert_array_equal(ds[()], p.data)
            if p.data.nbytes >= direct.ALIGN_THRESHOLD:
                assert ds.id.get_offset() % direct.ALIGN == 0, p.tensor


def test_direct_writes_aligned_storage_and_the_same_bytes_as_buffered(tmp_path, monkeypatch):
    snap = _snapshot()
    fast = _write(tmp_path / "direct.h5", snap)
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    fd = direct.open_direct(probe)
    takes_direct = fd is not None
    if fd is not None:
        os.close(fd)
    assert fast["direct"] is takes_direct
    if takes_direct:  # all but the partial pages went past the page cache
        assert fast["direct_bytes"] > 0.99 * snap.nbytes
        assert fast["direct_bytes"] % direct.ALIGN == 0
    monkeypatch.setenv(direct.ENV, "0")
    slow = _write(tmp_path / "buffered.h5", snap)
    assert slow == {"direct": False, "direct_bytes": 0, "buffered_bytes": snap.nbytes}
    assert _sha(tmp_path / "direct.h5") == _sha(tmp_path / "buffered.h5")
    _check_readable(tmp_path / "direct.h5", snap)
    if shutil.which("h5dump"):
        out = subprocess.run(["h5dump", "-d", "/param/b/0", str(tmp_path / "direct.h5")], capture_output=True,
                             text=True, check=True).stdout
        assert 'DATASET "/param/b/0"' in out and "(0):" in out


def test_a_file_system_that_refuses_o_direct_at_open_gets_buffered_writes(tmp_path, monkeypatch):
    snap = _snapshot()
    _write(tmp_path / "ref.h5", snap)
    real_open = os.open

    def no_direct(path, flags, *a, **kw):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")  # what tmpfs (old kernels) and others say
        return real_open(path, flags, *a, **kw)
    monkeypatch.setattr(os, "open", no_direct)
    stats = _write(tmp_path / "fallback.h5", snap)
    assert stats["direct"] is False and stats["buffered_bytes"] == snap.nbytes
    assert _sha(tmp_path / "fallback.h5") == _sha(tmp_path / "ref.h5")


def test_a_transfer_refused_midway_goes_through_the_page_cache(tmp_path, monkeypatch):
    """O_DIRECT opened, but the file system wants more alignment (EINVAL on write)."""
    snap = _snapshot()
    _write(tmp_path / "ref.h5", snap)
    real_pwrite = os.pwrite
    refused = []

    def picky(fd, data, offset):
        if fcntl_flags(fd) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", picky)
    path = tmp_path / "picky.h5"
    stats = _write(path, snap)
    if direct.open_direct(tmp_path / "ref.h5") is None:
        assert not refused
    else:
        assert refused and stats["direct_bytes"] == 0 and stats["buffered_bytes"] == snap.nbytes
    assert _sha(path) == _sha(tmp_path / "ref.h5")


def fcntl_flags(fd: int) -> int:
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.mark.parametrize("offset", [0, 100, 4096 - 3, 3 * 4096, 12345])
@pytest.mark.parametrize("n", [1, 4095, 4096, 9000, (16 << 20) + 5000])
def test_piece_writer_writes_exactly_its_range(tmp_path, offset, n):
    path = tmp_path / "f"
    size = offset + n + 8192
    path.write_bytes(b"\xee" * size)
    data = np.random.default_rng(n).integers(0, 255, n + 1, dtype=np.uint8)[1:]  # odd address
    with direct.PieceWriter(path) as w:
        w.write(data, offset)
    raw = np.fromfile(path, dtype=np.uint8)
    assert raw.shape[0] == size
    assert np.array_equal(raw[offset:offset + n], data)
    assert (raw[:offset] == 0xEE).all() and (raw[offset + n:] == 0xEE).all()


def test_host_buffers_are_page_aligned_and_reused():
    buf = HostBuffers()
    try:
        snap = _snapshot()
        copy, offs = buf.copy(snap)
        first = buf.array.ctypes.data
        assert all(o % direct.ALIGN == 0 for o in offs)
        assert all(direct.is_aligned(p.data) for p in copy.pieces)
        for a, b in zip(copy.pieces, snap.pieces):
            np.testing.assert_array_equal(a.data, b.data)
        again, _ = buf.copy(snap)
        assert buf.array.ctypes.data == first  # the same mapping, no new allocation
    finally:
        buf.close()


def test_writer_process_writes_the_same_file_and_its_death_is_reported(tmp_path, monkeypatch):
    from hpcdp.io.failpoint import ENV
    from hpcdp.io.save.writerproc import WriterProcess

    snap = _snapshot()
    _write(tmp_path / "ref.h5", snap)
    buf = HostBuffers()
    w = WriterProcess(buf)
    try:
        shared, _ = buf.copy(snap)
        attrs = {"rank": 0, "world_size": 1, "step": 1}
        stats = w.write_rank_file(tmp_path / "proc.h5", shared, attrs, step=1, rank=0, threads=2)
        assert stats["direct_bytes"] + stats["buffered_bytes"] == snap.nbytes
        assert _sha(tmp_path / "proc.h5") == _sha(tmp_path / "ref.h5")
        first = w.proc.pid
        # the helper killed in the middle of the file (SIGKILL, as the OOM killer would)
        w.close()
        monkeypatch.setenv(ENV, "ckpt-mid-write@2:0")
        with pytest.raises(CheckpointError, match=r"save of step 2: the checkpoint writer process of rank 0 "
                                                  r"died \(killed by SIGKILL\) while writing dead.h5; this "
                                                  r"checkpoint is not committed, the previous one stays"):
            w.write_rank_file(tmp_path / "dead.h5", shared, attrs, step=2, rank=0, threads=2)
        monkeypatch.delenv(ENV)
        # the next save starts a new helper
        w.write_rank_file(tmp_path / "again.h5", shared, attrs, step=1, rank=0, threads=2)
        assert w.proc.pid != first
        assert _sha(tmp_path / "again.h5") == _sha(tmp_path / "ref.h5")
    finally:
        w.close()
        buf.close()


@pytest.mark.parametrize("offset,n", [(0, 4096), (100, 5000), (4096 * 3 - 1, 2), (70000, 4 << 20)])
def test_direct_reads_give_the_bytes_and_stop_at_the_end_of_the_file(tmp_path, offset, n):
    path = tmp_path / "f"
    data = np.random.default_rng(1).integers(0, 255, 80000 + (4 << 20), dtype=np.uint8)
    data.tofile(path)
    reads = direct.DirectReads(4 << 20)
    fd, dfd = os.open(path, os.O_RDONLY), direct.open_direct(path, os.O_RDONLY)
    try:
        out = np.zeros(n + 1, dtype=np.uint8)[1:]   # odd address
        assert reads.read_into(dfd, fd, out, offset) == n
        assert np.array_equal(out, data[offset:offset + n])
        tail = np.zeros(10, dtype=np.uint8)
        assert reads.read_into(dfd, fd, tail, data.shape[0] - 4) == 4  # the file ends: short
        assert np.array_equal(tail[:4], data[-4:])
    finally:
        os.close(fd)
        if dfd is not None:
            os.close(dfd)


@pytest.mark.parametrize("io", ["1", "0"])
def test_a_restore_reads_the_same_bits_with_or_without_o_direct(tmp_path, monkeypatch, io):
    from hpcdp.io.restore.load import load
    from hpcdp.io.protocol import Piece
    from hpcdp.io.format.runstate import expected_tensors
    from hpcdp.io.save.save import SaveJob, save
    from hpcdp.io.save.snapshot import take_snapshot
    from hpcdp.nn.params import ParamSpec

    monkeypatch.setenv(direct.ENV, io)
    layout = [ParamSpec("w0", 0, (1000, 1100), 1_100_000), ParamSpec("w1", 1_100_000, (3,), 3)]

    class _Flat:
        pass
    flat = _Flat()
    flat.layout, flat.dtype = layout, np.dtype("float32")

    class _Opt:
        names = ("m",)
    rng = np.random.default_rng(2)
    pieces = [Piece(b, 0, rng.standard_normal(1_100_003).astype(np.float32)) for b in ("param", "optim/m")]
    job = SaveJob(tmp_path, 1, take_snapshot(pieces, layout, copy=False), expected_tensors(flat, _Opt()),
                  {"strategy": "test", "world_size": 1}, {"step": 1, "optimizer_kind": "adamw"}, {})
    ckpt = save(job, None)
    targets = [Piece(p.buffer, p.offset + 5, np.full(p.size - 9, np.nan, np.float32)) for p in pieces]
    _, nbytes = load(ckpt, targets, layout, expected_tensors(flat, _Opt()), "adamw", None)
    for t, p in zip(targets, pieces):
        np.testing.assert_array_equal(t.array, p.array[5:-4])
    assert nbytes >= sum(t.array.nbytes for t in targets)
