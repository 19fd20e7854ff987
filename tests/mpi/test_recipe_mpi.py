"""Weight-decay groups and padded sequences under every strategy, on real MPI ranks.

1. One step with zero gradients (the loss times 0): every element the default rules
   decay is multiplied by exactly 1 - lr*wd, every other element is unchanged, on
   every worker, for DDP, ZeRO stages 1-3 (each rank steps several owned ranges) and
   parameter-server layouts where servers step their shard (the optimizer sees its
   slice of the groups) or workers step the whole buffer.
2. A GPT with AdamW (decay groups) on right-padded sequences (``ignore_index``) for a
   few steps equals one-rank training on the same global batches: each rank's loss is
   weighted by its counted tokens over the global batch's (hpcdp.nn.padding).
Every rank computes the one-rank reference itself (COMM_SELF).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi
SIZE = MPI.COMM_WORLD.Get_size()
GPT_CFG = {"kind": "gpt", "vocab_size": 11, "block_size": 6, "n_layer": 2, "n_head": 2, "n_embd": 8,
           "ignore_index": -100}
LR, WD, PAD = 0.05, 0.3, -100

# (name, strategy factory): servers step their shard, or workers the whole buffer
LAYOUTS = {
    "ddp": lambda: _ddp(),
    "ps-1-colocated-server": lambda: _ps(1, True, "server"),
    "ps-2-colocated-server": lambda: _ps(2, True, "server"),
    "ps-1-dedicated-server": lambda: _ps(1, False, "server"),
    "ps-1-colocated-worker": lambda: _ps(1, True, "worker"),
    "zero-1": lambda: _zero(1),
    "zero-2": lambda: _zero(2),
    "zero-3": lambda: _zero(3),
}
NEEDS = {"ps-2-colocated-server": 2, "ps-1-dedicated-server": 2}


def _ddp():
    from hpcdp.strategies.ddp import DDP, DDPConfig
    return DDP(DDPConfig(bucket_mb=64 * 8 / 2**20), timeout=60.0)  # several buckets


def _ps(servers, colocated, update):
    from hpcdp.strategies.ps import ParameterServer, PSConfig
    return ParameterServer(PSConfig(servers=servers, colocated=colocated, mode="sync", update=update), timeout=60.0)


def _zero(stage):
    """ZeRO with tiny groups: each rank owns several disjoint flat ranges."""
    from hpcdp.config_parallel import ZeroConfig
    from hpcdp.strategies.zero import make_zero
    return make_zero(ZeroConfig(stage=stage, bucket_mb=64 * 8 / 2**20), timeout=60.0)


def _world(comm=None):
    from hpcdp.world import World
    if comm is None:
        return World.from_mpi()
    return World(comm=comm, rank=0, size=1)


def _optimizer(layout, kind="adamw"):
    from hpcdp.config import load_config
    from hpcdp.optim import build_optimizer
    cfg = load_config(None, [f'optim.kind="{kind}"', f"optim.lr={LR}", f"optim.weight_decay={WD}"])
    return build_optimizer(cfg.optim, layout=layout, dtype="float64")


def _padded_data(n, seed=11):
    """Sequences of random length 2..6, padded on the right: target PAD, input 0."""
    rng = np.random.default_rng(seed)
    t, v = GPT_CFG["block_size"], GPT_CFG["vocab_size"]
    x, y = rng.integers(0, v, size=(n, t)), rng.integers(0, v, size=(n, t))
    for i, length in enumerate(rng.integers(2, t + 1, size=n)):
        x[i, length:], y[i, length:] = 0, PAD
    y[0, :] = PAD  # one sample is all padding
    return x, y


def train(strategy, world, *, steps=3, global_batch=8, zero_grad_loss=False, kind="adamw"):
    """hpcdp.step.train_step, padded data, weights by counted tokens; returns (full
    params, initial params) on workers, (None, initial) on dedicated servers."""
    from hpcdp.autograd import Tensor
    from hpcdp.nn import build_model
    from hpcdp.nn.padding import slice_weight
    from hpcdp.step import LocalBatch, train_step

    model = build_model(GPT_CFG, dtype="float64", seed=3)
    flat, p0 = model.flat, np.array(model.flat.data)
    strategy.setup(flat, _optimizer(flat.layout, kind), world)
    if not strategy.is_worker:
        try:
            strategy.serve()
        finally:
            strategy.close()
        return None, p0
    X, Y = _padded_data(steps * global_batch)
    try:
        for s in range(steps):
            g = np.arange(s * global_batch, (s + 1) * global_batch)
            off, size = shard_range(global_batch, strategy.dp_size, strategy.dp_rank)
            mine = g[off:off + size]
            weights = [0.0 if zero_grad_loss else slice_weight(Y[mine], Y[g], PAD)]
            batch = LocalBatch([mine], global_batch, filler=g[:1], weights=weights)
            train_step(model, strategy, batch, lambda idx: (Tensor(X[idx]), Tensor(Y[idx])))
        params = (np.array(strategy.gather_full_params(), dtype=np.float64)
                  if hasattr(strategy, "gather_full_params") else np.array(flat.data))
    finally:
        strategy.close()
    return params, p0


def _decayed_mask(layout, n):
    from hpcdp.optim import decay_ranges
    m = np.zeros(n, dtype=bool)
    for off, size in decay_ranges(layout):
        m[off:off + size] = True
    return m


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_zero_gradient_step_decays_exactly_the_right_elements(layout):
    if SIZE < NEEDS.get(layout, 1):
        pytest.skip(f"{layout} needs {NEEDS[layout]} ranks")
    from hpcdp.nn import build_model
    got, p0 = train(LAYOUTS[layout](), _world(), steps=1, zero_grad_loss=True)
    if got is None:
        return  # a dedicated server: its workers check
    layout_ = build_model(GPT_CFG, dtype="float64", seed=3).flat.layout
    mask = _decayed_mask(layout_, p0.size)
    assert 0 < mask.sum() < p0.size
    np.testing.assert_array_equal(got[~mask], p0[~mask])            # biases, LayerNorms, embeddings
    np.testing.assert_array_equal(got[mask], p0[mask] * (1 - LR * WD))  # AdamW: p*(1-lr*wd), m = v = 0


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_padded_gpt_with_decay_groups_equals_one_rank(layout, kind):
    if SIZE < NEEDS.get(layout, 1):
        pytest.skip(f"{layout} needs {NEEDS[layout]} ranks")
    from hpcdp.strategies.base import SingleRank
    got, _ = train(LAYOUTS[layout](), _world(), kind=kind)
    want, p0 = train(SingleRank(), _world(MPI.COMM_SELF), kind=kind)
    if got is None:
        return
    assert np.abs(want - p0).max() > 1e-3  # the run really trained
    # float64 sums in another order; AdamW turns ~1e-17 gradient noise on near-zero
    # elements into ~1e-13 steps: compare against the size of the parameters
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-11, f"relative difference {err:.3g}"


@pytest.mark.parametrize("kind", ["npz", "hdf5"])  # in memory / read from disk per step
def test_train_loop_on_padded_files_equals_one_rank(kind, tmp_path_factory):
    """run_training (hpcdp train's loop) with a reserved pad id (0) as model.ignore_index:
    each rank's loss weighs its counted tokens, so DDP on N ranks equals one rank."""
    import io

    import h5py

    from hpcdp.config import load_config
    from hpcdp.failure.agreement import on_root
    from hpcdp.nn import build_model
    from hpcdp.train import run_training

    comm = MPI.COMM_WORLD
    folder = on_root(comm, lambda: str(tmp_path_factory.mktemp("padded")), what="a test folder", timeout=30.0)
    path = f"{folder}/padded.{'npz' if kind == 'npz' else 'h5'}"
    if comm.Get_rank() == 0:
        x, y = _padded_data(48, seed=5)
        y = np.where(y == PAD, 0, np.maximum(y, 1))  # pad target 0, real targets 1..10
        if kind == "npz":
            np.savez(path, x=x, y=y)
        else:
            with h5py.File(path, "w") as f:
                f["x"], f["y"] = x, y
    comm.Barrier()
    sets = [f"data.kind={kind}", f'data.path="{path}"', 'model.kind="gpt"', "model.vocab_size=11",
            "model.block_size=6", "model.n_layer=2", "model.n_head=2", "model.n_embd=8", "model.ignore_index=0",
            'optim.kind="adamw"', f"optim.lr={LR}", f"optim.weight_decay={WD}", "train.steps=4",
            "train.global_batch=8", 'run.dtype="float64"']
    results = {}
    for name, world, strategy in (("ranks", None, "ddp"), ("one", MPI.COMM_SELF, "none")):
        from hpcdp.world import World
        w = World.from_mpi() if world is None else World(comm=world, rank=0, size=1)
        out = f"{folder}/run-{name}" + ("" if world is None else f"-{comm.Get_rank()}")
        cfg = load_config(None, sets + [f'parallel.strategy="{strategy}"', f'run.out_dir="{out}"'])
        model = build_model(cfg.model, dtype="float64", device="cpu")
        res = run_training(cfg, world=w, model=model, out=io.StringIO())
        results[name] = (np.array(model.flat.data), res["eval"]["loss"])
    err = np.abs(results["ranks"][0] - results["one"][0]).max() / np.abs(results["one"][0]).max()
    assert err < 1e-11, f"relative difference {err:.3g}"
    assert results["ranks"][1] == pytest.approx(results["one"][1], rel=1e-10)  # eval skips padding alike
