"""Helpers of the checkpoint tests under pytest-mpi: a folder every rank sees, groups
of the first N ranks, small configs, and a run's parts built the way train.py builds
them (to look at buffers right after a restore)."""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcdp.config import config_from_dict
from hpcdp.world import World


def shared_dir(comm=MPI.COMM_WORLD) -> Path:
    """One new temporary folder, the same path on every rank (rank 0 makes it)."""
    raw = tempfile.mkdtemp(prefix="hpcdp-ckpt-").encode() if comm.Get_rank() == 0 else b""
    n = np.array([len(raw)], dtype=np.int64)
    comm.Bcast(n, root=0)
    buf = np.frombuffer(raw, dtype=np.uint8).copy() if comm.Get_rank() == 0 else np.empty(n[0], np.uint8)
    comm.Bcast(buf, root=0)
    return Path(buf.tobytes().decode())


def remove(path: Path, comm=MPI.COMM_WORLD) -> None:
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def group(n: int, comm=MPI.COMM_WORLD):
    """A World of the first ``n`` ranks (None on the others). Collective."""
    inside = comm.Get_rank() < n
    sub = comm.Split(0 if inside else MPI.UNDEFINED, comm.Get_rank())
    return World.from_mpi(sub) if inside else None


STRATEGIES = {
    "none": {"strategy": "none"},
    "ddp": {"strategy": "ddp", "ddp": {"bucket_mb": 0.002}},
    "ps": {"strategy": "ps", "ps": {"servers": 2, "mode": "sync"}},
    "ps1": {"strategy": "ps", "ps": {"servers": 1, "mode": "sync"}},
    "ps_worker": {"strategy": "ps", "ps": {"servers": 2, "update": "worker"}},
    "ps_async": {"strategy": "ps", "ps": {"servers": 2, "mode": "async", "staleness": 0}},
    # dedicated server ranks (the last S ranks only serve; saves reach them by SAVE)
    "ps_ded": {"strategy": "ps", "ps": {"servers": 1, "colocated": False, "mode": "sync"}},
    "ps_ded_async": {"strategy": "ps", "ps": {"servers": 2, "colocated": False, "mode": "async",
                                              "staleness": 0}},  # the async engine, deterministic
    "ps_ded_worker": {"strategy": "ps", "ps": {"servers": 1, "colocated": False, "mode": "async",
                                               "staleness": 0, "update": "worker"}},
    # small groups: a rank owns several ranges (one per group), as on a real model
    "zero1": {"strategy": "zero", "zero": {"stage": 1, "bucket_mb": 0.001}},
    "zero2": {"strategy": "zero", "zero": {"stage": 2, "bucket_mb": 0.001}},
    "zero3": {"strategy": "zero", "zero": {"stage": 3}},
    # hybrid sharding: nodes of HPCDP_RANKS_PER_NODE ranks (the tests set it)
    "hybrid1": {"strategy": "zero", "zero": {"stage": 1, "bucket_mb": 0.001, "shard": "node"}},
    "hybrid2": {"strategy": "zero", "zero": {"stage": 2, "bucket_mb": 0.001, "shard": "node"}},
    "hybrid3": {"strategy": "zero", "zero": {"stage": 3, "shard": "node"}},
}


def config(strategy: str, out_dir, *, steps: int, ckpt_dir=None, every: int = 0, model="mlp", **extra):
    """A small run: MLP (or a tiny GPT with dropout) on synthetic data, AdamW."""
    parallel = STRATEGIES[strategy]
    if model == "mlp":
        model_t = {"kind": "mlp", "sizes": [12, 24, 5]}
        data_t = {"kind": "synthetic_classification", "n_samples": 300, "n_features": 12, "n_classes": 5}
    else:
        model_t = {"kind": "gpt", "vocab_size": 8, "block_size": 8, "n_layer": 1, "n_head": 2,
                   "n_embd": 8, "dropout": 0.1}
        data_t = {"kind": "synthetic_sequence", "vocab_size": 8, "seq_len": 8, "n_samples": 256}
    raw = {
        "run": {"name": "ckpt-test", "out_dir": str(out_dir), "log_every": 1000, "seed": 3},
        "model": model_t, "data": data_t,
        "train": {"steps": steps, "epochs": 0, "global_batch": 24},
        "optim": {"kind": "adamw", "lr": 0.01, "schedule": "cosine", "warmup_steps": 2},
        "parallel": parallel,
        "checkpoint": {"dir": str(ckpt_dir) if ckpt_dir else "", "every": every},
    }
    for key, value in extra.items():
        section, _, name = key.partition("__")
        raw.setdefault(section, {})[name] = value
    return config_from_dict(raw)


def train(cfg, world, resume=None) -> dict:
    from hpcdp.train import run_training
    return run_training(cfg, world=world, out=io.StringIO(), resume=resume)


def build_parts(cfg, world):
    """(model, optimizer, strategy, sampler) as train.py builds them, strategy set up."""
    from hpcdp.data import load_dataset
    from hpcdp.data.sampler import GlobalSampler
    from hpcdp.nn import build_model
    from hpcdp.optim import build_optimizer
    from hpcdp.strategies import build_strategy
    from hpcdp.train import task_of

    ds = load_dataset(cfg.data, task_of(cfg.model), cfg.run.dtype)
    model = build_model(cfg.model, dtype=cfg.run.dtype, device=cfg.run.device)
    opt = build_optimizer(cfg.optim, dtype=cfg.run.dtype, device=cfg.run.device)
    strategy = build_strategy(cfg.parallel, world, cfg.comm)
    strategy.setup(model.flat, opt, world)
    sampler = GlobalSampler(ds.n_train, cfg.train.global_batch, cfg.data.seed, cfg.train.last_batch)
    return model, opt, strategy, sampler


def full_tensors(ckpt) -> dict:
    """Every logical tensor of a checkpoint, flattened (read and verified)."""
    from hpcdp.io.format.index import read_index
    from hpcdp.io.interop.inspect import read_tensor
    from hpcdp.io.restore.reader import Reader

    index = read_index(ckpt)
    with Reader(ckpt, index) as r:
        return {n: read_tensor(r, index, t).reshape(-1) for t, n in enumerate(index.tensors)}


def flat_of(tensors: dict, buffer: str, layout) -> np.ndarray:
    """The flat buffer ``buffer`` ("param", "optim/m"...) assembled from tensors."""
    return np.concatenate([tensors[f"{buffer}/{s.name}"] for s in layout])
