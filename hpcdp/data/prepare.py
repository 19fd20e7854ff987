"""``hpcdp data prepare``: text files -> a tokenized HDF5 corpus (the format ``data.kind = "tokens"`` reads).

Format (HDF5, readable with plain h5py; version 1, or 2 with a tokenizer.json)::

    /                 attrs: format = "hpcdp-tokens", format_version = 1, tokenizer ("byte" | "char"),
                             vocab_size, val_fraction, seed, n_files
    /vocab            int64 (vocab_size,): byte value (byte) or code point (char) of each token id
                      (hf: 0 .. vocab_size - 1)
    version 2 (tokenizer = "hf", a Hugging Face tokenizer.json, hpcdp.data.bpe) adds
                      attrs tokenizer_sha256 (of the canonical JSON), tokenizer_source (file name)
    /tokenizer_json   UTF-8 string: the tokenizer.json itself (what decodes the corpus)
    /train/tokens     uint8 | uint16 | uint32 (n,): the training files' tokens, concatenated
    /train/doc_starts int64 (files,): where each file's tokens start in /train/tokens
    /train/doc_names  UTF-8 strings (files,): each file's path, relative to the folder it was found in
    /val/...          the same for the validation split

Token arrays are stored contiguously without filters, so a reader fetches a window
with one ``pread`` (:mod:`.arrays`). Files are read in sorted path order. The split
holds exactly ``val_fraction`` of the tokens (rounded to a token): the files are
shuffled with ``seed`` and taken into validation whole while they fit; the first one
that does not fit is cut in two, its last tokens (as many as are missing) going to
validation and the rest to training, so at most one file is in both splits (a single
file: its last ``val_fraction`` of tokens). Each split keeps sorted path order.

The corpus is written to a temporary file beside ``out`` and renamed into place
at the end: an interrupted run leaves no half-written corpus.
"""

from __future__ import annotations

import fnmatch
import os
import sysconfig
import time
from pathlib import Path

import numpy as np

from .dataset import DataError
from .tokenizer import TOKENIZERS, Tokenizer

FORMAT, FORMAT_VERSION = "hpcdp-tokens", 2  # the newest version read; byte/char corpora are written as 1


def stdlib_dir() -> Path:
    """The Python standard library's source folder: a corpus every machine has."""
    return Path(sysconfig.get_paths()["stdlib"])


def collect_files(texts, pattern: str = "*", exclude=()) -> list[tuple[Path, str]]:
    """(path, name) of every file named in ``texts`` or found under a folder in it.

    Folders are walked recursively for files matching ``pattern``; entries whose
    name matches an ``exclude`` pattern, or starts with ".", are skipped.
    """
    found: dict[Path, str] = {}
    for text in texts:
        root = Path(text)
        if root.is_file():
            found.setdefault(root.resolve(), root.name)
        elif root.is_dir():
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not _skip(d, exclude))
                for name in filenames:
                    if fnmatch.fnmatch(name, pattern) and not _skip(name, exclude):
                        p = Path(dirpath) / name
                        found.setdefault(p.resolve(), p.relative_to(root).as_posix())
        else:
            raise DataError(f"--text: {text!r} is neither a file nor a folder")
    files = sorted(found.items(), key=lambda kv: (kv[1], str(kv[0])))
    if not files:
        raise DataError(f"--text: no files matching {pattern!r} under {', '.join(map(str, texts))}")
    return files


def _skip(name: str, exclude) -> bool:
    return name.startswith(".") or any(fnmatch.fnmatch(name, pat) for pat in exclude)


def split_plan(lengths: list[int], val_fraction: float, seed: int) -> list[tuple[int, int, int, bool]]:
    """``(file, first token, end token, in validation)`` pieces in sorted file order (see
    the module docstring): validation gets exactly ``total - int(total * (1 -
    val_fraction))`` tokens, whole shuffled files while they fit, then the end of one."""
    total = sum(lengths)
    need = total - int(total * (1 - val_fraction)) if val_fraction > 0 else 0
    val_part = [0] * len(lengths)  # tokens of each file's end that go to validation
    for i in np.random.default_rng([seed, 0x7A1]).permutation(len(lengths)):
        if need <= 0:
            break
        val_part[i] = min(lengths[i], need)
        need -= val_part[i]
    pieces = []
    for i, n in enumerate(lengths):
        cut = n - val_part[i]
        if cut > 0:
            pieces.append((i, 0, cut, False))
        if val_part[i]:
            pieces.append((i, cut, n, True))
    return pieces


