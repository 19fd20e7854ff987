"""Exact mode on real ranks: the SHA-256 of the weights after 20 AdamW steps of a GPT
with dropout is the one rank's, for N = 1..4, under DDP, the synchronous parameter
server (colocated, dedicated, two servers) and ZeRO stages 1-3, with accumulation
(several micro-batches per rank) and without (one micro-batch per rank, or fewer
than ranks); and ZeRO 1-3 with gradient clipping (the integer norm).

Run under ``mpiexec -n 1|2|3|4 python -m pytest --with-mpi``. Rank 0 first trains the
one-rank reference on its own (COMM_SELF), then every rank runs the N-rank job; the
hashes come from metrics.jsonl (eval at step 10 and at the end).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from mpi4py import MPI

from hpcdp.config import load_config
from hpcdp.failure.agreement import on_root
from hpcdp.train import run_training
from hpcdp.world import World

pytestmark = pytest.mark.mpi

BASE = [
    'model.kind="gpt"', "model.vocab_size=16", "model.block_size=16", "model.n_layer=2",
    "model.n_head=2", "model.n_embd=16", "model.dropout=0.1",
    'data.kind="synthetic_sequence"', "data.vocab_size=16", "data.seq_len=16", "data.n_samples=400",
    "train.steps=20", "train.epochs=0", "train.global_batch=12", 'train.reproducible="exact"',
    'optim.kind="adamw"', "optim.lr=0.01", "optim.weight_decay=0.1", "optim.warmup_steps=3",
    'optim.schedule="cosine"', "run.log_every=20", "run.eval_every=10", "run.seed=3",
]

STRATEGIES = {
    "ddp": ['parallel.strategy="ddp"', "parallel.ddp.bucket_mb=0.01"],   # several buckets
    "ps": ['parallel.strategy="ps"'],
    "ps-dedicated": ['parallel.strategy="ps"', "parallel.ps.colocated=false"],
    "ps-2-servers": ['parallel.strategy="ps"', "parallel.ps.servers=2", 'parallel.ps.update="worker"'],
    "zero1": ['parallel.strategy="zero"', "parallel.zero.stage=1", "parallel.zero.bucket_mb=0.004"],
    "zero2": ['parallel.strategy="zero"', "parallel.zero.stage=2", "parallel.zero.bucket_mb=0.004"],
    "zero3": ['parallel.strategy="zero"', "parallel.zero.stage=3"],
    # recursive halving / the hierarchical reduce-scatter add in another order than the
    # ring: exact mode's integer payload makes that irrelevant (same hash)
    "zero2-recursive": ['parallel.strategy="zero"', "parallel.zero.stage=2",
                        "parallel.zero.bucket_mb=0.004", 'parallel.zero.algorithm="recursive"'],
    "zero3-hierarchical": ['parallel.strategy="zero"', "parallel.zero.stage=3",
                           'parallel.zero.algorithm="hierarchical"'],
}
_REFERENCE: dict = {}


def _on_root(fn) -> str:
    return on_root(MPI.COMM_WORLD, fn, what="a test folder", timeout=300.0)


def _out_dir(tmp_path_factory, name):
    return _on_root(lambda: str(tmp_path_factory.mktemp(name) / "run"))


def _hashes(run_dir) -> list[str]:
    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return [json.loads(s)["eval"]["weights_sha256"] for s in lines if '"eval"' in s]


def _reference(micro, tmp_path_factory, extra=()):
    """Rank 0 trains on one rank alone; every rank gets its two hashes."""
    key = (micro, tuple(extra))
    if key not in _REFERENCE:
        def run():
            out = tmp_path_factory.mktemp(f"ref{micro}") / "run"
            cfg = load_config(None, BASE + list(extra) + [f"train.exact_micro_batch={micro}",
                                                          f'run.out_dir="{out}"'])
            world = World(comm=MPI.COMM_SELF, rank=0, size=1)
            run_training(cfg, world=world, out=io.StringIO())
            return " ".join(_hashes(out))
        _REFERENCE[key] = _on_root(run).split()
    return _REFERENCE[key]


@pytest.mark.parametrize("strategy,micro", [("ddp", 3), ("ddp", 1), ("ddp", 12), ("ps", 3),
                                            ("ps-dedicated", 3), ("ps-2-servers", 2), ("zero1", 3),
                                            ("zero2", 3), ("zero3", 3), ("zero3", 12),
                                            ("zero2-recursive", 3), ("zero3-hierarchical", 3)])
def test_weights_hash_equals_one_rank(strategy, micro, tmp_path_factory):
    comm = MPI.COMM_WORLD
    if strategy in ("ps-dedicated", "ps-2-servers") and comm.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    want = _reference(micro, tmp_path_factory)
    out = _out_dir(tmp_path_factory, f"{strategy}{micro}")
    cfg = load_config(None, BASE + STRATEGIES[strategy] + [f"train.exact_micro_batch={micro}",
                                                           f'run.out_dir="{out}"'])
    log = io.StringIO()
    run_training(cfg, world=World.from_mpi(), out=log)
    if comm.Get_rank() == 0:
        assert len(want) == 2  # eval at step 10 and after step 20
        assert _hashes(out) == want, f"{strategy} on {comm.Get_size()} ranks differs from one rank"
        assert "reproducible = exact" in log.getvalue() and f"weights sha256 {want[-1]}" in log.getvalue()


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_zero_with_clipping_equals_one_rank(strategy, tmp_path_factory):
    """optim.clip_grad_norm under ZeRO: the norm of the sharded gradient is a
    fixed-point integer sum over the ranks, so clipped training is bit-identical to
    ZeRO on one rank."""
    clip = ["optim.clip_grad_norm=0.05"]
    want = _reference(3, tmp_path_factory, clip + STRATEGIES["zero1"])
    out = _out_dir(tmp_path_factory, f"{strategy}-clip")
    cfg = load_config(None, BASE + STRATEGIES[strategy] + clip + ["train.exact_micro_batch=3",
                                                                  f'run.out_dir="{out}"'])
    run_training(cfg, world=World.from_mpi(), out=io.StringIO())
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert _hashes(out) == want, f"{strategy} with clipping on {MPI.COMM_WORLD.Get_size()} ranks differs"
