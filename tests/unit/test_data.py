"""Datasets and the global sampler."""

import h5py
import numpy as np
import pytest

from hpcdp.config import DataConfig
from hpcdp.data import DataError, load_dataset, split_indices
from hpcdp.data.sampler import GlobalSampler, micro_batches
from hpcdp.data.synthetic import markov_chain, sample_markov, stationary_distribution


# -- sampler ---------------------------------------------------------------------

@pytest.mark.parametrize("n, gb, policy", [(100, 16, "drop"), (100, 16, "keep"), (10, 3, "keep"), (7, 7, "drop")])
def test_rank_slices_concatenate_to_the_same_global_batch_for_any_world_size(n, gb, policy):
    sampler = GlobalSampler(n, gb, seed=3, last_batch=policy)
    for step in range(2 * sampler.batches_per_epoch + 1):
        expect = sampler.global_indices(step)
        for world in (1, 2, 3, 4):
            parts, counts = zip(*(sampler.local_indices(step, world, r) for r in range(world)))
            np.testing.assert_array_equal(np.concatenate(parts), expect)
            assert set(counts) == {len(expect)}
            # fresh sampler, other rank order: no hidden state
            other = GlobalSampler(n, gb, seed=3, last_batch=policy)
            np.testing.assert_array_equal(other.local_indices(step, world, world - 1)[0], parts[-1])


def test_epoch_is_a_permutation_and_epochs_differ():
    s = GlobalSampler(50, 10, seed=0)
    e0 = np.concatenate([s.global_indices(k) for k in range(5)])
    e1 = np.concatenate([s.global_indices(k) for k in range(5, 10)])
    assert sorted(e0) == list(range(50)) and sorted(e1) == list(range(50))
    assert not np.array_equal(e0, e1)
    assert not np.array_equal(e0, np.concatenate([GlobalSampler(50, 10, seed=1).global_indices(k) for k in range(5)]))


def test_short_last_batch_drop_and_keep():
    drop = GlobalSampler(10, 4, seed=0, last_batch="drop")
    keep = GlobalSampler(10, 4, seed=0, last_batch="keep")
    assert drop.batches_per_epoch == 2 and keep.batches_per_epoch == 3
    assert [len(drop.global_indices(k)) for k in range(4)] == [4, 4, 4, 4]  # steps 2, 3 are epoch 1
    assert [len(keep.global_indices(k)) for k in range(4)] == [4, 4, 2, 4]
    # short batch over 3 ranks: slices of 1, 1, 0 samples, global count 2
    assert [(len(i), g) for i, g in (keep.local_indices(2, 3, r) for r in range(3))] == [(1, 2), (1, 2), (0, 2)]
    # the kept batch holds exactly the samples the dropped policy never uses in epoch 0
    used = set(np.concatenate([drop.global_indices(0), drop.global_indices(1)]))
    assert set(keep.global_indices(2)) == set(range(10)) - used
    with pytest.raises(DataError, match="larger than the 10 training samples"):
        GlobalSampler(10, 11, seed=0, last_batch="drop")
    assert GlobalSampler(10, 11, seed=0, last_batch="keep").batches_per_epoch == 1


def test_micro_batches_cover_the_slice_in_order():
    local = np.arange(10)
    parts = micro_batches(local, 3)
    assert [len(p) for p in parts] == [4, 3, 3]
    np.testing.assert_array_equal(np.concatenate(parts), local)
    assert [len(p) for p in micro_batches(np.arange(1), 2)] == [1, 0]


def test_split_is_deterministic_and_disjoint():
    tr, te = split_indices(100, 0.2, seed=4)
    assert len(te) == 20 and len(tr) == 80 and not set(tr) & set(te)
    tr2, te2 = split_indices(100, 0.2, seed=4)
    np.testing.assert_array_equal(te, te2)
    assert not np.array_equal(te, split_indices(100, 0.2, seed=5)[1])


# -- built-in datasets -------------------------------------------------------------

def test_synthetic_classification_is_deterministic_and_learnable_structure():
    cfg = DataConfig(kind="synthetic_classification", seed=1, n_samples=600, n_features=12, n_classes=3)
    a = load_dataset(cfg, "classification")
    b = load_dataset(cfg, "classification")
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape == (480, 12) and a.x_train.dtype == np.float32 and a.n_classes == 3
    assert set(np.unique(a.y_train)) == {0, 1, 2}
    # structure: nearest class mean (computed on train) beats chance clearly on test
    means = np.stack([a.x_train[a.y_train == c].mean(0) for c in range(3)])
    pred = np.argmin(((a.x_test[:, None, :] - means) ** 2).sum(-1), axis=1)
    assert (pred == a.y_test).mean() > 0.6
    other = load_dataset(DataConfig(kind="synthetic_classification", seed=2, n_samples=600,
                                    n_features=12, n_classes=3), "classification")
    assert not np.array_equal(a.x_train, other.x_train)


@pytest.mark.parametrize("order", [1, 2])
def test_markov_floor_equals_empirical_loss_of_the_true_chain(order):
    v, t = 5, 12
    p = markov_chain(v, order, 0.3, seed=0)
    pi = stationary_distribution(p, v, order)
    cfg = DataConfig(kind="synthetic_sequence", seed=0, vocab_size=v, seq_len=t, markov_order=order,
                     concentration=0.3, n_samples=4000)
    ds = load_dataset(cfg, "sequence")
    assert ds.x_train.shape[1] == t and ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.x_train[:, 1:], ds.y_train[:, :-1])  # y is x shifted
    # NLL of the Bayes predictor (the true chain) on fresh samples ~ the exact floor
    seq = sample_markov(p, pi, v, order, 20000, t + 1, np.random.default_rng(9))
    nll = []
    for pos in range(1, t + 1):
        if order == 1 or pos >= 2:
            state = seq[:, pos - 1] if order == 1 else seq[:, pos - 2] * v + seq[:, pos - 1]
            prob = p[state, seq[:, pos]]
        else:  # first target of an order-2 chain sees only s0: P(s1 | s0) from pi
            joint = pi.reshape(v, v)
            prob = joint[seq[:, 0], seq[:, 1]] / joint.sum(1)[seq[:, 0]]
        nll.append(-np.log(prob).mean())
    assert abs(np.mean(nll) - ds.info["loss_floor"]) < 0.02
    assert ds.info["loss_floor"] < ds.info["uniform_loss"] - 0.1


