"""Replicated restores read each byte once (hpcdp/io/restore/spread.py), on real ranks.

A checkpoint saved by N ranks (each its shard, split layout, as ZeRO would) is
restored by every rank of the job as a full replica (what none/DDP/PS workers
need): with the spread restore each rank reads 1/M and they share, without it each
reads everything. Both give the same bits; the readers' byte counters summed over
the ranks equal the checkpoint's data once (plus nothing: shares are cut at the
checksum blocks), against M times without.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from ckpt_util import remove, shared_dir

ROWS, COLS = 300, 1024   # per matrix: 1.2 MiB of float32, so the 4 MiB blocks matter


def _state(comm):
    from hpcdp.io.protocol import Piece
    from hpcdp.io.format.runstate import expected_tensors
    from hpcdp.nn.params import ParamSpec
    from hpcdp.shard import shard_range

    layout, off = [], 0
    for i, rows in enumerate((ROWS, 7, ROWS * 3, 1, ROWS * 2)):   # odd sizes: cuts inside blocks
        layout.append(ParamSpec(f"w{i}", off, (rows, COLS), rows * COLS))
        off += rows * COLS
    numel = off

    class _Flat:
        pass
    flat = _Flat()
    flat.layout, flat.dtype = layout, np.dtype("float32")

    class _Opt:
        names = ("m", "v")
    full = {b: np.random.default_rng([i, 3]).standard_normal(numel, dtype=np.float32)
            for i, b in enumerate(("param", "optim/m", "optim/v"))}
    lo, n = shard_range(numel, comm.Get_size(), comm.Get_rank())
    mine = [Piece(b, lo, full[b][lo:lo + n]) for b in full]
    return layout, expected_tensors(flat, _Opt()), full, mine


def _saved(comm, tmp):
    """:func:`_state` saved as checkpoint 1 in ``tmp``: (checkpoint, layout, expected
    tensors, full buffers, this rank's pieces)."""
    from hpcdp.io.save.save import SaveJob, save
    from hpcdp.io.save.snapshot import take_snapshot

    layout, expected, full, mine = _state(comm)
    job = SaveJob(tmp, 1, take_snapshot(mine, layout, copy=False), expected,
                  {"strategy": "test", "world_size": comm.Get_size()},
                  {"step": 1, "optimizer_kind": "adamw", "optimizer_steps": 1}, {})
    return save(job, comm), layout, expected, full, mine


@pytest.mark.mpi
def test_replicated_restore_reads_each_byte_once():
    from hpcdp.io.restore.load import load
    from hpcdp.io.protocol import Piece

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    tmp = shared_dir()
    try:
        ckpt, layout, expected, full, mine = _saved(comm, tmp)
        data_bytes = sum(a.nbytes for a in full.values())
        got = {}
        for spread in (True, False):
            targets = [Piece(b, 0, np.full_like(a, np.nan)) for b, a in full.items()]
            _, nbytes = load(ckpt, targets, layout, expected, "adamw", comm, spread=spread)
            got[spread] = (targets, comm.allreduce(nbytes))
        for spread, (targets, total) in got.items():
            for t in targets:
                np.testing.assert_array_equal(t.array, full[t.buffer], err_msg=f"{t.buffer} spread={spread}")
        # the 1/M restore equals the full one bit for bit (NaN-free: compare bytes)
        for a, b in zip(got[True][0], got[False][0]):
            assert a.array.tobytes() == b.array.tobytes()
        assert got[True][1] == data_bytes, (got[True][1], data_bytes)
        assert got[False][1] == size * data_bytes
    finally:
        remove(tmp)


@pytest.mark.mpi
def test_sharded_targets_are_not_spread():
    """Targets that differ by rank (a ZeRO shard) are each read by their rank only."""
    from hpcdp.io.restore.load import load
    from hpcdp.io.protocol import Piece
    from hpcdp.io.restore.spread import same_everywhere

    comm = MPI.COMM_WORLD
    tmp = shared_dir()
    try:
        ckpt, layout, expected, full, mine = _saved(comm, tmp)
        targets = [Piece(p.buffer, p.offset, np.zeros_like(p.array)) for p in mine]
        assert same_everywhere(comm, targets, 60.0) is False
        _, nbytes = load(ckpt, targets, layout, expected, "adamw", comm)
        for t, p in zip(targets, mine):
            np.testing.assert_array_equal(t.array, p.array)
        assert comm.allreduce(nbytes) == sum(a.nbytes for a in full.values())
    finally:
        remove(tmp)


@pytest.mark.mpi
def test_targets_every_rank_has_are_spread_and_the_rest_read_alone():
    """A colocated parameter server's restore: every rank the whole weights, each
    its own shard of the optimizer state."""
    from hpcdp.io.restore.load import load
    from hpcdp.io.protocol import Piece

    comm = MPI.COMM_WORLD
    tmp = shared_dir()
    try:
        ckpt, layout, expected, full, mine = _saved(comm, tmp)
        targets = [Piece(p.buffer, p.offset, np.zeros_like(p.array)) for p in mine if p.buffer != "param"]
        targets.insert(comm.Get_rank() % 2, Piece("param", 0, np.zeros_like(full["param"])))  # order differs
        _, nbytes = load(ckpt, targets, layout, expected, "adamw", comm)
        for t in targets:
            np.testing.assert_array_equal(t.array, full[t.buffer][t.offset:t.offset + t.size])
        assert comm.allreduce(nbytes) == sum(a.nbytes for a in full.values())
    finally:
        remove(tmp)


@pytest.mark.mpi
def test_a_damaged_block_in_one_ranks_share_fails_every_rank_alike():
    """The share is sent while it is read (spread.exchange): a rank whose block fails
    its checksum still sends what it owes, so nobody hangs, and every rank raises
    that rank's one line."""
    import h5py

    from hpcdp.io.errors import CheckpointError
    from hpcdp.io.format.index import read_index
    from hpcdp.io.restore.load import load
    from hpcdp.io.protocol import Piece
    from hpcdp.io.restore.spread import common_targets, plan, shares

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    tmp = shared_dir()
    try:
        ckpt, layout, expected, full, mine = _saved(comm, tmp)
        targets = [Piece(b, 0, np.full_like(a, np.nan)) for b, a in full.items()]
        order = common_targets(comm, targets, 60.0) if size > 1 else list(range(len(targets)))
        index = read_index(ckpt)
        segs = plan(index, [targets[i] for i in order], layout, ckpt)
        last = shares(segs, [targets[i] for i in order], size)[size - 1][-1]   # read by the last rank
        _, _, _, tid, lo = segs[last]
        if rank == 0:
            t, fi, off, _ = next(r for r in index.pieces_of(tid) if r[2] <= lo < r[2] + r[3])
            path = ckpt / index.files[int(fi)]
            with h5py.File(path, "r") as f:
                at = f[f"{index.tensors[tid]}/{int(off)}"].id.get_offset() + (lo - int(off)) * 4
            with open(path, "r+b") as fh:
                fh.seek(at)
                byte = fh.read(1)
                fh.seek(at)
                fh.write(bytes([byte[0] ^ 0x10]))
        comm.Barrier()
        with pytest.raises(CheckpointError) as e:
            load(ckpt, targets, layout, expected, "adamw", comm, timeout=60.0)
        line = str(e.value)
        assert "checksum mismatch" in line and index.tensors[tid] in line and "\n" not in line, line
        if size > 1:
            assert line.endswith(f"(reported by rank {size - 1})"), line
        assert len(set(comm.allgather(line))) == 1
    finally:
        remove(tmp)
