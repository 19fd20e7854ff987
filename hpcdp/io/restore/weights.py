"""A checkpoint's weights in one process, for using a model (sampling), not training.

:func:`model_from_checkpoint` rebuilds the model from the config stored in the
checkpoint (``--set`` overrides on top), allocates its parameter buffer only (no
gradients, no optimizer state) and fills it from the checkpoint's ``param/*``
tensors, whatever rank count, strategy (ddp, ps, ZeRO 1-3) and layout wrote them:
the stored pieces are logical tensor ranges, and one reader assembles them all
(checksums checked block by block). The optimizer state is never read. Cost: one
read of the weights' bytes; memory: the weights once.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import EARLIER, CheckpointError


def checkpoint_config(ckpt_dir, overrides=()):
    """The resolved config a checkpoint was written with, ``overrides`` applied."""
    from hpcdp.config import apply_overrides, config_from_dict

    from ..format.index import read_index

    from hpcdp.config_error import ConfigError

    text = read_index(ckpt_dir).attrs.get("config", "")
    try:
        raw = tomllib.loads(str(text))
    except tomllib.TOMLDecodeError as e:
        raise CheckpointError(f"checkpoint {ckpt_dir}: its stored config is not valid TOML ({e})") from None
    try:
        return config_from_dict(apply_overrides(raw, overrides))
    except ConfigError:
        try:  # the stored config as written: its errors are the checkpoint's, not the --set's
            config_from_dict(raw)
        except ConfigError as e:
            raise CheckpointError(f"checkpoint {ckpt_dir}: its stored config: {e}: the index is damaged or was "
                                  f"edited, or an older hpcdp wrote it; {EARLIER}") from None
        raise


def load_weights(ckpt_dir, model) -> int:
    """Fill ``model``'s full parameter buffer from the checkpoint (the model must have
    the checkpoint's tensors, shapes and dtype, else a CheckpointError naming the
    tensor). Returns the step the checkpoint was written at."""
    from ..format.names import PARAM
    from .load import load
    from ..protocol import Piece
    from ..format.runstate import expected_tensors

    flat = model.flat
    # optimizer None: the parameters only, whatever optimizer state the checkpoint holds
    index, _ = load(Path(ckpt_dir), [Piece(PARAM, 0, flat.data)], flat.layout, expected_tensors(flat, None),
                    None, None, backend=flat.backend)
    return index.step


def model_from_checkpoint(target: str, overrides=(), *, latest_root=None, device: str = "cpu",
                          kinds=None):
    """``(checkpoint path, config, model)`` for ``--resume target`` (a step-* dir, a
    folder of them, a run dir, or "latest" in ``latest_root``), the model in eval
    mode on ``device``. ``kinds``: the model kinds the caller can use (others: an
    error naming model.kind)."""
    from hpcdp.backend import get_backend
    from hpcdp.config_error import ConfigError
    from hpcdp.nn import build_model

    from ..format.commit import resolve

    path = resolve(target, latest_root, if_none="point --resume at a complete step-* checkpoint (hpcdp ckpt "
                   "ls lists them), or let training save one (checkpoint.every, checkpoint.final)")
    cfg = checkpoint_config(path, overrides)
    if kinds is not None and cfg.model.kind not in kinds:
        raise CheckpointError(f"checkpoint {path} holds a model.kind = {cfg.model.kind!r} model; this command "
                              f"needs {' or '.join(repr(k) for k in kinds)} (e.g. a GPT: model.kind = \"gpt\")")
    try:
        get_backend(device)
    except (RuntimeError, ImportError) as e:  # e.g. no GPU here
        raise ConfigError(f"--device {device}: {e}") from None
    model = build_model(cfg.model, dtype=cfg.run.dtype, device=device, storage=())  # nothing allocated yet
    check_model_size(path, cfg, model.flat, device)
    model.flat.materialize(("data",))
    load_weights(path, model)
    model.eval()
    return path, cfg, model


def check_model_size(path, cfg, flat, device: str) -> None:
    """Before the model's buffer is allocated: the model its stored config describes
    holds no more parameters than the checkpoint's weights (the index is bounded by the
    files on disk, hpcdp.io.format.index.check_sizes), and on a CPU its weights fit in
    this node's available memory (hpcdp.memcheck), so an altered config cannot make
    ``hpcdp sample`` allocate what the files do not hold."""
    from hpcdp.memcheck import check_alloc

    from ..errors import EARLIER
    from ..format.index import read_index
    from ..format.names import PARAM

    index = read_index(path)
    stored = sum(index.numel(t) for t, name in enumerate(index.tensors) if name.startswith(PARAM + "/"))
    if flat.numel > stored:
        raise CheckpointError(f"checkpoint {path}: its stored config describes a model.kind = {cfg.model.kind!r} "
                              f"model of {flat.numel} parameters, but the checkpoint holds {stored} weights: "
                              f"the config does not match the weights (damaged or altered, or a --set of a "
                              f"model size); {EARLIER}")
    if device == "cpu":
        check_alloc(flat.nbytes, f"checkpoint {path}: the model's weights ({flat.numel} parameters, "
                    f"{cfg.run.dtype})")


__all__ = ["checkpoint_config", "load_weights", "model_from_checkpoint", "check_model_size"]
