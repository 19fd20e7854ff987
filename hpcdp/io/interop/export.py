"""``hpcdp ckpt export CKPT OUT --format ...``: a checkpoint's weights for other tools.

Formats (one process; the weights are read as ``hpcdp sample --resume`` reads them,
whatever rank count, strategy and layout wrote the checkpoint, checksums checked):

- ``h5`` / ``npz``: hpcdp's names, one plain file (:func:`hpcdp.io.interop.inspect.export`).
- ``safetensors``: hpcdp's names (``wte.weight``, ``h.0.attn.c_attn.weight``...) in one
  ``.safetensors`` file; its metadata holds ``format = "hpcdp"``, the step and the
  resolved config (TOML). ``model.init_from`` reads it back.
- ``hf-gpt2``: a folder that ``transformers.GPT2LMHeadModel.from_pretrained`` loads:
  ``config.json`` + ``model.safetensors`` in GPT2LMHeadModel's layout
  (:mod:`hpcdp.io.interop.hf_gpt2`), and ``tokenizer.json`` when the run's corpus was made
  with a Hugging Face tokenizer (with a ``tokenizer_config.json``, so that
  ``AutoTokenizer.from_pretrained(folder)`` loads it). ``model.init_from`` reads it back.

Written with the ``safetensors`` package's NumPy API: no PyTorch needed. Each file is
written under a temporary name and renamed into place, so an interrupted export
leaves no half-written file. The ``hf-gpt2`` folder is written whole: into a
temporary folder beside it, renamed into place when complete. Its target must be
new, empty, or an earlier export (recognised by the ``hpcdp_export`` key in its
``model.safetensors`` metadata and nothing but the files an export writes), which it
replaces entirely, so no file of an earlier model (a ``tokenizer.json``) stays
beside a new one; any other folder is refused unless ``force``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import CheckpointError

FORMATS = ("h5", "npz", "safetensors", "hf-gpt2")
HPCDP_FORMAT = "hpcdp"  # the safetensors metadata "format" of hpcdp-named files
EXPORT_MARK = "hpcdp_export"  # model.safetensors metadata key of an hf-gpt2 export (its step)
EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def format_of(out, fmt: str | None) -> str:
    """The export format: ``fmt``, or the one ``out``'s suffix names."""
    if fmt:
        if fmt not in FORMATS:
            raise CheckpointError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
        return fmt
    suffix = Path(out).suffix
    by_suffix = {".h5": "h5", ".hdf5": "h5", ".npz": "npz", ".safetensors": "safetensors"}
    if suffix not in by_suffix:
        raise CheckpointError(f"export: cannot tell the format from {out!r}: end it in .h5, .npz or "
                              ".safetensors, or give --format hf-gpt2 (a folder for transformers)")
    return by_suffix[suffix]


def read_weights(ckpt_dir) -> tuple[dict, object]:
    """``({hpcdp parameter name: array}, index)`` of a checkpoint, in layout order."""
    from ..format.names import PARAM
    from ..format.index import read_index
    from .inspect import read_tensor
    from ..restore.reader import Reader

    index = read_index(ckpt_dir)
    with Reader(Path(ckpt_dir), index) as reader:
        arrays = {n[len(PARAM) + 1:]: read_tensor(reader, index, tid) for tid, n in enumerate(index.tensors)
                  if n.startswith(PARAM + "/")}
    return arrays, index


