"""On-disk data on several ranks: every rank reads its slice of the same global batch
(equal to the in-memory batches and to the one-rank global batch), and a file that is
missing or different on some ranks, or a bad value only one rank's scan sees, stops
every rank with the same error before training."""

import io
import json
import os
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.config import DataConfig, TrainConfig, load_config
from hpcdp.data import DataError, load_dataset
from hpcdp.data.batches import BatchSource
from hpcdp.shard import shard_range
from hpcdp.failure.agreement import on_root

TIMEOUT = 20.0


def _shared_dir(comm, tmp_path_factory) -> Path:
    """A folder made on rank 0, known to every rank (one node: a shared file system)."""
    return Path(on_root(comm, lambda: str(tmp_path_factory.mktemp("shared")), what="a test folder",
                        timeout=TIMEOUT))


def _rows_file(comm, folder: Path) -> Path:
    path = folder / "rows.h5"
    if comm.Get_rank() == 0:
        rng = np.random.default_rng(0)
        with h5py.File(path, "w") as f:
            f["x"] = rng.normal(size=(211, 5)).astype(np.float32)
            f["y"] = rng.integers(0, 4, size=211)
    comm.Barrier()
    return path


def _corpus(comm, folder: Path) -> Path:
    from hpcdp.data.prepare import collect_files, prepare_corpus
    path = folder / "corpus.h5"
    if comm.Get_rank() == 0:
        for i in range(4):
            (folder / f"t{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (20 + 7 * i))
        prepare_corpus(collect_files([folder], "t*.py"), path, val_fraction=0.25)
    comm.Barrier()
    return path


@pytest.mark.parametrize("kind", ["hdf5", "tokens"])
def test_every_rank_reads_its_slice_of_the_one_rank_global_batch(comm, tmp_path_factory, kind):
    folder = _shared_dir(comm, tmp_path_factory)
    path = _rows_file(comm, folder) if kind == "hdf5" else _corpus(comm, folder)
    task = "classification" if kind == "hdf5" else "sequence"
    n, r = comm.Get_size(), comm.Get_rank()
    loaded = {st: load_dataset(DataConfig(kind=kind, path=str(path), seed=4, storage=st), task,
                               comm=comm, timeout=TIMEOUT, block_size=12) for st in ("disk", "memory")}
    assert loaded["disk"].info["storage"] == "disk"
    train = TrainConfig(steps=9, epochs=0, global_batch=13, grad_accum=2)
    mine = BatchSource(loaded["disk"], DataConfig(seed=4), train, n, r)  # prefetching
    ref = BatchSource(loaded["memory"], DataConfig(seed=4, prefetch=False), train, 1, 0)
    for step in range(9):
        b, whole = mine.get(step), ref.get(step)
        x_all = np.concatenate([whole.fetch(i)[0] for i in whole.local.micro])
        off, size = shard_range(13, n, r)
        assert b.n_local == size
        x_mine = np.concatenate([b.fetch(i)[0] for i in b.local.micro if len(i)])
        np.testing.assert_array_equal(x_mine, x_all[off:off + size])
        assert b.n_global == 13
    mine.close()


def test_ddp_training_on_disk_equals_training_in_memory(comm, tmp_path_factory):
    pytest.importorskip("hpcdp.strategies.ddp")
    from hpcdp.train import run_training
    from hpcdp.world import World
    folder = _shared_dir(comm, tmp_path_factory)
    path = _rows_file(comm, folder)
    losses = {}
    for st in ("memory", "disk"):
        out = folder / f"run-{st}"
        cfg = load_config(None, ["data.kind=hdf5", f'data.path="{path}"', f"data.storage={st}",
                                 "model.sizes=[5, 16, 4]", "train.steps=8", "train.global_batch=16",
                                 "parallel.strategy=ddp", f'run.out_dir="{out}"'])
        res = run_training(cfg, world=World.from_mpi(), out=io.StringIO())
        if comm.Get_rank() == 0:
            recs = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
            losses[st] = [x["loss"] for x in recs if "eval" not in x] + [res["eval"]["loss"]]
    if comm.Get_rank() == 0:
        assert losses["disk"] == losses["memory"]


def _in_own_folder(test):
    """Run ``test(folder)`` with each rank in its own folder as the working directory, so a
    relative data.path names a different file on each rank (as on different nodes)."""
    here = os.getcwd()
    folder = Path(tempfile.mkdtemp(prefix=f"hpcdp-rank{MPI.COMM_WORLD.Get_rank()}-"))
    os.chdir(folder)
    try:
        return test(folder)
    finally:
        os.chdir(here)


def _write(folder, n_rows=40, bad_label_at=None):
    y = np.arange(n_rows) % 3
    if bad_label_at is not None:
        y[bad_label_at] = -7
    with h5py.File(folder / "data.h5", "w") as f:
        f["x"] = np.ones((n_rows, 4), np.float32)
        f["y"] = y


def _load_here(comm):
    return load_dataset(DataConfig(kind="hdf5", path="data.h5"), "classification", comm=comm, timeout=TIMEOUT)


@pytest.mark.mpi(min_size=2)
def test_a_file_missing_on_some_ranks_is_named_on_every_rank(comm):
    def test(folder):
        if comm.Get_rank() == 0:
            _write(folder)
        with pytest.raises(ValueError) as err:  # a JobError: the same on every rank
            _load_here(comm)
        others = list(range(1, comm.Get_size()))
        want = f"rank {others[0]}" if len(others) == 1 else f"ranks {others}"
        assert f"data.path: file 'data.h5' is missing on {want} of {comm.Get_size()} (found on rank 0)" \
            in str(err.value)
    _in_own_folder(test)


@pytest.mark.mpi(min_size=2)
def test_a_file_that_differs_between_ranks_is_named_on_every_rank(comm):
    def test(folder):
        _write(folder, n_rows=40 if comm.Get_rank() != 1 else 41)
        with pytest.raises(ValueError, match=r"data\.path: file 'data\.h5' differs between ranks \(.*rank 1 see"):
            _load_here(comm)
    _in_own_folder(test)


def test_a_bad_value_in_one_ranks_share_stops_every_rank(comm, tmp_path_factory):
    folder = _shared_dir(comm, tmp_path_factory)
    if comm.Get_rank() == 0:
        _write(folder, n_rows=40, bad_label_at=39)  # scanned by the last rank only
    comm.Barrier()
    with pytest.raises(DataError, match=r"'y' must be >= 0 .* found minimum -7"):
        load_dataset(DataConfig(kind="hdf5", path=str(folder / "data.h5")), "classification",
                     comm=comm, timeout=TIMEOUT)
