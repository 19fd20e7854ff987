"""Coalesced restore reads (hpcdp/io/disk/coalesce.py): the merge of byte ranges, and
restores through merged reads equal to the block-by-block restore bit for bit, across
extent boundaries, gaps and the file's end, with damage still refused by piece."""

from __future__ import annotations

import os
import shutil
import sys

import h5py
import numpy as np
import pytest

from hpcdp.io.disk import coalesce
from hpcdp.io.disk.direct import ALIGN
from hpcdp.io.errors import CheckpointError
from hpcdp.io.format.names import tensor_name
from hpcdp.io.format.index import read_index
from hpcdp.io.restore.load import fill_targets
from hpcdp.io.protocol import Piece
from hpcdp.io.format.ranges import split_by_layout
from hpcdp.io.restore.reader import Reader
from hpcdp.shard import shard_range

sys.path.insert(0, os.path.dirname(__file__))
from test_ckpt_format import FORMAT1, _save_as, _state  # noqa: E402


# -- the merge --------------------------------------------------------------------

def test_merge_joins_neighbours_within_the_gap_and_the_size_cap():
    P = ALIGN
    ranges = [(0, 10 * P, 11 * P), (1, 0, 100), (0, 0, P), (0, P + 8, 2 * P), (0, 3 * P, 4 * P), (0, 9 * P, 10 * P)]
    ext, where = coalesce.merge(ranges, extent_bytes=64 * P, gap=P)
    # file 0: [0, 4P) (gaps of 0 and 1 page), then [9P, 11P) (a gap of 5 pages); file 1: one page
    assert sorted(ext) == [(0, 0, 4 * P), (0, 9 * P, 11 * P), (1, 0, P)]
    assert ext[0] == (0, 9 * P, 11 * P)   # ordered by the first range wanted
    assert [ext[e] for e in where] == [(0, 9 * P, 11 * P), (1, 0, P), (0, 0, 4 * P), (0, 0, 4 * P), (0, 0, 4 * P),
                                       (0, 9 * P, 11 * P)]
    for (fi, a, b), e in zip(ranges, where):   # every range inside its extent, pages aligned
        f, x, y = ext[e]
        assert f == fi and x <= a and b <= y and x % ALIGN == 0 and y % ALIGN == 0
    ext, _ = coalesce.merge(ranges, extent_bytes=2 * P, gap=P)   # the cap splits the first run
    assert sorted(ext) == [(0, 0, 2 * P), (0, 3 * P, 4 * P), (0, 9 * P, 11 * P), (1, 0, P)]
    ext, _ = coalesce.merge(ranges, extent_bytes=64 * P, gap=0)   # no gap allowed: 3P..4P apart from 0..2P
    assert sorted(ext) == [(0, 0, 2 * P), (0, 3 * P, 4 * P), (0, 9 * P, 11 * P), (1, 0, P)]
    assert coalesce.merge([]) == ([], [])


# -- restores through merged reads ------------------------------------------------

SHAPES = ((5, 7), (1 << 20, 3), (300,), (7, 3), (1000, 11))   # 12 MiB: a tensor of 3 checksum blocks


def _targets(flat, opt, m, r):
    off, size = shard_range(flat.numel, m, r)
    names = ["param"] + [f"optim/{k}" for k in opt.names]
    return [Piece(n, off, np.full(size, np.nan, flat.dtype)) for n in names]


def _restore(ckpt, flat, opt, m, r):
    targets = _targets(flat, opt, m, r)
    fill_targets(ckpt, read_index(ckpt), targets, flat.layout)
    return [t.array for t in targets]


def _block_by_block(monkeypatch):
    """The reads without the merge (HPCDP_CKPT_COALESCE=0): one per block."""
    monkeypatch.setenv(coalesce.ENV, "0")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    flat, opt = _state(shapes=SHAPES, seed=5)
    return _save_as(tmp_path_factory.mktemp("co") / "ck", 2, flat, opt, 2), flat, opt


@pytest.mark.parametrize("extent_bytes,gap", [(64 << 10, 0), (1 << 20, 4096), (32 << 20, 256 << 10)])
def test_merged_reads_restore_bit_for_bit_as_block_by_block(saved, monkeypatch, extent_bytes, gap):
    ckpt, flat, opt = saved
    want = {(m, r): None for m in (1, 2, 3) for r in range(m)}
    with monkeypatch.context() as mp:
        _block_by_block(mp)
        for m, r in want:
            want[m, r] = _restore(ckpt, flat, opt, m, r)
    monkeypatch.setattr(coalesce, "EXTENT_BYTES", extent_bytes)
    monkeypatch.setattr(coalesce, "GAP", gap)
    for (m, r), arrays in want.items():
        got = _restore(ckpt, flat, opt, m, r)
        for a, b in zip(got, arrays):
            assert a.tobytes() == b.tobytes()   # bit for bit, NaN-free
        off, size = shard_range(flat.numel, m, r)
        assert np.array_equal(got[0], flat.data[off:off + size])


