"""Restart matrix on real ranks: save on N ranks under one strategy, restore on M
ranks under another, and same-N resumes that continue bit for bit. Strategies: none,
ddp, ps (sync, async, worker-side update), ZeRO stages 1-3.

Each case runs on exactly max(N, M) ranks (tests/run_mpi.sh runs this file on 1-4),
using groups of the first N and first M ranks of the job. Every strategy appears on
both sides. Checked per case:

1. right after the restore, every rank's parameters and optimizer state equal the
   checkpoint's tensors exactly (and the checkpoint tiles every tensor once);
2. training on to K steps equals a run that never stopped, under the new strategy
   on M ranks, to float64 tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from ckpt_util import build_parts, config, flat_of, full_tensors, group, remove, shared_dir, train

K = 6          # steps of every run; the checkpoint is taken at K // 2
HALF = K // 2

# (N, strategy that saves, M, strategy that restores)
PAIRS = [
    (1, "none", 3, "ddp"),
    (2, "ddp", 4, "ps"),
    (4, "ps", 3, "ddp"),
    (3, "ps_async", 2, "ps1"),
    (4, "ddp", 1, "none"),
    (2, "ps_worker", 3, "ps_async"),
    (2, "zero3", 3, "zero1"),
    (3, "zero1", 4, "zero3"),
    (4, "zero2", 1, "none"),
    (1, "none", 2, "zero2"),
    # hybrid sharding (2 ranks per node: 2 nodes x 2 at 4 ranks, 1 node at 2) <-> plain ZeRO, DDP
    (4, "hybrid3", 3, "zero1"),
    (3, "zero3", 4, "hybrid2"),
    (2, "ddp", 4, "hybrid3"),
    (4, "hybrid1", 2, "ddp"),
    # dedicated parameter servers: an asynchronous run resumed as ZeRO and
    # as PS with other worker/server counts; DDP/ZeRO resumed as PS with servers
    (3, "ps_ded_async", 2, "zero3"),
    (4, "ps_ded_async", 3, "ps_ded_worker"),
    (2, "zero1", 4, "ps_ded"),
    (3, "ddp", 2, "ps_ded_worker"),
]


def _only_on(size: int) -> None:
    if MPI.COMM_WORLD.Get_size() != size:
        pytest.skip(f"this case runs on {size} ranks")


def _nodes_of_two(monkeypatch, *strategies) -> None:
    """Hybrid sharding's nodes: blocks of 2 ranks (HPCDP_RANKS_PER_NODE)."""
    if any(s.startswith("hybrid") for s in strategies):
        from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV
        monkeypatch.setenv(RANKS_PER_NODE_ENV, "2")


def _step_dir(root, step):
    return root / f"step-{step:08d}"


@pytest.mark.mpi
@pytest.mark.parametrize("n,a,m,b", PAIRS, ids=[f"{a}{n}-to-{b}{m}" for n, a, m, b in PAIRS])
def test_restore_on_other_ranks_and_strategy(n, a, m, b, monkeypatch):
    _only_on(max(n, m))
    _nodes_of_two(monkeypatch, a, b)
    from hpcdp.io.checkpointer import Checkpointer

    tmp = shared_dir()
    try:
        w = group(n)
        if w is not None:
            # the whole K-step schedule (learning rate), saved at HALF
            train(config(a, tmp / "save", steps=K, ckpt_dir=tmp / "ck", every=HALF, run__dtype="float64"), w)
        MPI.COMM_WORLD.Barrier()
        ckpt = _step_dir(tmp / "ck", HALF)
        saved = full_tensors(ckpt)

        # 1. exact restore under the other strategy
        w = group(m)
        if w is not None:
            cfg = config(b, tmp / "exact", steps=K, run__dtype="float64")
            model, opt, strategy, sampler = build_parts(cfg, w)
            ck = Checkpointer(cfg, world=w, strategy=strategy, model=model, optimizer=opt, sampler=sampler,
                              total=K, run_dir=tmp / "exact", resume=str(ckpt))
            try:
                assert ck.restore() == HALF
                layout = model.flat.layout
                if model.flat.data is not None:  # ZeRO-3 holds no full buffer: its targets say
                    np.testing.assert_array_equal(model.flat.data, flat_of(saved, "param", layout))
                for piece in strategy.checkpoint_targets():
                    want = flat_of(saved, piece.buffer, layout)[piece.offset:piece.offset + piece.size]
                    np.testing.assert_array_equal(piece.array, want, err_msg=piece.buffer)
                assert opt.steps == HALF
            finally:
                ck.close()
                if not strategy.is_worker:  # a dedicated server: until the workers say done
                    strategy.serve()
                strategy.close()

        # 2. the next steps equal a run that never stopped, at M ranks under b
        if w is not None:
            train(config(b, tmp / "resumed", steps=K, ckpt_dir=tmp / "ck_res", run__dtype="float64"), w,
                  resume=str(ckpt))
            train(config(b, tmp / "ref", steps=K, ckpt_dir=tmp / "ck_ref", run__dtype="float64"), w)
        MPI.COMM_WORLD.Barrier()
        got, ref = full_tensors(_step_dir(tmp / "ck_res", K)), full_tensors(_step_dir(tmp / "ck_ref", K))
        assert got.keys() == ref.keys()
        for name in ref:
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-9, atol=1e-12, err_msg=name)
    finally:
        remove(tmp)


