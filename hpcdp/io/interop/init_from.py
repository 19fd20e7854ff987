"""``model.init_from = "PATH"``: start training from weights made elsewhere.

PATH is either

- a Hugging Face GPT-2 folder (``config.json`` + ``model.safetensors``, or a sharded
  ``model.safetensors.index.json``): what ``GPT2LMHeadModel.save_pretrained`` and
  ``hpcdp ckpt export --format hf-gpt2`` write (the layout: :mod:`hpcdp.io.interop.hf_gpt2`);
- an hpcdp ``.safetensors`` file (``hpcdp ckpt export --format safetensors``).

Before any weight is read the source is checked against the ``[model]`` section:
``config.json`` (or the config in the file's metadata) key by key, then every
tensor's name and shape; the first mismatch is the error, naming the key or tensor
and what to set. A ``tokenizer.json`` beside the weights must be the corpus's
tokenizer (``data.kind = "tokens"``): the embedding rows mean its tokens.

The weights are filled through the checkpoint protocol's targets
(:mod:`hpcdp.io.protocol`), exactly as a restore fills them: a replica (none, ddp,
ZeRO 1-2, the parameter server's workers) reads every tensor, a ZeRO-3 rank only the
element ranges of its shard (safetensors slices of the rows those ranges touch; a
transposed head is read whole). The optimizer state starts fresh, the step at 0.
Dtypes F16, F32 and F64 are converted to ``run.dtype``. Every rank agrees on the
outcome, so one rank's error stops all of them with its message.

A folder is read as a hostile one could make it (:mod:`hpcdp.io.interop.folder`):
only regular files inside it (no index entry with ``..`` or an absolute path, no link
out of it, no FIFO or device, each checked on the opened file), and its JSON files
with strict types (``config.json``'s sizes are positive integers, its flags true or
false: :func:`hpcdp.io.interop.hf_gpt2.config_type_problem`; an hpcdp file's stored
config is checked as a config file is). Every value read must be finite and fit
``run.dtype`` (a NaN would stop the run at step 1 or be trained on and saved; a
float64 1e300 would become inf in float32): refused by file and tensor name. The
reads run under the setup timeout (``comm.setup_timeout``).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import numpy as np

from ..errors import CheckpointError

WEIGHTS, SHARDED_INDEX, CONFIG, TOKENIZER = ("model.safetensors", "model.safetensors.index.json",
                                             "config.json", "tokenizer.json")
# the [model] keys an hpcdp safetensors file's stored config must agree on, per model.kind
MODEL_KEYS = {"gpt": ("kind", "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "tied_head", "gelu"),
              "mlp": ("kind", "sizes", "activation", "gelu")}


class Source:
    """The tensors of a safetensors file or Hugging Face folder, under hpcdp's names:
    ``tensors[name] = (file, key in the file, transposed)``."""

    def __init__(self, path: Path, kind: str, tensors: dict, config_problem=None, tokenizer_json=None):
        self.path, self.kind, self.tensors = path, kind, tensors
        self.config_problem = config_problem  # (model_cfg) -> str | None
        self.tokenizer_json = tokenizer_json
        self._open: dict = {}
        self._whole: dict = {}

    def _file(self, file: Path):
        from .folder import open_safetensors

        if file not in self._open:
            self._open[file] = open_safetensors(file)
        return self._open[file]

    def _slice(self, name: str):
        file, key, _ = self.tensors[name]
        try:
            return self._file(file).get_slice(key)
        except CheckpointError:
            raise
        except Exception:  # noqa: BLE001 - the index names a file that does not hold the tensor
            raise CheckpointError(f"model.init_from: {file}: tensor {key} is not in it, though "
                                  f"{SHARDED_INDEX} says so: the folder is damaged; use another copy of "
                                  "the model") from None

    def shape(self, name: str) -> tuple:
        _, _, t = self.tensors[name]
        shape = tuple(self._slice(name).get_shape())
        return shape[::-1] if t else shape

    def read(self, name: str, offset: int, out: np.ndarray) -> None:
        """Elements ``[offset, offset + out.size)`` of tensor ``name`` (hpcdp's shape,
        C order) into ``out``, converted to its dtype; non-finite values, or values
        beyond the range of ``out``'s dtype, are refused (:func:`check_values`)."""
        file, key, transposed = self.tensors[name]
        n = out.size
        if transposed:  # read whole once: its flat ranges are strided in the file
            if name not in self._whole:
                whole = self._file(file).get_tensor(key)
                check_values(whole, out.dtype, file, key, 0)
                self._whole[name] = np.ascontiguousarray(whole.T).reshape(-1)
            out[:] = self._whole[name][offset:offset + n]
            return
        sl = self._slice(name)
        shape = sl.get_shape()
        row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        r0, r1 = offset // row, -(-(offset + n) // row)
        rows = np.asarray(sl[r0:r1]).reshape(-1)
        values = rows[offset - r0 * row:offset - r0 * row + n]
        check_values(values, out.dtype, file, key, offset)
        out[:] = values

    def dtype_problem(self) -> str | None:
        for name, (file, key, _) in self.tensors.items():
            d = self._slice(name).get_dtype()
            if d not in ("F16", "F32", "F64"):
                return f"tensor {key} is {d}; hpcdp reads F16, F32 and F64 (save the model in float32)"
        return None

    def close(self) -> None:
        self._open.clear()
        self._whole.clear()


