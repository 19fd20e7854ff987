"""On-disk datasets: reads equal in-memory indexing, batches equal in-memory batches,
prefetch changes nothing, and the errors name the key to fix."""

import io
import json

import h5py
import numpy as np
import pytest

from hpcdp.config import DataConfig, TrainConfig, load_config
from hpcdp.data import DataError, load_dataset
from hpcdp.data.arrays import DiskArray, open_h5_dataset, open_npy, runs
from hpcdp.data.batches import BatchSource


def _arrays(n=300, d=(3, 4), classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n,) + d).astype(np.float32), rng.integers(0, classes, size=n)


def _h5(path, chunks=None, compression=None, **arrays):
    """chunks: rows per chunk (None: contiguous)."""
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v, chunks=None if chunks is None else (chunks,) + v.shape[1:],
                             compression=compression)


def test_runs_of_consecutive_rows():
    s, n = runs(np.array([0, 1, 2, 5, 7, 8]))
    assert s.tolist() == [0, 5, 7] and n.tolist() == [3, 1, 2]
    assert [a.tolist() for a in runs(np.array([], dtype=np.int64))] == [[], []]


def _open(tmp_path, layout, name, a):
    """``a`` stored as ``layout`` and opened as a DiskArray."""
    if layout == "npy":
        np.save(tmp_path / f"{name}.npy", a)
        return open_npy(tmp_path / f"{name}.npy", f"{name}.npy")
    chunks = 64 if layout != "contiguous" else None
    _h5(tmp_path / f"{name}.h5", chunks=chunks, compression="gzip" if layout == "gzip" else None, x=a)
    return open_h5_dataset(h5py.File(tmp_path / f"{name}.h5", "r"), "x", "x_key", tmp_path / f"{name}.h5")


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "gzip", "npy"])
@pytest.mark.parametrize("sieve_gap", [0, 1 << 20])
def test_disk_reads_equal_numpy_indexing(tmp_path, layout, sieve_gap):
    x, _ = _arrays(n=1000)
    arr = _open(tmp_path, layout, "rows", x)
    assert arr.method == ("pread" if layout in ("contiguous", "npy") else "h5py")
    arr.sieve_gap = sieve_gap
    rng = np.random.default_rng(1)
    for idx in (rng.permutation(1000)[:77], np.array([5, 5, 3, 999, 0]), np.arange(10, 60),
                np.array([], dtype=np.int64), rng.integers(0, 1000, 500)):
        np.testing.assert_array_equal(arr.read(idx), x[idx])
    np.testing.assert_array_equal(arr.read(slice(100, 350)), x[100:350])
    np.testing.assert_array_equal(arr.read(slice(None, None, 7)), x[::7])
    with pytest.raises(IndexError, match="row 1000 is out of range for 1000 rows"):
        arr.read([3, 1000])
    flat = rng.integers(0, 256, 4000).astype(np.uint8)  # a token stream
    tokens = _open(tmp_path, layout, "tokens", flat)
    w = tokens.read_windows([7, 0, 3990, 7], 10)
    np.testing.assert_array_equal(w, np.stack([flat[s:s + 10] for s in (7, 0, 3990, 7)]))
    with pytest.raises(IndexError, match="a window of 10 at 3991 is out of range"):
        tokens.read_windows([3991], 10)


def test_sieving_reads_a_dense_batch_in_one_call_and_a_sparse_one_row_by_row(tmp_path, monkeypatch):
    x = np.arange(4000 * 16, dtype=np.float32).reshape(4000, 16)  # 64-byte rows
    np.save(tmp_path / "x.npy", x)
    arr = open_npy(tmp_path / "x.npy", "x")
    calls = []
    real = DiskArray._read_run
    monkeypatch.setattr(DiskArray, "_read_run", lambda self, s, out: (calls.append(len(out)), real(self, s, out)))
    dense = np.array([10, 12, 15, 40, 41, 300])  # gaps well below 32 KiB
    np.testing.assert_array_equal(arr.read(dense), x[dense])
    assert calls == [291]  # one span, rows 10..300
    calls.clear()
    arr.sieve_gap = 0
    np.testing.assert_array_equal(arr.read(dense), x[dense])
    assert calls == [1, 1, 1, 2, 1]  # runs: 10 | 12 | 15 | 40-41 | 300
    calls.clear()
    arr.sieve_gap, arr.sieve_max = 1 << 20, 64 * 100  # span cap: 100 rows
    np.testing.assert_array_equal(arr.read(dense), x[dense])
    assert calls == [1, 1, 1, 2, 1]  # span of 291 rows > cap: falls back to runs


def test_npy_refuses_fortran_order_objects_and_truncation(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((4, 3))))
    with pytest.raises(DataError, match="Fortran order.*np.ascontiguousarray"):
        open_npy(tmp_path / "f.npy", "f.npy")
    np.save(tmp_path / "o.npy", np.array([[1], [2]], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="need pickle"):
        open_npy(tmp_path / "o.npy", "o.npy")
    np.save(tmp_path / "t.npy", np.ones((100, 3)))
    raw = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-50])
    with pytest.raises(DataError, match="truncated"):
        open_npy(tmp_path / "t.npy", "t.npy")