def _replace_into(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # a plain file's mode (safetensors creates it 0600)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_safetensors(arrays: dict, path: Path, metadata: dict) -> None:
    from safetensors.numpy import save_file

    data = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    _replace_into(Path(path), lambda tmp: save_file(data, str(tmp), metadata=metadata))


def export_safetensors(ckpt_dir, out) -> int:
    arrays, index = read_weights(ckpt_dir)
    save_safetensors(arrays, Path(out), {"format": HPCDP_FORMAT, "step": str(index.step),
                                         "hpcdp_config": str(index.attrs.get("config", ""))})
    return len(arrays)


def corpus_tokenizer(cfg):
    """``(tokenizer, why not)``: the Hugging Face tokenizer of the run's corpus
    (``data.kind = "tokens"`` made with ``--tokenizer FILE``), or None and the reason."""
    if cfg.data.kind != "tokens":
        return None, "the run's data is not a token corpus"
    if not Path(cfg.data.path).is_file():
        return None, f"the run's corpus data.path = {cfg.data.path!r} is not here"
    from hpcdp.data.corpus import open_corpus

    f, tok = open_corpus(Path(cfg.data.path))
    f.close()
    return (tok, "") if tok.kind == "hf" else (None, f"the corpus's tokenizer is {tok.kind}")


def hf_arrays(arrays: dict, tied: bool) -> dict:
    """hpcdp-named weights -> GPT2LMHeadModel's state dict (no head when tied)."""
    from .hf_gpt2 import hf_name, transposed

    out = {}
    for name, arr in arrays.items():
        out[hf_name(name)] = np.ascontiguousarray(arr.T if transposed(name) else arr)
    if not tied and "lm_head.weight" not in out:
        raise CheckpointError("export: model.tied_head is false but the checkpoint has no lm_head.weight")
    return out


def earlier_export(folder: Path) -> bool:
    """Whether ``folder`` holds an hf-gpt2 export of hpcdp's and nothing else."""
    names = {p.name for p in folder.iterdir()}
    if not names or not names <= set(EXPORT_FILES) or "model.safetensors" not in names:
        return False
    from .folder import open_safetensors

    try:  # a regular file only, opened without blocking: a FIFO of that name is not ours
        with open_safetensors(folder / "model.safetensors") as f:
            return EXPORT_MARK in (f.metadata() or {})
    except Exception:  # noqa: BLE001 - not a readable safetensors file: not ours
        return False


def check_export_target(out: Path, force: bool) -> None:
    """An hf-gpt2 export replaces ``out`` whole: refuse a file, and a folder that holds
    anything but an earlier export, unless ``force``."""
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"export --format hf-gpt2: {out} is a file; give a folder (it is created)")
    if force or not out.exists() or not any(out.iterdir()) or earlier_export(out):
        return
    found = sorted(p.name for p in out.iterdir())
    raise CheckpointError(f"export --format hf-gpt2: {out} is a folder that is not an earlier export "
                          f"(it holds {', '.join(found[:5])}{', ...' if len(found) > 5 else ''}); the export "
                          "replaces the whole folder: give a new or empty one, or add --force to replace it")