def check_values(values: np.ndarray, dtype, file, key: str, offset: int) -> None:
    """Imported weights must be finite and fit ``dtype`` (run.dtype): a NaN or Inf
    would stop the run at its first step (or, skipped, be saved as the weights), and a
    float64 value beyond float32's range would become Inf on conversion."""
    if values.dtype.kind != "f" or values.size == 0:
        return
    bad = ~np.isfinite(values)
    if bad.any():
        at = np.flatnonzero(bad)
        raise CheckpointError(f"model.init_from: {file}: tensor {key} holds {at.size:,} non-finite value(s) "
                              f"({values.flat[at[0]]} at element {offset + int(at[0]):,}): these weights are "
                              "broken (a diverged or damaged model) and cannot train; use other weights")
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and dtype.itemsize < values.dtype.itemsize:
        big = np.abs(values) > np.finfo(dtype).max
        if big.any():
            at = np.flatnonzero(big)
            raise CheckpointError(
                f"model.init_from: {file}: tensor {key} holds {at.size:,} value(s) beyond {dtype.name}'s range "
                f"({values.flat[at[0]]:g} at element {offset + int(at[0]):,}): they would become inf in "
                f"run.dtype = \"{dtype.name}\"; set run.dtype = \"{values.dtype.name}\" or use other weights")


def _keys_of(file: Path) -> list[str]:
    from .folder import open_safetensors

    with open_safetensors(file) as f:
        return list(f.keys())


def _metadata_of(file: Path) -> dict:
    from .folder import open_safetensors

    with open_safetensors(file) as f:
        return f.metadata() or {}


def weight_files(path: Path) -> dict:
    """``{key: shard file}`` of a sharded folder's ``model.safetensors.index.json``:
    an object whose ``weight_map`` maps each key to a file name inside the folder."""
    from .folder import inside, read_json

    where = path / SHARDED_INDEX
    index = read_json(where)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        found = ("no weight_map" if isinstance(index, dict) and "weight_map" not in index else
                 f"weight_map is {json.dumps(index.get('weight_map'))[:60]}" if isinstance(index, dict) else
                 f"a JSON {type(index).__name__}")
        raise CheckpointError(f"model.init_from: {where}: expected a JSON object whose weight_map maps each "
                              f"tensor to its file, found {found}: the file is damaged; use another copy of "
                              "the model")
    return {key: inside(path, f, f"{SHARDED_INDEX}'s file of {key}") for key, f in index["weight_map"].items()}