def _dataset_pair(tmp_path, kind, task="classification", **kw):
    """The same file loaded on disk and in memory."""
    cfg = DataConfig(kind=kind, path=str(tmp_path / ("d.h5" if kind == "hdf5" else "d")), seed=3, **kw)
    disk = load_dataset(cfg, task, "float64")
    mem = load_dataset(DataConfig(**{**cfg.__dict__, "storage": "memory"}), task, "float64")
    return disk, mem


@pytest.mark.parametrize("kind", ["hdf5", "npy"])
def test_views_equal_the_in_memory_dataset(tmp_path, kind):
    x, y = _arrays()
    if kind == "hdf5":
        _h5(tmp_path / "d.h5", x=x, y=y)
    else:
        (tmp_path / "d").mkdir()
        np.save(tmp_path / "d" / "x.npy", x)
        np.save(tmp_path / "d" / "y.npy", y)
    disk, mem = _dataset_pair(tmp_path, kind)
    assert disk.info["storage"] == "disk" and mem.info["storage"] == "memory"
    assert isinstance(mem.x_train, np.ndarray) and not isinstance(disk.x_train, np.ndarray)
    assert disk.x_train.shape == mem.x_train.shape == (240, 12) and disk.n_classes == mem.n_classes == 5
    assert disk.x_train.dtype == mem.x_train.dtype == np.float64 and disk.y_train.dtype == np.int64
    idx = np.random.default_rng(0).permutation(240)[:50]
    np.testing.assert_array_equal(disk.x_train[idx], mem.x_train[idx])
    np.testing.assert_array_equal(disk.y_train[idx], mem.y_train[idx])
    np.testing.assert_array_equal(disk.x_test[7:40], mem.x_test[7:40])
    np.testing.assert_array_equal(np.asarray(disk.y_test), mem.y_test)
    assert "on disk" in disk.describe()


def mem_pair(mem, idx):
    return mem.x_train[idx], mem.y_train[idx]


def test_batches_from_disk_equal_batches_from_memory_with_and_without_prefetch(tmp_path):
    x, y = _arrays(n=203)
    _h5(tmp_path / "d.h5", chunks=16, x=x, y=y)  # chunked: the h5py path
    disk, mem = _dataset_pair(tmp_path, "hdf5")
    train = TrainConfig(steps=0, epochs=3, global_batch=24, grad_accum=2, last_batch="keep")
    for ranks in (1, 2, 3):
        for r in range(ranks):
            srcs = [BatchSource(ds, DataConfig(seed=3, prefetch=pf), train, ranks, r)
                    for ds in (mem, disk) for pf in (False, True)]
            assert srcs[0]._prefetch is None and srcs[3]._prefetch is not None
            assert srcs[0].total == 3 * 7  # 162 train samples: 6 full batches + a short one (keep)
            for step in range(srcs[0].total):
                got = [s.get(step) for s in srcs]
                ref = got[0]
                np.testing.assert_array_equal(np.concatenate(ref.local.micro),
                                              srcs[0].sampler.local_indices(step, ranks, r)[0])
                for b in got:
                    assert (b.n_local, b.n_global) == (ref.n_local, ref.n_global)
                    for ia, ib in zip(ref.local.micro, b.local.micro):
                        np.testing.assert_array_equal(ia, ib)
                        if len(ia):
                            for a, c in zip(mem_pair(mem, ia), b.fetch(ib)):  # the in-memory arrays
                                np.testing.assert_array_equal(a, c)
                    np.testing.assert_array_equal(b.fetch(b.local.filler)[0], mem.x_train[ref.local.filler])
            for s in srcs:
                s.close()


def test_empty_micro_batch_gets_one_sample_with_weight_zero(tmp_path):
    x, y = _arrays(n=100)
    _h5(tmp_path / "d.h5", x=x, y=y)
    disk, mem = _dataset_pair(tmp_path, "hdf5")
    src = BatchSource(disk, DataConfig(seed=3), TrainConfig(steps=5, epochs=0, global_batch=4, grad_accum=2), 4, 3)
    b = src.get(0)
    assert b.n_local == 1 and [len(i) for i in b.local.micro] == [1, 0] and b.n_global == 4
    first = src.sampler.global_indices(0)[:1]
    np.testing.assert_array_equal(b.local.filler, first)
    np.testing.assert_array_equal(b.fetch(b.local.filler)[0], mem.x_train[first])
    np.testing.assert_array_equal(b.fetch(b.local.micro[0])[1], mem.y_train[b.local.micro[0]])
    with pytest.raises(KeyError, match="were not read for this step"):
        b.fetch(np.array([int(np.setdiff1d(np.arange(80), b.indices)[0])]))
    src.close()


