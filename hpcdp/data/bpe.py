"""Subword tokenizers of token corpora: Hugging Face ``tokenizers`` (``tokenizer.json``).

An optional extra (``pip install 'hpcdp[tokenizer]'``): byte and char corpora need
nothing of it. ``hpcdp data prepare --tokenizer tokenizer.json`` encodes a corpus
with one; the corpus stores the tokenizer's JSON itself and its SHA-256, so
``hpcdp sample`` decodes with exactly the tokenizer that made it, and training
refuses a corpus made with another tokenizer than ``data.tokenizer`` (or than the
``tokenizer.json`` of a ``model.init_from`` folder).

``hpcdp data train-tokenizer`` trains one offline (:func:`train_bpe`): GPT-2's
recipe, a byte-level BPE (every byte is in the alphabet, so any UTF-8 text encodes
without unknown tokens and ``decode(encode(text)) == text``), with one special
token, ``<|endoftext|>``, which becomes bos/eos of an exported GPT-2.

The SHA-256 is over the JSON with sorted keys and no whitespace, so the same
tokenizer saved twice hashes the same; it needs no ``tokenizers`` to compute.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .dataset import DataError

END_OF_TEXT = "<|endoftext|>"
INSTALL = "pip install 'hpcdp[tokenizer]' (the Hugging Face tokenizers package)"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"a tokenizer.json tokenizer needs the tokenizers package: {INSTALL}") from None
    return tokenizers


def tokenizer_sha256(json_text: str) -> str:
    """The canonical SHA-256 of a ``tokenizer.json``'s content."""
    try:
        obj = json.loads(json_text)
    except ValueError as e:
        raise DataError(f"tokenizer: not JSON ({e})") from None
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class HFTokenizer:
    """The interface of :class:`hpcdp.data.tokenizer.Tokenizer` (kind ``"hf"``) over a
    ``tokenizers.Tokenizer``; ids are ``[0, vocab_size)``, added tokens included."""

    kind = "hf"

    def __init__(self, json_text: str, where: str = "tokenizer"):
        tk = _tokenizers()
        try:
            self._tok = tk.Tokenizer.from_str(json_text)
        except Exception as e:  # noqa: BLE001 - the library's own error type: one line
            raise DataError(f"{where}: not a Hugging Face tokenizer.json ({e})") from None
        self.json, self.sha256, self.where = json_text, tokenizer_sha256(json_text), where
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        if self.vocab_size < 2:
            raise DataError(f"{where}: the vocabulary has {self.vocab_size} token(s); a corpus needs at least 2")
        self.vocab = np.arange(self.vocab_size, dtype=np.int64)

    @classmethod
    def from_file(cls, path) -> "HFTokenizer":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise DataError(f"--tokenizer {path}: cannot read it ({e.strerror or e}); give byte, char or a "
                            "tokenizer.json (hpcdp data train-tokenizer makes one)") from None
        return cls(text, f"--tokenizer {path}")

    def token_dtype(self) -> np.dtype:
        n = self.vocab_size
        return np.dtype(np.uint8 if n <= 256 else np.uint16 if n <= 65536 else np.uint32)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, where: str = "text") -> np.ndarray:
        with _panic_output_held() as held:
            try:
                ids = self._tok.encode(text, add_special_tokens=False).ids
            except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException, not an Exception
                if type(e).__name__ != "PanicException":
                    raise
                held.drop()  # the panic's own lines on stderr: said in the one line below
                raise DataError(f"{self.where}: the tokenizer failed on {where} ({str(e).strip()}); a "
                                "pre-tokenizer or normalizer regex of this tokenizer.json likely backtracks "
                                "without end on this text: fix the regex or use another tokenizer") from None
        return np.asarray(ids, dtype=self.token_dtype())

    def encode_bytes(self, data: bytes, where: str = "text") -> np.ndarray:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not UTF-8 ({e}); a tokenizer.json tokenizer needs UTF-8 text, "
                            "the byte tokenizer takes any file (--tokenizer byte)") from None
        return self.encode(text, where)

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(f"token id {int(ids.max())} is outside the vocabulary of {self.vocab_size}")
        return self._tok.decode(ids.tolist(), skip_special_tokens=False)


class _panic_output_held:
    """Hold what the tokenizers library writes to the process's stderr (file
    descriptor 2) during one call: written out after it, unless :meth:`drop` (a
    Rust panic prints its message and backtrace there before Python sees it)."""

    def __enter__(self):
        import os
        import sys
        import tempfile

        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self._keep = True
        return self

    def drop(self) -> None:
        self._keep = False

    def __exit__(self, *exc):
        import os

        os.dup2(self._saved, 2)
        os.close(self._saved)
        with self._file as f:
            if self._keep:
                f.seek(0)
                data = f.read()
                if data:
                    os.write(2, data)
        return False


def train_bpe(texts, vocab_size: int, out, *, min_frequency: int = 2) -> HFTokenizer:
    """Train a byte-level BPE tokenizer (GPT-2's recipe) on ``texts`` (an iterable of
    str) and write it to ``out`` (a ``tokenizer.json``; temporary name, then rename)."""
    tk = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise DataError(f"--vocab-size: {vocab_size} is too small; a byte-level BPE needs at least "
                        f"{len(alphabet) + 1} (256 bytes + {END_OF_TEXT})")
    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[END_OF_TEXT], initial_alphabet=alphabet)
    tok.train_from_iterator(texts, trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tok.save(str(tmp))
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return HFTokenizer.from_file(out)


__all__ = ["HFTokenizer", "train_bpe", "tokenizer_sha256", "END_OF_TEXT"]