def open_hf_folder(path: Path) -> Source:
    from .folder import check_file, read_json, read_regular
    from .hf_gpt2 import config_mismatch, config_type_problem, hpcdp_name, transposed

    config = check_file(path, CONFIG)
    conf = read_json(config)
    problem = config_type_problem(conf)
    if problem:
        raise CheckpointError(f"model.init_from: {config}: {problem}: the file is damaged or not a GPT-2 "
                              "config.json (transformers writes these types): fix it, or save the model again "
                              "(save_pretrained)")
    if check_file(path, SHARDED_INDEX):
        files = weight_files(path)
    elif check_file(path, WEIGHTS):
        weights = check_file(path, WEIGHTS)
        files = {key: weights for key in _keys_of(weights)}
    else:
        bins = sorted(p.name for p in path.glob("*.bin"))
        raise CheckpointError(f"model.init_from: {path} has no {WEIGHTS}" + (
            f" (only {', '.join(bins)}: hpcdp reads no pickle files; re-save it with transformers' "
            "save_pretrained, which writes safetensors)" if bins else ""))
    tensors = {}
    tied = conf.get("tie_word_embeddings", True)
    for key, file in files.items():
        name = hpcdp_name(key)
        if name is not None and not (tied and name == "lm_head.weight"):  # a tied head is wte itself
            tensors[name] = (file, key, transposed(name))
    tok = check_file(path, TOKENIZER)
    tokenizer_json = None
    if tok is not None:
        try:
            tokenizer_json = read_regular(tok).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"model.init_from: {tok}: not a readable tokenizer.json ({e})") from None
        check_tokenizer_fits(path, tok, tokenizer_json, conf)
    return Source(path, "hf-gpt2", tensors,
                  config_problem=lambda m: config_mismatch(conf, m) if m.kind == "gpt" else
                  "a GPT-2 folder needs model.kind = \"gpt\"",
                  tokenizer_json=tokenizer_json)


