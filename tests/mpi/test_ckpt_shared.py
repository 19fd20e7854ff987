"""Layout "shared" (one HDF5 file, parallel HDF5 through h5py's mpio driver) on real
ranks: it holds the same tensors as layout "split", loads in either layout at any
rank count, gives identical bytes when saved twice, and a damaged piece is refused
on every rank.

Needs h5py built with MPI: ``bash .ci/parallel-hdf5.sh --test`` builds that
environment (Debian's Open MPI, its own venv) and runs this file on 2, 3 and 4
ranks. With PyPI's serial h5py (the main venv) the module is skipped; the clear
error for that case is tested in tests/unit/test_ckpt_config.py.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from ckpt_util import build_parts, config, flat_of, full_tensors, group, remove, shared_dir, train

pytestmark = pytest.mark.skipif(not h5py.get_config().mpi,
                                reason="needs h5py with MPI (bash .ci/parallel-hdf5.sh --test runs this file)")

K, HALF = 6, 3


def _index_contents(path, drop=("job_id", "lineage")) -> dict:
    """Every attribute and dataset of an index file, less the attributes in ``drop``."""
    def plain(v):
        return np.asarray(v).tobytes() if isinstance(v, np.ndarray) else v

    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            out[name] = {k: plain(v) for k, v in sorted(obj.attrs.items()) if k not in drop}
            if isinstance(obj, h5py.Dataset):
                out[name + "[()]"] = plain(obj[()])
        visit("/", f)
        f.visititems(visit)
    return out


def _step(root, s):
    return root / f"step-{s:08d}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["ddp", "ps", "zero3"])
def test_shared_equals_split_and_loads_in_either_layout_at_any_rank_count(strategy):
    from hpcdp.io.checkpointer import Checkpointer
    from hpcdp.io.interop.inspect import weights_sha256

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    tmp = shared_dir()
    try:
        w = group(n)
        kw = dict(steps=K, every=HALF)
        train(config(strategy, tmp / "s", ckpt_dir=tmp / "shared", checkpoint__layout="shared", **kw), w)
        train(config(strategy, tmp / "p", ckpt_dir=tmp / "split", **kw), w)
        comm.Barrier()
        assert (_step(tmp / "shared", K) / "shared.h5").is_file()
        one, two = full_tensors(_step(tmp / "shared", K)), full_tensors(_step(tmp / "split", K))
        assert one.keys() == two.keys()
        for name in one:
            assert one[name].tobytes() == two[name].tobytes(), name

        # the shared checkpoint restored exactly on every rank count 1..n (split-layout runs)
        saved = full_tensors(_step(tmp / "shared", HALF))
        for m in range(1, n + 1):
            g = group(m)
            if g is None:
                continue
            cfg = config("ddp", tmp / f"exact{m}", steps=K)
            model, opt, strategy_b, sampler = build_parts(cfg, g)
            ck = Checkpointer(cfg, world=g, strategy=strategy_b, model=model, optimizer=opt, sampler=sampler,
                              total=K, run_dir=tmp / f"exact{m}", resume=str(_step(tmp / "shared", HALF)))
            try:
                assert ck.restore() == HALF
                np.testing.assert_array_equal(model.flat.data, flat_of(saved, "param", model.flat.layout))
                for piece in strategy_b.checkpoint_targets():
                    want = flat_of(saved, piece.buffer, model.flat.layout)[piece.offset:piece.offset + piece.size]
                    np.testing.assert_array_equal(piece.array, want)
            finally:
                ck.close()
                strategy_b.close()

        # split -> shared resume at the same N continues bit for bit
        train(config(strategy, tmp / "r", ckpt_dir=tmp / "resumed", checkpoint__layout="shared", **kw), w,
              resume=str(_step(tmp / "split", HALF)))
        comm.Barrier()
        assert weights_sha256(_step(tmp / "resumed", K)) == weights_sha256(_step(tmp / "split", K))
    finally:
        remove(tmp)


@pytest.mark.mpi(min_size=2)
def test_shared_file_bytes_are_the_same_when_saved_twice():
    import time

    comm = MPI.COMM_WORLD
    tmp = shared_dir()
    try:
        w = group(comm.Get_size())
        for name in ("a", "b"):  # the same run twice (same config), one second apart
            train(config("ddp", tmp / "run", steps=2, ckpt_dir=tmp / "ck", checkpoint__layout="shared"), w)
            comm.Barrier()
            if comm.Get_rank() == 0:
                (tmp / "ck").rename(tmp / name)
            remove(tmp / "run")
            time.sleep(1.1)  # a timestamp would differ now
        comm.Barrier()
        a, b = _step(tmp / "a", 2), _step(tmp / "b", 2)
        assert (a / "shared.h5").read_bytes() == (b / "shared.h5").read_bytes()
        # index.h5 records who wrote the checkpoint (job_id, lineage: two jobs are two
        # training runs, docs/checkpoints.md), so it and the COMMITTED marker's digest of
        # it differ by those two attributes, and by nothing else
        assert _index_contents(a / "index.h5", drop=()) != _index_contents(b / "index.h5", drop=())
        assert _index_contents(a / "index.h5") == _index_contents(b / "index.h5")
    finally:
        remove(tmp)


@pytest.mark.mpi(min_size=2)
def test_a_damaged_shared_file_is_refused_on_every_rank():
    from hpcdp.io.errors import CheckpointError

    comm = MPI.COMM_WORLD
    tmp = shared_dir()
    try:
        w = group(comm.Get_size())
        train(config("ddp", tmp / "run", steps=2, ckpt_dir=tmp / "ck", checkpoint__layout="shared"), w)
        ckpt = _step(tmp / "ck", 2)
        if comm.Get_rank() == 0:  # one byte of the last piece of one optimizer tensor
            path = ckpt / "shared.h5"
            with h5py.File(path, "r") as f:
                ds = f["optim/m/fc1.weight"]
                where = ds.id.get_offset() + ds.nbytes - 3
            raw = bytearray(path.read_bytes())
            raw[where] ^= 0x40
            path.write_bytes(bytes(raw))
        comm.Barrier()
        with pytest.raises(CheckpointError, match=r"shared.h5, tensor optim/m/fc1.weight .*XXH3-128 checksum mismatch"):
            train(config("ddp", tmp / "again", steps=4), w, resume=str(ckpt))
    finally:
        remove(tmp)


@pytest.mark.mpi(min_size=2)
def test_every_damage_of_the_shared_file_is_one_line_or_touches_nothing():
    """tests/unit/test_ckpt_damage.py's sweep (flips, zeroed runs, cuts at many
    offsets) on the shared layout's one file, by ``verify`` on rank 0. On Debian's
    parallel HDF5 1.10.8 some damage crashes h5py (SIGSEGV in an attribute read): the
    metadata walk runs in a child process first (hpcdp/io/format/probe.py), so a crash is one
    line too. One process, so it runs once: on 2 ranks. Then a damaged superblock
    through a restore: the same kind of line, on every rank."""
    import sys
    from pathlib import Path

    from hpcdp.io.errors import EARLIER, CheckpointError

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        pytest.skip("the sweep is one process (verify): it runs on 2 ranks")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_ckpt_damage import damaged, sweep

    tmp = shared_dir()
    try:
        w = group(comm.Get_size())
        train(config("ddp", tmp / "run", steps=2, ckpt_dir=tmp / "ck", checkpoint__layout="shared"), w)
        comm.Barrier()
        ckpt = _step(tmp / "ck", 2)
        path = ckpt / "shared.h5"
        if comm.Get_rank() == 0:
            # 48 offsets: on Debian's HDF5 1.10.8 one of them segfaults h5py (in the child)
            seen = sweep(ckpt, "shared.h5", 48)
            assert seen["reported"] >= 24, seen
            # the index, written by the same build: probed in a child too (probe.crash_prone_build)
            seen = sweep(ckpt, "index.h5", 16)
            assert seen["reported"] >= 8, seen
            data = damaged(path, "zero", 0, 8)  # the superblock's signature
        else:
            data = None
        comm.Barrier()
        try:
            with pytest.raises(CheckpointError) as e:
                train(config("ddp", tmp / "again", steps=4), w, resume=str(ckpt))
            line = str(e.value)
            assert "\n" not in line and str(ckpt) in line and "shared.h5" in line and EARLIER in line, line
        finally:
            comm.Barrier()
            if comm.Get_rank() == 0:
                path.write_bytes(data)
    finally:
        remove(tmp)