# -- files -----------------------------------------------------------------------

def _cls_arrays(n=50, d=6):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, 4, size=n)


def _write(kind, path, **arrays):
    if kind == "npz":
        np.savez(path, **arrays)
    else:
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f.create_dataset(k, data=v)


@pytest.mark.parametrize("kind, suffix", [("npz", ".npz"), ("hdf5", ".h5")])
def test_file_dataset_good_file(tmp_path, kind, suffix):
    x, y = _cls_arrays()
    path = tmp_path / f"d{suffix}"
    _write(kind, path, images=x.reshape(50, 2, 3), labels=y)
    cfg = DataConfig(kind=kind, path=str(path), x_key="images", y_key="labels", test_fraction=0.2, seed=0)
    ds = load_dataset(cfg, "classification", dtype="float64")
    assert ds.x_train.shape == (40, 6) and ds.x_train.dtype == np.float64 and ds.n_test == 10
    tr, te = split_indices(50, 0.2, 0)
    np.testing.assert_allclose(ds.x_test, x[te])
    np.testing.assert_array_equal(ds.y_train, y[tr])
    assert ds.n_classes == int(y.max()) + 1


@pytest.mark.parametrize("kind, suffix", [("npz", ".npz"), ("hdf5", ".h5")])
def test_file_dataset_sequences_with_separate_test_file(tmp_path, kind, suffix):
    tok = np.random.default_rng(0).integers(0, 9, size=(20, 9))
    _write(kind, tmp_path / f"tr{suffix}", x=tok[:15, :-1], y=tok[:15, 1:])
    _write(kind, tmp_path / f"te{suffix}", x=tok[15:, :-1], y=tok[15:, 1:])
    cfg = DataConfig(kind=kind, path=str(tmp_path / f"tr{suffix}"), test_path=str(tmp_path / f"te{suffix}"))
    ds = load_dataset(cfg, "sequence")
    assert ds.x_train.shape == (15, 8) and ds.x_test.shape == (5, 8)
    assert ds.n_classes == int(tok.max()) + 1


@pytest.mark.parametrize("kind, suffix", [("npz", ".npz"), ("hdf5", ".h5")])
@pytest.mark.parametrize("arrays, task, message", [
    (lambda x, y: {"y": y}, "classification", r"data\.x_key: .*'x' not found in .*; .*found: \['y'\]"),
    (lambda x, y: {"x": x, "y": y.astype(np.float32)}, "classification",
     r"'y' must hold integer class labels, found dtype float32"),
    (lambda x, y: {"x": x, "y": y[:-1]}, "classification", r"'y' must have shape \(n,\) = \(50,\) .* found shape \(49,\)"),
    (lambda x, y: {"x": x[:, 0], "y": y}, "classification", r"'x' must have shape \(n, features\), found shape \(50,\)"),
    (lambda x, y: {"x": x.astype(np.complex64), "y": y}, "classification", r"'x' must be a numeric array .* found dtype complex64"),
    (lambda x, y: {"x": x, "y": y - 5}, "classification", r"'y' must be >= 0"),
    (lambda x, y: {"x": x, "y": y}, "sequence", r"'x' must hold integer token ids, found dtype float32"),
    (lambda x, y: {"x": y.reshape(10, 5), "y": y.reshape(5, 10)}, "sequence",
     r"'y' must have the same shape as 'x' \(10, 5\), found shape \(5, 10\)"),
])
def test_file_dataset_bad_files_say_expected_and_found(tmp_path, kind, suffix, arrays, task, message):
    x, y = _cls_arrays()
    path = tmp_path / f"bad{suffix}"
    _write(kind, path, **arrays(x, y))
    with pytest.raises(DataError, match=message):
        load_dataset(DataConfig(kind=kind, path=str(path)), task)


@pytest.mark.parametrize("kind", ["npz", "hdf5"])
def test_missing_and_unreadable_files(tmp_path, kind):
    with pytest.raises(DataError, match=r"data\.path: file not found: .*nope"):
        load_dataset(DataConfig(kind=kind, path=str(tmp_path / "nope")), "classification")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not an archive at all")
    with pytest.raises(DataError, match="cannot (read|open) as"):
        load_dataset(DataConfig(kind=kind, path=str(junk)), "classification")


def test_hdf5_group_paths_and_group_is_not_a_dataset(tmp_path):
    x, y = _cls_arrays()
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/x", data=x)
        f.create_dataset("train/y", data=y)
    ds = load_dataset(DataConfig(kind="hdf5", path=str(path), x_key="train/x", y_key="train/y"), "classification")
    assert ds.n_train + ds.n_test == 50
    with pytest.raises(DataError, match=r"data\.x_key: 'train' in .* is a group, expected a dataset"):
        load_dataset(DataConfig(kind="hdf5", path=str(path), x_key="train", y_key="train/y"), "classification")


def test_npz_object_arrays_are_refused_without_pickle(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([[1.0], [2.0]], dtype=object), y=np.array([0, 1]))
    with pytest.raises(DataError, match="without pickle"):
        load_dataset(DataConfig(kind="npz", path=str(path)), "classification")