def write_folder_whole(out: Path, fill) -> None:
    """``fill(tmp)`` writes the folder's files into a temporary folder beside ``out``,
    which then replaces ``out`` (and whatever it held): an interrupted export leaves
    the earlier folder (or none), never a mix."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        tmp.chmod(0o755)
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def export_hf_gpt2(ckpt_dir, out, *, force: bool = False) -> tuple[int, str]:
    """Write the GPT2LMHeadModel folder ``out`` whole (it must be new, empty or an
    earlier export, unless ``force``); returns (tensors, a note on the tokenizer)."""
    from .hf_gpt2 import END_OF_TEXT, hf_config
    from ..restore.weights import checkpoint_config

    out = Path(out)
    check_export_target(out, force)
    cfg = checkpoint_config(ckpt_dir)
    if cfg.model.kind != "gpt":
        raise CheckpointError(f"export --format hf-gpt2: checkpoint {ckpt_dir} holds a model.kind = "
                              f"{cfg.model.kind!r} model; only a GPT has a GPT-2 layout (use --format safetensors)")
    arrays, index = read_weights(ckpt_dir)
    tok, why = corpus_tokenizer(cfg)
    eot = tok.token_id(END_OF_TEXT) if tok is not None else None
    if eot is not None and eot >= cfg.model.vocab_size:
        eot = None
    dtype = np.dtype(next(iter(arrays.values())).dtype).name
    conf = hf_config(cfg.model, dtype=dtype, end_of_text=eot)  # no end-of-text token: bos/eos null

    def fill(folder: Path) -> None:
        # transformers refuses safetensors files without format "pt" in their metadata
        save_safetensors(hf_arrays(arrays, cfg.model.tied_head), folder / "model.safetensors",
                         {"format": "pt", EXPORT_MARK: str(index.step)})
        if tok is not None:
            (folder / "tokenizer.json").write_text(tok.json, encoding="utf-8")
            # so that AutoTokenizer.from_pretrained(out) takes tokenizer.json as it is
            special = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT} if eot is not None else {}
            tconf = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.model.block_size,
                     "clean_up_tokenization_spaces": False, **special}
            (folder / "tokenizer_config.json").write_text(json.dumps(tconf, indent=2) + "\n")
        (folder / "config.json").write_text(json.dumps(conf, indent=2) + "\n")

    write_folder_whole(out, fill)
    note = ("tokenizer.json from the corpus" + (f", bos/eos id {eot}" if eot is not None else "")
            if tok is not None else f"no tokenizer.json ({why}), bos/eos ids null")
    return len(arrays), note


def checkpoint_of(path) -> Path:
    """The checkpoint ``path`` names: a step-* directory itself, else the newest
    complete one in a folder of them (or a run directory's ``checkpoints/``)."""
    from ..format.commit import marker_problem
    from .inspect import checkpoints_in

    found = checkpoints_in(path)
    done = [p for p in found if marker_problem(p) is None]
    if not done:
        raise CheckpointError(f"{path}: {marker_problem(found[-1])}" if len(found) == 1 else
                              f"{path}: no complete checkpoint ({len(found)} incomplete)")
    return done[-1]


def export_any(ckpt_dir, out, fmt: str | None = None, *, optimizer: bool = False, force: bool = False) -> str:
    """Export in ``fmt`` (or the one ``out``'s suffix names) from ``ckpt_dir`` (a
    checkpoint, or a folder of them: its newest complete one); returns one line
    saying what was written. ``force``: hf-gpt2 replaces a folder that is not an
    earlier export."""
    fmt = format_of(out, fmt)
    if force and fmt != "hf-gpt2":
        raise CheckpointError(f"--force: only --format hf-gpt2 replaces a folder; a {fmt} file is replaced "
                              "anyway (written under a temporary name, then renamed)")
    ckpt_dir = checkpoint_of(ckpt_dir)
    if optimizer and fmt not in ("h5", "npz"):
        raise CheckpointError(f"--optimizer: the {fmt} export holds weights only; use an .h5 or .npz file")
    if fmt in ("h5", "npz"):
        from .inspect import export

        suffixes = (".h5", ".hdf5") if fmt == "h5" else (".npz",)
        if Path(out).suffix not in suffixes:
            raise CheckpointError(f"export: {out} must end in {' or '.join(suffixes)} for --format {fmt}")
        return f"wrote {export(ckpt_dir, out, optimizer=optimizer)} tensors to {out}"
    if fmt == "safetensors":
        return f"wrote {export_safetensors(ckpt_dir, out)} tensors to {out} (safetensors, hpcdp names)"
    n, note = export_hf_gpt2(ckpt_dir, out, force=force)
    return (f"wrote {n} tensors to {out}/model.safetensors, config.json, {note}: load it with "
            f"transformers.GPT2LMHeadModel.from_pretrained({str(out)!r})")


__all__ = ["FORMATS", "HPCDP_FORMAT", "EXPORT_MARK", "earlier_export", "format_of", "checkpoint_of", "export_any",
           "export_safetensors", "export_hf_gpt2", "read_weights", "save_safetensors", "write_folder_whole"]
