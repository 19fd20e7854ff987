"""The digits ship inside hpcdp: scikit-learn's file, read without scikit-learn or SciPy."""

from __future__ import annotations

import gzip
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


def test_the_arrays_are_scikit_learns_load_digits():
    """Pinned from scikit-learn 1.9.1's load_digits() (the file is the one it ships):
    class counts, pixel sum and a SHA-256 of (uint8 pixels, int64 labels)."""
    import hashlib

    x, y = D.read_digits(D.digits_file())
    assert x.shape == (1797, 64) and x.dtype == np.uint8 and y.dtype == np.int64
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert int(x.sum()) == 561718
    digest = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
    assert digest == "65e5b4619795efb40c1082f4c350c049e4ad552200d369b6ae99e21eef5e72c5"


def test_loading_imports_neither_scikit_learn_nor_scipy():
    code = ("import sys; from hpcdp.config import DataConfig; from hpcdp.data import load_dataset; "
            "load_dataset(DataConfig(kind='digits'), 'classification'); "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_missing_file_says_reinstall(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "FILE", tmp_path / "digits.csv.gz")
    with pytest.raises(DataError, match=r"missing from this hpcdp install; reinstall hpcdp"):
        load_dataset(DataConfig(kind="digits"), "classification")


def test_the_file_and_its_notice_are_package_data():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["hpcdp"]
    assert "data/digits.csv.gz" in data and "data/digits.NOTICE" in data
    assert D.FILE.with_name("digits.NOTICE").is_file()


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