def test_prefetch_raises_a_read_error_at_the_step_that_needs_it(tmp_path, monkeypatch):
    x, y = _arrays(n=100)
    _h5(tmp_path / "d.h5", x=x, y=y)
    disk, _ = _dataset_pair(tmp_path, "hdf5")
    src = BatchSource(disk, DataConfig(seed=3), TrainConfig(steps=5, epochs=0, global_batch=8), 1, 0)
    src.get(0)  # starts reading step 1 in the background

    def broken(step):
        raise DataError("disk on fire")

    monkeypatch.setattr(src._prefetch, "_read", broken)
    src.get(1)  # already read before the breakage
    with pytest.raises(DataError, match="disk on fire"):
        src.get(2)
    src.close()


def _train(tmp_path, name, *sets):
    out = tmp_path / name
    cfg = load_config(None, ["train.steps=12", "run.log_every=4", f'run.out_dir="{out}"',
                             "train.grad_accum=2", "run.eval_every=6", *sets])
    res = run_training_quiet(cfg)
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    return res, [r for r in lines if "step" in r], [r["eval"] for r in lines if "eval" in r]


def run_training_quiet(cfg):
    from hpcdp.train import run_training
    return run_training(cfg, out=io.StringIO())


def test_training_on_disk_with_and_without_prefetch_equals_training_in_memory(tmp_path):
    x, y = _arrays(n=400, d=(64,), classes=10)
    _h5(tmp_path / "d.h5", x=x, y=y)
    file = [f'data.path="{tmp_path / "d.h5"}"', "data.kind=hdf5"]
    runs_ = {name: _train(tmp_path, name, *file, *sets) for name, sets in (
        ("memory", ["data.storage=memory"]), ("disk", ["data.prefetch=false"]), ("prefetch", []))}
    ref_res, ref_steps, ref_evals = runs_["memory"]
    for name in ("disk", "prefetch"):
        res, steps, evals = runs_[name]
        assert [s["loss"] for s in steps] == [s["loss"] for s in ref_steps]  # bit for bit
        assert evals == ref_evals and res["loss"] == ref_res["loss"]
    # every step reports how long it waited for data, per rank
    assert all(len(s["ranks"]["data_wait_s"]) == 1 and s["ranks"]["data_wait_s"][0] >= 0 for s in ref_steps)


def test_on_disk_errors_name_the_key(tmp_path):
    x, y = _arrays(n=60)
    _h5(tmp_path / "d.h5", x=x, y=np.where(np.arange(60) == 59, -1, y))
    with pytest.raises(DataError, match=r"'y' must be >= 0 .* found minimum -1"):
        load_dataset(DataConfig(kind="hdf5", path=str(tmp_path / "d.h5")), "classification")
    x[41, 1, 2] = np.nan
    _h5(tmp_path / "n.h5", x=x, y=y)
    with pytest.raises(DataError, match=r"'x' contains NaN or infinite values"):
        load_dataset(DataConfig(kind="hdf5", path=str(tmp_path / "n.h5")), "classification")
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "x.npy", x)
    with pytest.raises(DataError, match=r"data\.path: file not found: .*npy/y\.npy"):
        load_dataset(DataConfig(kind="npy", path=str(tmp_path / "npy")), "classification")
    # labels beyond the model's classes: the model key is named
    from hpcdp.train import check_model_fits_data
    _h5(tmp_path / "c.h5", x=np.zeros((20, 4), np.float32), y=np.arange(20) % 12)
    ds = load_dataset(DataConfig(kind="hdf5", path=str(tmp_path / "c.h5")), "classification")
    with pytest.raises(ValueError, match=r"model\.sizes: the last size must be the number of classes .* \(12\)"):
        check_model_fits_data(load_config(None, ["model.sizes=[4, 8, 10]"]).model, ds)


def test_storage_disk_is_refused_for_data_read_whole():
    from hpcdp.config_error import ConfigError
    with pytest.raises(ConfigError, match=r"data\.storage: 'disk' works for data\.kind 'hdf5', 'npy' and 'tokens'"):
        DataConfig(kind="npz", path="a.npz", storage="disk")


def test_on_disk_features_that_overflow_run_dtype_and_external_links(tmp_path):
    x, y = _arrays(n=60, d=(4,))
    big = x.astype(np.float64)
    big[17, 2] = 1e300  # finite in float64, inf in float32
    _h5(tmp_path / "big.h5", x=big, y=y)
    cfg = DataConfig(kind="hdf5", path=str(tmp_path / "big.h5"))
    with pytest.raises(DataError, match=r"feature values of 'x' overflow run\.dtype = 'float32'.*float64"):
        load_dataset(cfg, "classification", "float32")
    assert load_dataset(cfg, "classification", "float64").info["storage"] == "disk"
    # data reached through an external link (allowed explicitly) is read from the linked file
    _h5(tmp_path / "other.h5", x=x, y=y)
    with h5py.File(tmp_path / "link.h5", "w") as f:
        f["x"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "x")
        f["y"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "y")
    ds = load_dataset(DataConfig(kind="hdf5", path=str(tmp_path / "link.h5"), allow_external=True,
                                 test_fraction=0.0), "classification")
    assert ds.x_train.array.method == "pread"
    np.testing.assert_array_equal(ds.x_train[np.arange(60)], x)