def prepare_corpus(files: list[tuple[Path, str]], out, tokenizer: str = "byte",
                   val_fraction: float = 0.1, seed: int = 0, log=None) -> dict:
    """Tokenize ``files`` into the corpus ``out`` (see the module docstring); returns a summary."""
    import h5py

    if tokenizer not in TOKENIZERS and not str(tokenizer).endswith(".json"):
        raise DataError(f"--tokenizer: {tokenizer!r} is not allowed; choose one of {', '.join(TOKENIZERS)} "
                        "or a tokenizer.json file")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"--val-fraction: {val_fraction} is out of range; allowed [0, 1)")
    t0 = time.perf_counter()
    out = Path(out)
    # Pass 1: sizes (and the character set for char), so datasets are contiguous and exact.
    encoded = {}  # hf: every file's ids, encoded once
    if tokenizer not in TOKENIZERS:
        from .bpe import HFTokenizer
        tok = HFTokenizer.from_file(tokenizer)
        for i, (p, name) in enumerate(files):
            encoded[i] = tok.encode(_read_utf8(p, name, "a tokenizer.json tokenizer"), name)
        lengths = [len(encoded[i]) for i in range(len(files))]
    elif tokenizer == "byte":
        tok = Tokenizer.byte()
        lengths = [p.stat().st_size for p, _ in files]
    else:
        chars: set[str] = set()
        lengths = []
        for p, name in files:
            text = _read_utf8(p, name)
            chars.update(text)
            lengths.append(len(text))
        if len(chars) < 2:
            raise DataError(f"--text: the files use {len(chars)} distinct character(s); a corpus needs at least 2")
        tok = Tokenizer.char_from_text(chars)
    keep = [i for i, n in enumerate(lengths) if n > 0]
    n_empty = len(files) - len(keep)  # empty files (e.g. __init__.py) hold no tokens: left out
    files, lengths = [files[i] for i in keep], [lengths[i] for i in keep]
    encoded = {j: encoded[i] for j, i in enumerate(keep) if i in encoded}
    if not files:
        raise DataError("--text: every file is empty")
    plan = split_plan(lengths, val_fraction, seed)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs.update({"format": FORMAT, "format_version": 1, "tokenizer": tok.kind,
                            "vocab_size": tok.vocab_size, "val_fraction": float(val_fraction),
                            "seed": int(seed), "n_files": len(files)})
            f.create_dataset("vocab", data=tok.vocab)
            if tok.kind == "hf":
                f.attrs.update({"format_version": 2, "tokenizer_sha256": tok.sha256,
                                "tokenizer_source": Path(tokenizer).name})
                f.create_dataset("tokenizer_json", data=tok.json, dtype=h5py.string_dtype())
            for split, is_val in (("train", False), ("val", True)):
                idx = [(i, lo, hi) for i, lo, hi, v in plan if v == is_val]
                n_tok = sum(hi - lo for _, lo, hi in idx)
                ds = f.create_dataset(f"{split}/tokens", shape=(n_tok,), dtype=tok.token_dtype())
                starts, names, pos = [], [], 0
                for i, lo, hi in idx:
                    path, name = files[i]
                    ids = (encoded[i] if i in encoded else tok.encode_bytes(path.read_bytes(), name)
                           if tokenizer == "byte" else tok.encode(_read_utf8(path, name), name))
                    if len(ids) != lengths[i]:
                        raise DataError(f"--text: {name} changed while it was being read; run again")
                    ids = ids[lo:hi]
                    ds[pos:pos + len(ids)] = ids
                    starts.append(pos)
                    names.append(name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
                    pos += len(ids)
                f.create_dataset(f"{split}/doc_starts", data=np.array(starts, dtype=np.int64))
                f.create_dataset(f"{split}/doc_names", data=np.array(names, dtype=object),
                                 dtype=h5py.string_dtype())
                if log:
                    log(f"{split}: {len(idx)} file(s), {n_tok:,} tokens")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    n_val = sum(hi - lo for _, lo, hi, v in plan if v)
    return {"out": str(out), "files": len(files), "empty_files": n_empty, "tokenizer": tokenizer if tok.kind != "hf" else
            f"{Path(tokenizer).name} (hf)", "vocab_size": tok.vocab_size,
            "train_tokens": sum(lengths) - n_val, "val_tokens": n_val,
            "cut_files": sum(1 for i, lo, _, v in plan if v and lo > 0),
            "seconds": time.perf_counter() - t0}


def _read_utf8(path: Path, name: str, who: str = "the char tokenizer") -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"--text: {name} is not UTF-8 ({e}); {who} needs UTF-8 text, "
                        "the byte tokenizer takes any file (--tokenizer byte)") from None