def test_fewer_requests_than_blocks_and_the_gaps_read_through(saved, monkeypatch):
    ckpt, flat, opt = saved
    monkeypatch.setattr(coalesce, "EXTENT_BYTES", 32 << 20)
    index = read_index(ckpt)
    targets = _targets(flat, opt, 1, 0)
    with Reader(ckpt, index) as reader:
        reads = []
        for t in targets:
            for param, span, pos in split_by_layout(flat.layout, t.offset, t.size):
                reads.append((index.tensor_id(tensor_name(t.buffer, param)), span.offset, t.array[pos:pos + span.size]))
        reader.prepare([(tid, lo, out.shape[0]) for tid, lo, out in reads])
        for tid, lo, out in reads:
            reader.read(tid, lo, out, wait=False)
        reader.wait()
        blocks = reader.queued
        requests = reader.coalesced_requests
    with monkeypatch.context() as mp:
        _block_by_block(mp)
        with Reader(ckpt, index) as reader:
            reader.prepare([(tid, lo, out.shape[0]) for tid, lo, out in reads])
            assert reader.coalesced_requests == 0 and not reader._in_extent
    assert np.array_equal(targets[0].array, flat.data)
    # 3 buffers x 2 files: 4 one-block pieces and the 3-block tensor's half (2 blocks) each;
    # the 12 MiB of one file fit one extent: one read per file
    assert blocks == 24 and requests == 2, (blocks, requests)


def test_the_last_piece_of_a_file_ends_inside_the_last_page(saved):
    """The last extent of a file is rounded up past the file's end; the short O_DIRECT
    read there still delivers every wanted byte."""
    ckpt, flat, opt = saved
    index = read_index(ckpt)
    with Reader(ckpt, index) as reader:
        ranges = []
        for tid in range(len(index.tensors)):
            n = index.numel(tid)
            reader.prepare([(tid, 0, n)])
            ranges += [r for r in reader._in_extent]
    ends = {}
    for fi, a, b in ranges:
        ends[fi] = max(ends.get(fi, 0), b)
    sizes = {fi: (ckpt / index.files[fi]).stat().st_size for fi in ends}
    # HDF5 writes its metadata first: the data of the last piece runs to the file's end
    assert any(ends[fi] == sizes[fi] and sizes[fi] % ALIGN for fi in ends), (ends, sizes)
    for m in (1, 2):
        for r in range(m):
            got = _restore(ckpt, flat, opt, m, r)
            off, size = shard_range(flat.numel, m, r)
            assert np.array_equal(got[2], opt.state["v"][off:off + size])


def test_a_damaged_piece_inside_a_merged_read_is_refused_by_name(saved, tmp_path):
    src, flat, opt = saved
    ckpt = tmp_path / src.name
    shutil.copytree(src, ckpt)
    path = ckpt / "rank-00001.h5"
    with h5py.File(path, "r") as f:   # a small piece between others: read inside one extent
        piece = sorted(f["optim/m/p2"])[0]
        where = f[f"optim/m/p2/{piece}"].id.get_offset() + 4
    raw = bytearray(path.read_bytes())
    raw[where] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"rank-00001.h5, tensor optim/m/p2 .*XXH3-128 checksum mismatch"):
        _restore(ckpt, flat, opt, 1, 0)

def test_without_o_direct_the_merged_reads_go_through_the_page_cache(saved, monkeypatch):
    ckpt, flat, opt = saved
    monkeypatch.setenv("HPCDP_CKPT_DIRECT", "0")
    got = _restore(ckpt, flat, opt, 1, 0)
    assert np.array_equal(got[0], flat.data) and np.array_equal(got[1], opt.state["m"])


def test_a_format_1_checkpoint_restores_through_merged_reads(tmp_path):
    flat, opt = _state(seed=3)
    ckpt = tmp_path / "step-00000004"
    shutil.copytree(FORMAT1, ckpt)
    for m in (1, 2):
        for r in range(m):
            got = _restore(ckpt, flat, opt, m, r)
            off, size = shard_range(flat.numel, m, r)
            assert np.array_equal(got[0], flat.data[off:off + size])
            assert np.array_equal(got[2], opt.state["v"][off:off + size])
