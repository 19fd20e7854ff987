"""Data that would make hpcdp read files it was not given, or train on inf, is refused."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpcdp.config import load_config
from hpcdp.data import DataError, load_dataset

X = np.arange(40 * 4, dtype=np.float64).reshape(40, 4) / 100
Y = np.arange(40) % 3


def _cfg(path, *more):
    return load_config(None, ["data.kind=hdf5", f'data.path="{path}"', *more]).data


def _secret(tmp_path):
    """Another file on the system whose bytes happen to form a valid x."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(X.tobytes())
    return secret


def _external_storage(tmp_path):
    path = tmp_path / "ext.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=X.shape, dtype=X.dtype, external=[(str(_secret(tmp_path)), 0, X.nbytes)])
        f["y"] = Y
    return path


def _virtual(tmp_path):
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as f:
        f["data"] = X
    path = tmp_path / "virt.h5"
    layout = h5py.VirtualLayout(shape=X.shape, dtype=X.dtype)
    layout[:] = h5py.VirtualSource(str(src), "data", shape=X.shape)
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("x", layout)
        f["y"] = Y
    return path


def _external_link(tmp_path):
    src = tmp_path / "other.h5"
    with h5py.File(src, "w") as f:
        f["data"] = X
    path = tmp_path / "link.h5"
    with h5py.File(path, "w") as f:
        f["x"] = h5py.ExternalLink(str(src), "data")
        f["y"] = Y
    return path


@pytest.mark.parametrize("make, why", [(_external_storage, "it has external storage in .*secret.bin"),
                                       (_virtual, "it is a virtual dataset mapping data from .*src.h5"),
                                       (_external_link, "it is an external link to .*other.h5")])
def test_hdf5_data_stored_outside_the_file_needs_an_opt_in(tmp_path, make, why):
    path = make(tmp_path)
    with pytest.raises(DataError, match=rf"data\.path: dataset 'x' in .* reads bytes from other files \({why}\)"
                                        r".*data\.allow_external = true"):
        load_dataset(_cfg(path), "classification")
    ds = load_dataset(_cfg(path, "data.allow_external=true"), "classification")  # opted in: read
    assert ds.n_train + ds.n_test == 40


def test_plain_hdf5_is_read(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = X, Y
    assert load_dataset(_cfg(path), "classification").n_train == 32


def test_values_that_overflow_run_dtype_are_a_data_error(tmp_path):
    path = tmp_path / "big.npz"
    x = X.copy()
    x[3, 1] = 1e300  # finite in float64, inf in float32
    np.savez(path, x=x, y=Y)
    cfg = load_config(None, ["data.kind=npz", f'data.path="{path}"']).data
    with pytest.raises(DataError, match=r"1 feature value\(s\) of (train|test) overflow run\.dtype = 'float32' "
                                        r"\(largest magnitude 1e\+300.*run\.dtype = \"float64\""):
        load_dataset(cfg, "classification", "float32")
    ds = load_dataset(cfg, "classification", "float64")  # fits in float64
    assert np.isfinite(ds.x_train).all()
