"""DiLoCo on real ranks (tests/run_mpi.sh runs this file on 1-4 ranks; each case says
which sizes it runs on). Every rank computes its references in process.

- with H = 1, outer lr 1, no outer momentum and SGD inside, DiLoCo is DDP (the outer
  step then averages one SGD step per group, which is DDP's step);
- the outer gradient's sign and the Nesterov update against a NumPy model of two
  outer steps;
- the outer exchange's mean (float32, bfloat16, int8 within its bound) and its ledger
  equal to the ring formula;
- checkpoints at outer boundaries: a resume continues bit for bit; on another group
  count the outer parameters carry over and each group takes saved replica g mod M.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi

SIZE = MPI.COMM_WORLD.Get_size()
MLP = {"kind": "mlp", "sizes": [6, 10, 4]}
GPT = {"kind": "gpt", "vocab_size": 11, "block_size": 5, "n_layer": 2, "n_head": 2,
       "n_embd": 8, "tied_head": True, "dropout": 0.0}


def _world():
    from hpcdp.world import World
    return World.from_mpi()


def _diloco(groups, inner, **kw):
    from hpcdp.config_parallel import DDPConfig, DiLoCoConfig
    from hpcdp.strategies.diloco import DiLoCo
    return DiLoCo(DiLoCoConfig(groups=groups, inner=inner, **kw), ddp=DDPConfig(bucket_mb=1e-4),
                  timeout=60.0)


def _sgd():
    from hpcdp.optim import SGD
    return SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True, dtype="float64")


def _train(model_cfg, strategy, world, steps=4, gb=12):
    from hpcdp.autograd import Tensor
    from hpcdp.nn import build_model
    from hpcdp.step import LocalBatch, train_step

    model = build_model(model_cfg, dtype="float64", seed=7)
    strategy.setup(model.flat, _sgd(), world)
    rng = np.random.default_rng(1)
    if model_cfg["kind"] == "mlp":
        X, Y = rng.normal(size=(steps * gb, 6)), rng.integers(0, 4, size=steps * gb)
    else:
        X, Y = rng.integers(0, 11, size=(steps * gb, 5)), rng.integers(0, 11, size=(steps * gb, 5))
    for s in range(steps):
        off, size = shard_range(gb, strategy.dp_size, strategy.dp_rank)
        local = np.arange(s * gb + off, s * gb + off + size)
        batch = LocalBatch([local], gb, filler=np.arange(s * gb, s * gb + 1))
        train_step(model, strategy, batch, lambda idx: (Tensor(X[idx]), Tensor(Y[idx])))
        strategy.step_stats()
    strategy.finish_updates()
    out = np.array(model.flat.data, dtype=np.float64)
    strategy.close()
    return out


@pytest.mark.skipif(SIZE == 1, reason="needs 2+ ranks")
@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_h1_outer_lr1_no_momentum_sgd_equals_ddp(model):
    from hpcdp.strategies.ddp import DDP, DDPConfig
    cfg = MLP if model == "mlp" else GPT
    world = _world()
    want = _train(cfg, DDP(DDPConfig(bucket_mb=1e-4), timeout=60.0), world)
    layouts = [(SIZE, "none")] + ([(2, "ddp")] if SIZE == 4 else [])
    for groups, inner in layouts:
        got = _train(cfg, _diloco(groups, inner, sync_every=1, outer_lr=1.0, outer_momentum=0.0,
                                  outer_nesterov=False), world)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err < 1e-12, f"groups={groups} inner={inner}: relative difference {err:.3g}"


@pytest.mark.skipif(SIZE not in (2, 4), reason="2 or 4 ranks")
def test_outer_sign_and_nesterov_against_numpy():
    """Each group's inner step lands its replica on a chosen target (inner SGD, lr 1, the
    gradient set to replica - target); the outer step must then do what NumPy says."""
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD

    world = _world()
    groups = SIZE if SIZE == 2 else 2
    s = _diloco(groups, "none" if groups == SIZE else "ddp", sync_every=1, outer_lr=0.7,
                outer_momentum=0.9, outer_nesterov=True)
    model = build_model(MLP, dtype="float64", seed=7)
    flat = model.flat
    s.setup(flat, SGD(lr=1.0, momentum=0.0, dtype="float64"), world)
    L = SIZE // groups
    theta = flat.data.copy()
    buf = np.zeros_like(theta)
    rng = np.random.default_rng(5)
    for k in range(2):
        targets = theta + rng.normal(size=(groups, theta.size))   # every rank draws all of them
        mine = targets[world.rank // L]
        s.zero_grad()
        s.begin_backward(True)
        flat.grad[...] = (flat.data - mine) / L                     # the group sums L of these
        s.finish_gradients()
        s.step()
        d = theta - targets.mean(axis=0)                            # old - new: the outer gradient
        buf = 0.9 * buf + d
        theta = theta - 0.7 * (d + 0.9 * buf)                       # Nesterov (PyTorch's form)
        np.testing.assert_allclose(flat.data, theta, rtol=1e-13, atol=1e-13, err_msg=f"outer step {k + 1}")
    s.close()


@pytest.mark.skipif(SIZE == 1, reason="needs 2+ ranks")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_outer_exchange_mean_and_ledger(dtype):
    from hpcdp.comm import Ledger
    from hpcdp.strategies.diloco import wire as W
    from hpcdp.strategies.diloco.exchange import OuterExchange, outer_bytes

    comm = MPI.COMM_WORLD.Dup()
    rank, M = comm.Get_rank(), SIZE
    n, B = 1001, 64
    rng = np.random.default_rng(11)
    xs = (rng.standard_normal((M, n)) * 0.01).astype(np.float32)
    ledger = Ledger()
    delta = xs[rank].copy()
    ex = OuterExchange(delta, comm=comm, groups=M, outer_dtype=dtype, block=B, ledger=ledger, timeout=60.0)
    while not ex.test():
        pass
    want = xs.mean(axis=0)
    if dtype == "float32":
        np.testing.assert_allclose(delta, want, rtol=1e-5, atol=1e-9)
    elif dtype == "bfloat16":
        np.testing.assert_allclose(delta, want, rtol=2 ** -6, atol=1e-4)
    else:
        absmax = np.max(np.abs(xs).reshape(M, -1), axis=0)
        bound = np.repeat(W.block_absmax(np.max(np.abs(xs), axis=0), B) / (2 * W.levels(M)), B)[:n]
        assert (np.abs(delta - want) <= bound * (1 + 1e-6)).all()
        del absmax
    every = np.zeros((M, n), dtype=np.float32)
    every[rank] = delta
    comm.Allreduce(MPI.IN_PLACE, every)
    assert (every == every[0]).all()                       # every group the same bits
    formula = outer_bytes(n, M, rank, dtype, B)
    t = ledger.totals()
    assert (t["outer.inter"]["sent_bytes"], t["outer.inter"]["recv_bytes"]) == formula["outer"]
    if dtype == "int8":
        assert (t["outer_scale.inter"]["sent_bytes"], t["outer_scale.inter"]["recv_bytes"]) == formula["outer_scale"]
    comm.Free()


@pytest.mark.skipif(SIZE != 4, reason="4 ranks: 2 groups x 2")
def test_checkpoints_at_outer_boundaries():
    """Streaming (2 fragments, overlap 1, mixing 0.5), H = 4, saved at step 4 of 8 on 2
    groups x 2 ranks: (1) resumed on the same layout it ends with the uninterrupted
    run's bits; (2) on 2 groups x 1 rank it continues to float tolerance; (3) on 4
    groups the outer state carries over and group g takes saved replica g mod 2."""
    from ckpt_util import build_parts, config, flat_of, full_tensors, group, remove, shared_dir, train

    from hpcdp.io.checkpointer import Checkpointer

    K, HALF = 8, 4
    tmp = shared_dir()
    step = lambda root, s: root / f"step-{s:08d}"  # noqa: E731
    try:
        w = group(4)
        train(config("diloco2", tmp / "a", steps=K, ckpt_dir=tmp / "ck", every=HALF, run__dtype="float64"), w)
        train(config("diloco2", tmp / "b", steps=K, ckpt_dir=tmp / "ck_res", run__dtype="float64"), w,
              resume=str(step(tmp / "ck", HALF)))
        MPI.COMM_WORLD.Barrier()
        ref, got = full_tensors(step(tmp / "ck", K)), full_tensors(step(tmp / "ck_res", K))
        saved = full_tensors(step(tmp / "ck", HALF))
        assert got.keys() == ref.keys()
        assert {n.rpartition("/")[0] for n in ref} >= {"param", "optim/m", "diloco/outer/momentum_buf",
                                                        "diloco/replica/0/param", "diloco/replica/1/param",
                                                        "diloco/replica/1/optim/v"}
        for name in ref:  # (1) bit for bit
            np.testing.assert_array_equal(got[name], ref[name], err_msg=name)

        # (2) 2 groups x 1 rank: the same algorithm, the group's sum over one rank
        w2 = group(2)
        if w2 is not None:
            cfg2 = config("diloco2x1", tmp / "c", steps=K, ckpt_dir=tmp / "ck2", run__dtype="float64")
            train(cfg2, w2, resume=str(step(tmp / "ck", HALF)))
        MPI.COMM_WORLD.Barrier()
        two = full_tensors(step(tmp / "ck2", K))
        for name in ("param", "diloco/replica/1/param"):
            layout_names = [n for n in ref if n.rpartition("/")[0] == name]
            for n in layout_names:
                np.testing.assert_allclose(two[n], ref[n], rtol=1e-9, atol=1e-12, err_msg=n)

        # (3) 4 groups of 1: state right after the restore
        cfg4 = config("diloco4", tmp / "d", steps=K, run__dtype="float64")
        model, opt, strategy, sampler = build_parts(cfg4, w)
        ck = Checkpointer(cfg4, world=w, strategy=strategy, model=model, optimizer=opt, sampler=sampler,
                          total=K, run_dir=tmp / "d", resume=str(step(tmp / "ck", HALF)))
        try:
            assert ck.restore() == HALF
            layout = model.flat.layout
            g = w.rank
            np.testing.assert_array_equal(model.flat.data, flat_of(saved, f"diloco/replica/{g % 2}/param", layout))
            outer = flat_of(saved, "param", layout)
            for c in strategy.chunks:
                np.testing.assert_array_equal(c.theta, outer[c.offset:c.offset + c.size])
            m_name = "optim/m" if g % 2 == 0 else "diloco/replica/1/optim/m"
            np.testing.assert_array_equal(opt.state_arrays()["m"], flat_of(saved, m_name, layout))
            assert strategy.t == HALF and "g mod 2" in strategy.restore_note()
        finally:
            ck.close()
            strategy.close()
    finally:
        remove(tmp)
