"""The digits come from the file in scikit-learn's wheel, without importing scikit-learn."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from hpcdp.config import DataConfig
from hpcdp.data import DataError, load_dataset
from hpcdp.data import digits as D


def test_digits_split_shapes_and_range():
    ds = load_dataset(DataConfig(kind="digits", seed=0), "classification")
    assert ds.x_train.shape == (1438, 64) and ds.n_test == 359 and ds.n_classes == 10
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0


def test_same_arrays_as_scikit_learn_load_digits():
    from sklearn.datasets import load_digits
    ref = load_digits()
    x, y = D.read_digits(D.digits_file())
    np.testing.assert_array_equal(x, ref.data)
    np.testing.assert_array_equal(y, ref.target)
    assert x.dtype == np.uint8 and y.dtype == np.int64


def test_loading_imports_neither_scikit_learn_nor_scipy():
    code = ("import sys; from hpcdp.config import DataConfig; from hpcdp.data import load_dataset; "
            "load_dataset(DataConfig(kind='digits'), 'classification'); "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_without_scikit_learn_the_error_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))
    with pytest.raises(DataError, match=r"pip install 'hpcdp\[digits\]'"):
        load_dataset(DataConfig(kind="digits"), "classification")


@pytest.mark.parametrize("content, match", [
    (b"not gzip", "cannot read"),
    (gzip.compress(b"1,2,3\n"), "holds 3 numbers"),
    (gzip.compress(b"0," * 64 * 1797), "holds 115008 numbers"),
    (gzip.compress((",".join(["17"] * 64) + ",3\n").encode() * 1797), "pixels outside 0..16"),
])
def test_a_damaged_file_is_a_clear_error(tmp_path, content, match):
    p = tmp_path / "digits.csv.gz"
    p.write_bytes(content)
    with pytest.raises(DataError, match=match) as e:
        D.read_digits(p)
    assert str(p) in str(e.value)
