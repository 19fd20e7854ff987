"""Tokenizers of token corpora: text <-> integer ids, with the vocabulary stored in the corpus.

- ``byte`` (the default): a token is one byte of the UTF-8 text; id = the byte's
  value, vocabulary 256. Any file round-trips exactly, and every corpus made with
  it has the same vocabulary, so a model config works on any machine's corpus.
- ``char``: a token is one Unicode character; the vocabulary is the sorted set of
  characters the corpus uses (nanoGPT's shakespeare_char). Smaller vocabulary,
  but text outside it cannot be encoded, and files must be UTF-8.

The vocabulary is an int array ``vocab``: entry ``i`` is the byte value (byte) or
the code point (char) of token ``i``.
"""

from __future__ import annotations

import numpy as np

from .dataset import DataError

TOKENIZERS = ("byte", "char")


class Tokenizer:
    def __init__(self, kind: str, vocab: np.ndarray):
        if kind not in TOKENIZERS:
            raise DataError(f"unknown tokenizer {kind!r}; known: {', '.join(TOKENIZERS)}")
        self.kind, self.vocab = kind, np.asarray(vocab, dtype=np.int64)
        if len(self.vocab) < 2 or np.any(np.diff(self.vocab) <= 0):
            raise DataError(f"tokenizer {kind!r}: the vocabulary must be >= 2 increasing entries")

    @classmethod
    def byte(cls) -> "Tokenizer":
        return cls("byte", np.arange(256))

    @classmethod
    def char_from_text(cls, chars: set[str]) -> "Tokenizer":
        return cls("char", np.array(sorted(ord(c) for c in chars), dtype=np.int64))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_dtype(self) -> np.dtype:
        """The smallest unsigned dtype that holds every id."""
        n = self.vocab_size
        return np.dtype(np.uint8 if n <= 256 else np.uint16 if n <= 65536 else np.uint32)

    def encode_bytes(self, data: bytes, where: str = "text") -> np.ndarray:
        """Token ids of a file's bytes (char: decoded as UTF-8)."""
        if self.kind == "byte":
            return np.frombuffer(data, dtype=np.uint8).astype(self.token_dtype())
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not UTF-8 ({e}); the char tokenizer needs UTF-8 text, "
                            "the byte tokenizer takes any file (--tokenizer byte)") from None
        return self.encode(text, where)

    def encode(self, text: str, where: str = "text") -> np.ndarray:
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(self.token_dtype())
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.minimum(np.searchsorted(self.vocab, points), self.vocab_size - 1)
        unknown = self.vocab[ids] != points
        if unknown.any():
            c = chr(int(points[np.argmax(unknown)]))
            raise DataError(f"{where}: character {c!r} is not in the corpus vocabulary "
                            f"of {self.vocab_size} characters (char tokenizer)")
        return ids.astype(self.token_dtype())

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(f"token id {int(ids.max())} is outside the vocabulary of {self.vocab_size}")
        if self.kind == "byte":
            return bytes(self.vocab[ids].astype(np.uint8)).decode("utf-8", errors="replace")
        return "".join(chr(c) for c in self.vocab[ids])
