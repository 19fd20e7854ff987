"""Datasets and the global sampler.

Every dataset comes back as a :class:`Dataset` of host NumPy arrays, already split
into train and test deterministically (from ``data.seed``):

- classification (``task = "classification"``): ``x`` float (n, features), ``y`` int64 (n,)
- sequences (``task = "sequence"``): ``x`` int64 (n, T) tokens, ``y`` int64 (n, T) next tokens

Sources: built-in synthetic sets (:mod:`.synthetic`), the 8x8 digits shipped inside
hpcdp (:mod:`.digits`), user files (:mod:`.files`: HDF5, ``.npy``, ``.npz``)
and token corpora made by ``hpcdp data prepare`` (:mod:`.corpus`). File data stays
on disk by default: the four arrays are then array-like views that read the rows
they are indexed with (:mod:`.views`). Which rank reads which samples is decided
by :mod:`.sampler`, and :mod:`.batches` reads each step's micro-batches. The types
(:class:`Dataset`, :class:`DataError`) live in :mod:`.dataset`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .dataset import DataError, Dataset, split_indices


def load_dataset(data_cfg, task: str, dtype: str = "float32", *, comm=None, timeout=None,
                 block_size: int | None = None) -> Dataset:
    """Build the dataset that ``data_cfg`` (a :class:`hpcdp.config.DataConfig`) describes.

    ``task`` comes from the model ("classification" for mlp, "sequence" for gpt) and
    decides which shapes a file must hold. Float features are cast to ``dtype``.
    With ``comm`` (every rank calls this), file checks are collective: a file that is
    missing or different on some ranks, or a bad value found by any rank, raises the
    same DataError on every rank (collectives bounded by ``timeout`` seconds).
    ``block_size``: the model's context, the window length of a token corpus.
    """
    if data_cfg.seed < 0:  # -1 means "follow run.seed"; Config resolves it, a bare DataConfig gets 0
        data_cfg = dataclasses.replace(data_cfg, seed=0)
    kind = data_cfg.kind
    if kind == "digits":
        from .digits import load_digits_dataset
        ds = load_digits_dataset(data_cfg.test_fraction, data_cfg.seed)
    elif kind == "synthetic_classification":
        from .synthetic import make_classification
        ds = make_classification(data_cfg)
    elif kind == "synthetic_sequence":
        from .synthetic import make_markov_sequences
        ds = make_markov_sequences(data_cfg)
    elif kind in ("npz", "hdf5", "npy"):
        from .files import load_file_dataset
        ds = load_file_dataset(data_cfg, task, dtype, comm, timeout)
    elif kind == "tokens":
        from .corpus import load_corpus_dataset
        ds = load_corpus_dataset(data_cfg, block_size or data_cfg.seq_len, comm, timeout)
    else:  # config validation lists the kinds; this guards new ones
        raise DataError(f"data.kind: unknown dataset kind {kind!r}")
    if ds.task != task:
        raise DataError(f"data.kind = {kind!r} gives a {ds.task} dataset but the model needs {task} data")
    if ds.task == "classification" and isinstance(ds.x_train, np.ndarray):  # views cast as they read
        from .cast import cast_features
        cast_features(ds, dtype)  # to run.dtype; values that overflow it are a DataError
    return ds


__all__ = ["DataError", "Dataset", "load_dataset", "split_indices"]