def tokenizer_size(tokenizer_json: str) -> int:
    """Tokens of a tokenizer.json: its largest id (the model's vocabulary and the added
    tokens) + 1, read as JSON (no tokenizers package needed)."""
    data = json.loads(tokenizer_json)
    vocab = (data.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [t.get("id", -1) for t in data.get("added_tokens") or []]
    return max((int(i) for i in ids if isinstance(i, int)), default=-1) + 1


def check_tokenizer_fits(path: Path, tok: Path, text: str, conf: dict) -> None:
    """A tokenizer.json with more tokens than config.json's vocab_size is not this
    model's (an earlier model's, left in the folder): refuse it. Fewer is allowed: a
    vocabulary padded past the tokenizer's (GPT-2's 50257 tokens in 50304 rows)."""
    try:
        n = tokenizer_size(text)
    except (ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(f"model.init_from: {tok}: not a readable tokenizer.json ({e})") from None
    v = conf.get("vocab_size")
    if isinstance(v, int) and n > v:
        raise CheckpointError(f"model.init_from: {path}: its {TOKENIZER} has {n} tokens, more than config.json's "
                              f"vocab_size {v}: it is not this model's tokenizer (an earlier model's file left in "
                              "the folder?); remove it, or export the model again into a new folder")


def stored_model(path: Path, meta: dict) -> dict | None:
    """The ``[model]`` keys of an hpcdp file's stored config (metadata
    ``hpcdp_config``, the resolved TOML of the export), checked as a config file's
    (types, ranges); None when the file has none (another tool's file)."""
    from hpcdp.config import ModelConfig, section_from_dict
    from hpcdp.config_error import ConfigError

    text = meta.get("hpcdp_config")
    if not text:
        return None
    where = f"model.init_from: {path}: the config in its metadata (hpcdp_config)"
    again = "the file is damaged or was edited; export it again (hpcdp ckpt export CKPT OUT.safetensors)"
    try:
        model = tomllib.loads(text).get("model", {})
    except tomllib.TOMLDecodeError as e:
        raise CheckpointError(f"{where} is not valid TOML ({e}): {again}") from None
    if not isinstance(model, dict):
        raise CheckpointError(f"{where}: model is {model!r}, not a table: {again}")
    keys = {k for keys in MODEL_KEYS.values() for k in keys}
    table = {k: v for k, v in model.items() if k in keys}
    try:
        section_from_dict(ModelConfig, table)
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}: {again}") from None
    return table


def open_hpcdp_file(path: Path) -> Source:
    keys = _keys_of(path)
    stored = stored_model(path, _metadata_of(path))

    def problem(m):
        if stored is None:
            return None  # no stored config (another tool's file): names and shapes decide
        for key in MODEL_KEYS[m.kind]:
            if key in stored and stored[key] != getattr(m, key, None):
                if key == "gelu" and m.kind == "mlp" and m.activation != "gelu":
                    continue
                return (f"model.{key} is {stored[key]!r} in the file's config, {getattr(m, key, None)!r} here: "
                        f"set model.{key} = {json.dumps(stored[key])}")
        return None

    return Source(path, "safetensors", {k: (path, k, False) for k in keys}, config_problem=problem)


def open_source(path) -> Source:
    from .folder import check_file, not_regular

    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(f"model.init_from: {path}: no such file or folder") from None
    except OSError as e:
        raise CheckpointError(f"model.init_from: {path}: cannot read it ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        if check_file(path, CONFIG) is None:
            raise CheckpointError(f"model.init_from: {path} is a folder without {CONFIG}: give a Hugging Face "
                                  "GPT-2 folder (save_pretrained, hpcdp ckpt export --format hf-gpt2) or a "
                                  ".safetensors file")
        return open_hf_folder(path)
    if stat.S_ISREG(mode):
        return open_hpcdp_file(path)
    raise not_regular(path, mode)


def mismatch(source: Source, model_cfg, layout) -> str | None:
    """The first difference between ``source`` and the model (config, then tensors)."""
    problem = source.config_problem(model_cfg) if source.config_problem else None
    if problem:
        return problem
    want = {s.name: tuple(s.shape) for s in layout}
    for name in want:
        if name not in source.tensors:
            hint = " (model.tied_head = false expects an untied head)" if name == "lm_head.weight" else ""
            return f"tensor {name} of this model is not in it{hint}"
    for name in source.tensors:
        if name not in want:
            hint = " (set model.tied_head = false)" if name == "lm_head.weight" else ""
            return f"tensor {name} is in it but not in this model{hint}"
    for name, shape in want.items():
        have = source.shape(name)
        if have != shape:
            return f"tensor {name} has shape {have} there, {shape} in this model"
    return source.dtype_problem()


def tokenizer_problem(source: Source, corpus_tokenizer) -> str | None:
    """Why the source's tokenizer.json does not go with the corpus, or None."""
    if source.tokenizer_json is None or corpus_tokenizer is None:
        return None
    from hpcdp.data.bpe import tokenizer_sha256

    mine = getattr(corpus_tokenizer, "sha256", None)
    if mine is None:
        return (f"it has a {TOKENIZER}, but data.path was made with the {corpus_tokenizer.kind} tokenizer: "
                f"prepare the corpus with --tokenizer {source.path / TOKENIZER} (or remove the file if the "
                "mismatch is meant)")
    if tokenizer_sha256(source.tokenizer_json) != mine:
        return (f"its {TOKENIZER} is not the tokenizer data.path was made with: prepare the corpus with "
                f"--tokenizer {source.path / TOKENIZER}")
    return None


def init_from(path, strategy, flat, model_cfg, comm, *, corpus_tokenizer=None, timeout: float = 300.0) -> str:
    """Fill the parameters this rank holds (``strategy.checkpoint_targets()``) from
    ``path``; collective over ``comm`` (None: one process). Returns one line for the log."""
    from ..errors import AGREEMENT
    from ..format.names import PARAM
    from ..format.ranges import split_by_layout

    def run():
        source = open_source(path)
        try:
            problem = mismatch(source, model_cfg, flat.layout) or tokenizer_problem(source, corpus_tokenizer)
            if problem:
                raise CheckpointError(f"model.init_from: {path}: {problem}")
            read = 0
            for piece in strategy.checkpoint_targets():
                if piece.buffer != PARAM:
                    continue  # optimizer state: fresh
                on_host = isinstance(piece.array, np.ndarray)
                host = piece.array if on_host else np.empty(piece.size, dtype=np.dtype(piece.array.dtype))
                for name, span, pos in split_by_layout(flat.layout, piece.offset, piece.size):
                    source.read(name, span.offset, host[pos:pos + span.size])
                    read += span.size
                if not on_host:
                    flat.backend.copy_(piece.array, flat.backend.asarray(host, host.dtype.name))
            return source.kind, read
        finally:
            source.close()

    def bounded():
        if comm is None:
            return run()
        from hpcdp.failure.deadline import watchdog

        # a file that blocks past the setup timeout (a hung file system) ends the job with
        # one line, as the other ranks' agreement would time out on this one anyway
        with watchdog(timeout, f"model.init_from: reading {path}"):
            return run()

    kind, read = AGREEMENT.all_ok(comm, bounded, timeout=timeout)
    strategy.checkpoint_restored()
    return (f"model.init_from: {path} ({kind}): {read:,} of {flat.numel:,} parameters read on this rank; "
            "optimizer state fresh")


__all__ = ["init_from", "open_source", "mismatch", "tokenizer_problem", "Source"]
