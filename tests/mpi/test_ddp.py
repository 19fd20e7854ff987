"""DDP equivalence and byte accounting on real MPI ranks.

Run under ``mpiexec -n 2|3|4 python -m pytest --with-mpi tests/mpi/test_ddp.py``.
Every rank trains the N-rank DDP replica AND computes the one-rank reference locally
(same seed, same global batches), then compares: no files, no reference runs elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi

MLP = {"kind": "mlp", "sizes": [6, 10, 4]}                                 # 114 parameters
GPT = {"kind": "gpt", "vocab_size": 11, "block_size": 5, "n_layer": 2, "n_head": 2,
       "n_embd": 8, "tied_head": True, "dropout": 0.0}
SPLIT_ELEMS = 16  # smaller than most weight matrices: buckets split parameters

BUCKETS = {
    "split": dict(bucket_mb=SPLIT_ELEMS * 8 / 2**20),        # 16 float64 elements
    "many": dict(bucket_mb=25.0),                             # one bucket holds every parameter
    "per_param": dict(bucketing="per_param"),
    "no_overlap": dict(bucket_mb=SPLIT_ELEMS * 8 / 2**20, overlap=False),
}


def _world():
    from hpcdp.world import World
    return World.from_mpi()


def _self_world():
    from mpi4py import MPI

    from hpcdp.world import World
    return World(comm=MPI.COMM_SELF, rank=0, size=1)


def _data(model, n, seed=123):
    rng = np.random.default_rng(seed)
    if model["kind"] == "mlp":
        return (rng.normal(size=(n, model["sizes"][0])),
                rng.integers(0, model["sizes"][-1], size=n))
    t, v = model["block_size"], model["vocab_size"]
    return rng.integers(0, v, size=(n, t)), rng.integers(0, v, size=(n, t))


def _optimizer(kind, dtype):
    from hpcdp.optim import SGD, AdamW
    if kind == "sgd":
        return SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True, dtype=dtype)
    return AdamW(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, dtype=dtype)


def train(model_cfg, strategy, world, *, batches=(12, 12, 12), accum=1, optim="sgd",
          dtype="float64", seed=7, on_micro=None):
    """hpcdp.step.train_step on synthetic data; returns (params, stats, flat).

    ``batches``: the global batch size of each step (a short one models
    last_batch = "keep"). Each rank takes its shard_range slice, cut into ``accum``
    micro-batches; ``on_micro(m)`` runs after micro-batch m's backward.
    """
    from hpcdp.autograd import Tensor
    from hpcdp.data.sampler import micro_batches
    from hpcdp.nn import build_model
    from hpcdp.step import LocalBatch, train_step

    model = build_model(model_cfg, dtype=dtype, seed=seed)
    flat = model.flat
    strategy.setup(flat, _optimizer(optim, dtype), world)
    X, Y = _data(model_cfg, sum(batches))

    def fetch(idx):
        x = X[idx].astype(dtype) if model_cfg["kind"] == "mlp" else X[idx]
        return Tensor(x), Tensor(Y[idx])

    stats, start = [], 0
    for gb in batches:
        off, size = shard_range(gb, strategy.dp_size, strategy.dp_rank)
        local = np.arange(start + off, start + off + size)
        batch = LocalBatch(micro_batches(local, accum), gb, filler=np.arange(start, start + 1))
        train_step(model, strategy, batch, fetch, after_backward=on_micro)
        stats.append(strategy.step_stats())
        start += gb
    params = full_params(strategy, flat)
    strategy.close()
    return params, stats, flat


def full_params(strategy, flat):
    """The whole parameter vector as float64 (gathered from shards if the strategy
    shards parameters)."""
    if hasattr(strategy, "gather_full_params"):
        return np.array(strategy.gather_full_params(), dtype=np.float64)
    return np.array(flat.backend.to_numpy(flat.data), dtype=np.float64)


def reference(model_cfg, **kw):
    from hpcdp.strategies.base import SingleRank
    kw = {**kw, "accum": 1}  # the reference: one rank, the whole global batch at once
    return train(model_cfg, SingleRank(), _self_world(), **kw)[0]


def ddp(**opts):
    from hpcdp.strategies.ddp import DDP, DDPConfig
    return DDP(DDPConfig(**opts), timeout=60.0)


def assert_close(got, want, rtol):
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= rtol, f"relative difference {err:.3g} > {rtol:g}"


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("accum", [1, 3])
@pytest.mark.parametrize("bucket", list(BUCKETS))
def test_mlp_equals_one_rank_float64(optim, accum, bucket):
    world = _world()
    got, stats, _ = train(MLP, ddp(**BUCKETS[bucket]), world, accum=accum, optim=optim)
    want = reference(MLP, optim=optim)
    assert_close(got, want, 1e-12)
    if bucket == "no_overlap":
        assert all(s["buckets_in_backward"] == 0 and s["comm_hidden_s"] == 0 for s in stats)
    elif world.size > 1:
        # the bucket at the end of the buffer starts from a hook, before backward ends
        assert all(s["buckets_in_backward"] >= 1 for s in stats)


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("accum,bucket", [(1, "split"), (2, "many"), (2, "split")])
def test_gpt_equals_one_rank_float64(optim, accum, bucket):
    got, _, _ = train(GPT, ddp(**BUCKETS[bucket]), _world(), accum=accum, optim=optim,
                      batches=(8, 8, 8))
    want = reference(GPT, optim=optim, batches=(8, 8, 8))
    assert_close(got, want, 1e-12)


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_float32_equals_one_rank_to_float_tolerance(model):
    cfg = MLP if model == "mlp" else GPT
    got, _, _ = train(cfg, ddp(bucket_mb=SPLIT_ELEMS * 4 / 2**20), _world(), accum=2,
                      optim="adamw", dtype="float32", batches=(8, 8, 8))
    want = reference(cfg, optim="adamw", dtype="float32", batches=(8, 8, 8))
    assert_close(got, want, 2e-5)


def test_uneven_slices_and_short_last_batch():
    # 10 and 7 samples do not divide over 3 or 4 ranks; the last batch is short
    # ("keep"): weighting by global samples still gives the one-rank result.
    batches = (10, 10, 7)
    got, _, _ = train(MLP, ddp(**BUCKETS["split"]), _world(), accum=3, batches=batches)
    want = reference(MLP, batches=batches)
    assert_close(got, want, 1e-12)


def test_replicas_identical_after_training():
    world = _world()
    got, _, _ = train(GPT, ddp(bucket_mb=SPLIT_ELEMS * 8 / 2**20, check_every=1), world,
                      optim="adamw", batches=(8, 8))
    every = np.empty((world.size, got.size))
    world.comm.Allgather(got, every)
    assert all(np.array_equal(every[0], every[r]) for r in range(world.size))


# Stated tolerance of a 16-bit wire against the float32 wire after 3 steps of SGD with
# momentum (GPT, float32, 1-4 ranks): max |difference| / max |weights| (measured: at most
# 3.8e-4 bfloat16, 4.8e-5 float16, stage 3 included; x2.5 margin). SGD because its
# update is linear in the gradient: AdamW turns a tiny gradient into a step of about
# lr whatever its rounding, so it compares optimizer behaviour, not the wire
# (the GPT runs of docs/results.md compare AdamW at the loss).
WIRE_RTOL = {"bfloat16": 1e-3, "float16": 1.2e-4}


@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_16bit_wire_is_close_to_the_float32_wire_with_half_the_bytes(wire):
    world = _world()
    opts = dict(bucket_mb=SPLIT_ELEMS * 4 / 2**20, check_every=1)  # replicas checked each step
    kw = dict(accum=2, optim="sgd", dtype="float32", batches=(8, 8, 8))
    want, s32, _ = train(GPT, ddp(**opts), world, **kw)
    got, s16, _ = train(GPT, ddp(comm_dtype=wire, algorithm="auto", **opts), world, **kw)
    if world.size == 1:  # nothing travels, nothing is rounded
        assert np.array_equal(got, want)
        return
    assert not np.array_equal(got, want)  # the wire did round
    assert_close(got, want, WIRE_RTOL[wire])
    for a, b in zip(s16, s32):
        assert b["grad_bytes_sent"] > 0
        assert 2 * a["grad_bytes_sent"] == b["grad_bytes_sent"]
        assert 2 * a["grad_bytes_recv"] == b["grad_bytes_recv"]


# -- bytes -----------------------------------------------------------------------

def test_ledger_bytes_are_two_n_minus_one_over_n_of_gradient_bytes():
    """MLP 12-12-12: every parameter (144 or 12 elements) and every bucket (cap 24)
    is divisible by N = 2, 3, 4, so each rank sends exactly 2(N-1)/N * grad bytes."""
    world = _world()
    cfg = {"kind": "mlp", "sizes": [12, 12, 12]}
    n = world.size
    for opts in (dict(bucket_mb=24 * 8 / 2**20), dict(bucketing="per_param"), dict(bucket_mb=1.0)):
        _, stats, flat = train(cfg, ddp(**opts), world, batches=(12, 12))
        assert flat.numel == 312
        for s in stats:
            assert 2 * (n - 1) * flat.nbytes % n == 0
            assert s["grad_bytes_sent"] == 2 * (n - 1) * flat.nbytes // n
            assert s["grad_bytes_recv"] == 2 * (n - 1) * flat.nbytes // n
            assert s["bytes_sent"] == s["grad_bytes_sent"]


@pytest.mark.parametrize("bucket", ["split", "many", "per_param"])
def test_ledger_bytes_equal_exact_formula_with_uneven_chunks(bucket):
    from hpcdp.comm.model.volume import expected_step_bytes

    world = _world()
    strat = ddp(**BUCKETS[bucket])
    _, stats, flat = train(MLP, strat, world, accum=2)
    sent, recv = expected_step_bytes(strat.plan, world.size, world.rank, 8)
    if world.size > 1:
        assert sent > 0 and recv > 0
    for s in stats:
        assert (s["grad_bytes_sent"], s["grad_bytes_recv"]) == (sent, recv)
    # over all ranks, sent == received == 2(N-1)/N * grad bytes, exactly, even when uneven
    tot = np.array([sent, recv], dtype=np.int64)
    allt = np.empty_like(tot)
    world.comm.Allreduce(tot, allt)
    n = world.size
    assert allt[0] == allt[1] == 2 * (n - 1) * flat.nbytes


def test_no_communication_before_last_micro_batch():
    world = _world()
    strat = ddp(**BUCKETS["split"])
    seen = []

    def on_micro(m):  # after micro-batch m's backward: buckets started, bytes moved
        seen.append((strat.launched, world.ledger.total_bytes()))

    _, stats, _ = train(MLP, strat, world, accum=3, batches=(12,), on_micro=on_micro)
    assert seen[0] == seen[1] == (0, seen[0][1])  # micro-batches 0 and 1: nothing started
    if world.size > 1:
        # the last one started buckets during its backward, and they moved bytes
        assert seen[2][0] >= 1 and seen[2][0] == stats[0]["buckets_in_backward"]
        assert stats[0]["grad_bytes_sent"] > 0