# Same N, same strategy: K straight == K/2, stop, resume, K/2 (SHA-256 of the weights).
SAME = [
    (1, "none", "gpt", False),        # dropout: keyed by (seed, step, sample, layer), nothing saved
    (2, "ddp", "mlp", True),          # asynchronous save
    (2, "ps", "mlp", False),
    (3, "ps_async", "mlp", False),    # staleness 0 is deterministic
    (3, "ddp", "gpt", False),
    (2, "zero3", "gpt", False),
    (3, "zero2", "mlp", True),        # asynchronous save of shards
    (4, "hybrid3", "gpt", False),     # 2 nodes x 2: each replica writes its half of a shard
    (3, "ps_ded", "mlp", True),       # a dedicated server's shard saved in the background
    (3, "ps_ded_worker", "mlp", False),
]


@pytest.mark.mpi
@pytest.mark.parametrize("n,strategy,model,asynchronous", SAME,
                         ids=[f"{s}{n}-{m}{'-async' if a else ''}" for n, s, m, a in SAME])
def test_resume_at_same_ranks_is_bit_for_bit(n, strategy, model, asynchronous, monkeypatch):
    _only_on(n)
    _nodes_of_two(monkeypatch, strategy)
    from hpcdp.io.interop.inspect import weights_sha256

    tmp = shared_dir()
    try:
        w = group(n)
        kw = dict(steps=K, every=HALF, model=model, checkpoint__asynchronous=asynchronous)
        train(config(strategy, tmp / "straight", ckpt_dir=tmp / "a", **kw), w)
        train(config(strategy, tmp / "resumed", ckpt_dir=tmp / "b", **kw), w,
              resume=str(_step_dir(tmp / "a", HALF)))
        MPI.COMM_WORLD.Barrier()
        straight, resumed = _step_dir(tmp / "a", K), _step_dir(tmp / "b", K)
        assert weights_sha256(straight) == weights_sha256(resumed)
        one, two = full_tensors(straight), full_tensors(resumed)
        for name in one:  # optimizer state too, bit for bit
            assert one[name].tobytes() == two[name].tobytes(), name
        # the resumed run never wrote a checkpoint before step HALF + 1
        assert not _step_dir(tmp / "b", HALF).exists()
    finally:
        remove(tmp)


@pytest.mark.mpi
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-save", "async-save"])
def test_dedicated_servers_write_their_shards_and_versions(asynchronous):
    """Asynchronous PS, 2 workers and 1 dedicated server (staleness 1): the server
    writes the parameters and the whole optimizer state from its own file, the workers
    nothing; its version at each save equals the updates pushed (no update in flight:
    staleness 0 at the boundary); both checkpoints are listed."""
    _only_on(3)
    from hpcdp.io.format.commit import list_checkpoints
    from hpcdp.io.format.index import read_index

    tmp = shared_dir()
    try:
        ps = {"servers": 1, "colocated": False, "mode": "async", "staleness": 1}
        out = train(config("ps_ded_async", tmp / "run", steps=4, ckpt_dir=tmp / "ck", every=2, parallel__ps=ps,
                           checkpoint__asynchronous=asynchronous), group(3))
        MPI.COMM_WORLD.Barrier()
        assert [(step, done) for step, _, done in list_checkpoints(tmp / "ck")] == [(2, True), (4, True)]
        for step in (2, 4):
            index = read_index(_step_dir(tmp / "ck", step))
            assert list(index.arrays["rank_ps_server"]) == [-1, -1, 0]
            assert list(index.arrays["rank_ps_version"]) == [-1, -1, step]
            files = {int(f) for f in index.pieces[:, 1]}
            assert files == {index.files.index("rank-00002.h5")}, index.files
            assert int(index.state["optimizer_steps"]) == step
        assert out.get("role") == ("server" if MPI.COMM_WORLD.Get_rank() == 2 else None)
    finally:
        remove(tmp)
