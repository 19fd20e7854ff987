"""A token corpus (``data.kind = "tokens"``) as a Dataset of windows.

Training samples are windows of ``T + 1`` tokens (``T`` = ``model.block_size``) of
``/train/tokens``, one per start position: sample ``i`` is ``tokens[i : i + T + 1]``,
``x`` its first ``T`` tokens and ``y`` its last ``T``. Which windows form a step's
batch is :class:`~hpcdp.data.sampler.WindowSampler`'s rule.

Evaluation uses fixed windows of ``/val/tokens``: the non-overlapping windows
``val[k T : k T + T + 1]``; with ``data.eval_windows = K`` > 0, K of them evenly
spread over the split (so an evaluation costs the same for any corpus size).

Startup checks (every rank alike): the file is a corpus of a known format version,
both splits hold at least one window (else ``model.block_size`` is too large for
it), and no token id is outside the vocabulary (each rank scans its share).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdp.shard import shard_range

from .dataset import DataError, Dataset
from .same_files import check_same_files, combine_max
from .arrays import MemoryArray, open_h5_dataset
from .prepare import FORMAT, FORMAT_VERSION
from .tokenizer import Tokenizer
from .views import Windows, WindowView

SCAN_TOKENS = 4 << 20


def eval_starts(n_tokens: int, T: int, k: int) -> np.ndarray:
    """Starts of the evaluation windows (see the module docstring)."""
    m = (n_tokens - 1) // T  # non-overlapping windows of T targets
    if k and m > k:
        return (np.arange(k, dtype=np.int64) * m // k) * T
    return np.arange(m, dtype=np.int64) * T


def _max_id(tokens, rank: int, size: int) -> int:
    off, count = shard_range(len(tokens), size, rank)
    top = -1
    for lo in range(off, off + count, SCAN_TOKENS):
        top = max(top, int(tokens.read(slice(lo, min(lo + SCAN_TOKENS, off + count))).max()))
    return top


def open_corpus(path: Path):
    """(h5py file, Tokenizer) of a corpus file, after the format checks."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"data.path: {path}: cannot open as an HDF5 file ({e})") from None
    fmt = f.attrs.get("format")
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt != FORMAT:
        f.close()
        raise DataError(f"data.path: {path} is not a token corpus (its 'format' attribute is {fmt!r}, "
                        f"expected {FORMAT!r}); make one with: hpcdp data prepare --text <files> --out {path}")
    version = int(f.attrs.get("format_version", 0))
    if version > FORMAT_VERSION:
        f.close()
        raise DataError(f"data.path: {path} has corpus format version {version}; this hpcdp reads "
                        f"up to {FORMAT_VERSION}: upgrade hpcdp or prepare the corpus again")
    kind = f.attrs["tokenizer"]
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    try:
        if kind == "hf":  # a Hugging Face tokenizer.json, stored in the corpus (hpcdp.data.bpe)
            from .bpe import HFTokenizer
            text = f["tokenizer_json"][()]
            tok = HFTokenizer(text.decode() if isinstance(text, bytes) else str(text), f"data.path: {path}")
        else:
            tok = Tokenizer(kind, f["vocab"][()])
    except DataError:
        f.close()
        raise
    if int(f.attrs["vocab_size"]) != tok.vocab_size:
        f.close()
        raise DataError(f"data.path: {path}: vocab_size attribute {int(f.attrs['vocab_size'])} "
                        f"!= {tok.vocab_size} entries in /vocab; prepare the corpus again")
    return f, tok


def tokenizer_mismatch(tok, path, wanted: str) -> str | None:
    """Why the corpus ``path`` (tokenizer ``tok``) was not made with the tokenizer.json
    ``wanted`` (``data.tokenizer``), or None."""
    from .bpe import tokenizer_sha256

    try:
        text = Path(wanted).read_text(encoding="utf-8")
    except OSError as e:
        return f"data.tokenizer: {wanted}: cannot read it ({e.strerror or e})"
    if getattr(tok, "sha256", None) is None:
        return (f"data.tokenizer: {path} was made with the {tok.kind} tokenizer, not {wanted}: prepare it "
                f"with hpcdp data prepare --tokenizer {wanted}")
    if tokenizer_sha256(text) != tok.sha256:
        return (f"data.tokenizer: {path} was made with another tokenizer than {wanted} (sha256 "
                f"{tok.sha256[:12]}... vs {tokenizer_sha256(text)[:12]}...): prepare it again with "
                f"--tokenizer {wanted}, or set data.tokenizer to the one it was made with")
    return None


def load_corpus_dataset(cfg, T: int, comm=None, timeout=None) -> Dataset:
    """Windows of ``T + 1`` tokens of the corpus ``cfg.path``; collective over ``comm`` if given."""
    check_same_files([("data.path", cfg.path)], comm, timeout)
    path = Path(cfg.path)
    f, tok = open_corpus(path)
    wanted = getattr(cfg, "tokenizer", "")
    problem = tokenizer_mismatch(tok, path, wanted) if wanted else None
    if problem:
        f.close()
        raise DataError(problem)
    splits = {}
    for split in ("train", "val"):
        arr = open_h5_dataset(f, f"{split}/tokens", "path", path)
        if arr.ndim != 1 or arr.dtype.kind != "u":
            raise DataError(f"data.path: {path}: /{split}/tokens must be 1-D unsigned ids, "
                            f"found {arr.dtype} {arr.shape}")
        if len(arr) < T + 1:
            what = ("lower model.block_size or prepare a larger corpus" if split == "train" else
                    "lower model.block_size or prepare the corpus with a larger --val-fraction")
            raise DataError(f"model.block_size: the {split} split of {path} holds {len(arr):,} tokens, "
                            f"fewer than one window of block_size + 1 = {T + 1}: {what}")
        splits[split] = arr
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    ids, error = None, None
    try:
        ids = [_max_id(a, rank, size) for a in splits.values()]
    except Exception as e:  # noqa: BLE001 - agreed on: every rank raises it
        error = e
    top = combine_max(ids, comm, timeout, error).max()
    if top >= tok.vocab_size:
        raise DataError(f"data.path: {path} holds token id {top}, outside its vocabulary of "
                        f"{tok.vocab_size}: the file is damaged; prepare it again")
    on_disk = cfg.storage in ("auto", "disk")
    if not on_disk:
        splits = {k: MemoryArray(a.read(slice(None)), a.where) for k, a in splits.items()}
    train = Windows(splits["train"], T, tok.vocab_size)
    val = Windows(splits["val"], T, tok.vocab_size, eval_starts(len(splits["val"]), T, cfg.eval_windows))
    info = {"storage": "disk" if on_disk else "memory", "sampling": "windows", "tokenizer": tok,
            "train_tokens": len(splits["train"]), "val_tokens": len(splits["val"])}
    return Dataset(path.name, "sequence", WindowView(train, 0), WindowView(train, 1),
                   WindowView(val, 0), WindowView(val, 1), tok.vocab_size, info)
