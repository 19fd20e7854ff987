"""Across nodes of the emulated cluster (tests/cluster): every collective and algorithm
equals MPI's own, DDP / ZeRO 1-3 / the parameter server follow one rank, exact mode's
weight hash equals one rank's. Run by tests/cluster/test_cluster_correctness.py as

    HPCDP_CLUSTER_LAYOUT=2,2 tests/cluster/mpiexec -n 4 python -m pytest --with-mpi \
        -o python_files='check_*.py' tests/cluster/jobs/check_correctness.py

(the layout, ranks per node, comes from HPCDP_CLUSTER_LAYOUT, which hydra passes on)."""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.comm import all_gather, allreduce, reduce_scatter
from hpcdp.comm.algorithms import names
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi

LAYOUT = [int(p) for p in os.environ["HPCDP_CLUSTER_LAYOUT"].split(",")]
EVEN = len(set(LAYOUT)) == 1
SIZES = [1, 13, 4097, 300_001]  # up to 2.4 MB of float64: many ring segments on the link


def _eth0_mac():
    with open("/sys/class/net/eth0/address") as f:  # this rank's node's (namespace's) eth0
        return f.read().strip()


def test_ranks_run_on_the_nodes_of_the_layout(comm):
    """Ranks 0..P0-1 share node 0's eth0, the next P1 node 1's...; MPI agrees (shared
    memory exactly within a node)."""
    macs = comm.allgather(_eth0_mac())
    want = [n for n, per in enumerate(LAYOUT) for _ in range(per)]
    assert len(macs) == len(want) == comm.Get_size()
    nodes = {m: i for i, m in enumerate(dict.fromkeys(macs))}
    assert [nodes[m] for m in macs] == want, f"eth0 per rank {macs}, layout {LAYOUT}"
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    assert local.Get_size() == LAYOUT[want[comm.Get_rank()]]
    local.Free()


def _data(n, rank, seed):
    return np.random.default_rng(seed * 1000 + rank).standard_normal(n)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(want).max(initial=0)))


@pytest.mark.parametrize("algorithm", names("allreduce"))
def test_allreduce_equals_mpi(comm, algorithm):
    if algorithm == "hierarchical" and not EVEN:
        with pytest.raises(ValueError, match="same number"):
            allreduce(np.ones(8), comm=comm.Dup(), algorithm="hierarchical")
        return
    for i, n in enumerate(SIZES):
        x = _data(n, comm.Get_rank(), i)
        ref = np.empty_like(x)
        comm.Allreduce(x, ref, op=MPI.SUM)
        _close(allreduce(x.copy(), comm=comm, algorithm=algorithm), ref)
        ref_max = np.empty_like(x)
        comm.Allreduce(x, ref_max, op=MPI.MAX)
        assert np.array_equal(allreduce(x.copy(), comm=comm, algorithm=algorithm, op="max"), ref_max)


@pytest.mark.parametrize("algorithm", sorted(set(names("reduce_scatter")) | set(names("all_gather"))))
def test_reduce_scatter_and_all_gather_equal_mpi(comm, algorithm):
    N, rank = comm.Get_size(), comm.Get_rank()
    rs, ag = algorithm in names("reduce_scatter"), algorithm in names("all_gather")
    if algorithm == "hierarchical" and not EVEN:
        with pytest.raises(ValueError, match="same number"):
            reduce_scatter(np.ones(8), comm=comm.Dup(), algorithm="hierarchical")
        return
    for i, n in enumerate(SIZES):
        x = _data(n, rank, 10 + i)
        counts = [shard_range(n, N, r)[1] for r in range(N)]
        ref = np.empty(counts[rank])
        comm.Reduce_scatter(x, ref, recvcounts=counts, op=MPI.SUM)
        if rs:
            _close(reduce_scatter(x.copy(), comm=comm, algorithm=algorithm), ref)
        off, size = shard_range(n, N, rank)
        mine = x[off:off + size].copy()
        full = np.empty(n)
        comm.Allgatherv(mine, [full, counts])
        if ag:
            assert np.array_equal(all_gather(mine, np.empty(n), comm=comm, algorithm=algorithm), full)


@pytest.mark.skipif(not EVEN, reason="the cost model's auto needs whole nodes")
def test_auto_with_a_profile_picks_by_the_model_and_equals_mpi(comm, monkeypatch):
    """HPCDP_PROFILE: the cost model chooses (hierarchical among its choices) on the real
    node layout found by MPI (no HPCDP_RANKS_PER_NODE)."""
    monkeypatch.setenv("HPCDP_PROFILE", "example-cluster")
    monkeypatch.delenv("HPCDP_RANKS_PER_NODE", raising=False)
    c = comm.Dup()
    from hpcdp.comm.hierarchical import hierarchy
    from hpcdp.comm.core.context import get_context
    h = hierarchy(get_context(c, 20.0))
    assert (h.nodes, h.per_node) == (len(LAYOUT), LAYOUT[0])
    for i, n in enumerate(SIZES):
        x = _data(n, comm.Get_rank(), 20 + i)
        ref = np.empty_like(x)
        comm.Allreduce(x, ref, op=MPI.SUM)
        _close(allreduce(x.copy(), comm=c, algorithm="auto"), ref)


def test_zero_on_few_step_collectives_follows_one_rank(comm, monkeypatch):
    """ZeRO-2 and -3 on recursive halving / doubling, on the hierarchical reduce-scatter /
    all-gather (whole nodes: the real MPI node layout) and on "auto" with a profile: the
    weights follow one rank; the hierarchical collectives' bytes per link kind are the
    formula's on this layout, and the inter-node part is 1/L of the ring's volume (a
    power-of-two node count; otherwise the fold adds a whole slice on fold ranks)."""
    from test_ddp import _world, assert_close, reference, train
    from test_zero import MLP, SMALL, zero

    from hpcdp.comm import Ledger
    from hpcdp.comm.model.volume import hier_shard_bytes

    monkeypatch.delenv("HPCDP_RANKS_PER_NODE", raising=False)
    algos = ["recursive"] + (["hierarchical", "auto"] if EVEN else [])
    for algo in algos:
        if algo == "auto":
            monkeypatch.setenv("HPCDP_PROFILE", "example-cluster")
        for stage in (2, 3):
            got, _, _ = train(MLP, zero(stage, bucket_mb=SMALL, algorithm=algo), _world(),
                              accum=2, optim="adamw")
            assert_close(got, reference(MLP, optim="adamw"), 1e-12)
        monkeypatch.delenv("HPCDP_PROFILE", raising=False)
    if EVEN:
        N, rank, L = comm.Get_size(), comm.Get_rank(), LAYOUT[0]
        led, n = Ledger(), 300_001
        c = comm.Dup()
        reduce_scatter(np.ones(n), comm=c, algorithm="hierarchical", ledger=led)
        want = hier_shard_bytes("reduce_scatter", n, N // L, L, rank // L, rank % L, 8)
        for kind in ("intra", "inter"):
            t = led.totals()[f"reduce_scatter.{kind}"]
            assert (t["sent_bytes"], t["recv_bytes"]) == want[kind]
        M = N // L
        if M & (M - 1) == 0:  # no fold across nodes: 1/L of the ring's volume (+ rounding)
            ring = (N - 1) * n * 8 // N
            assert sum(want["inter"]) <= 2 * ring / L + 16
        c.Free()


# -- training strategies follow one rank ------------------------------------------------

@pytest.mark.parametrize("strategy", ["ddp", "ddp-hierarchical", "zero1", "zero2", "zero3"])
def test_training_follows_one_rank(strategy, monkeypatch):
    from test_ddp import GPT, _world, assert_close, ddp, reference, train
    from test_zero import MLP, SMALL, zero

    if strategy == "ddp-hierarchical":
        if not EVEN:
            pytest.skip("the hierarchical allreduce needs whole nodes (its error: test_allreduce_equals_mpi)")
        s = ddp(bucket_mb=SMALL, algorithm="hierarchical")
    else:
        s = ddp(bucket_mb=SMALL) if strategy == "ddp" else zero(int(strategy[-1]), bucket_mb=SMALL)
    got, _, _ = train(MLP, s, _world(), accum=2, optim="adamw")
    assert_close(got, reference(MLP, optim="adamw"), 1e-12)
    if strategy in ("ddp", "zero3"):
        batches = (8, 8)
        s = ddp(bucket_mb=SMALL) if strategy == "ddp" else zero(3, bucket_mb=SMALL, prefetch=2)
        got, _, _ = train(GPT, s, _world(), optim="adamw", batches=batches)
        assert_close(got, reference(GPT, optim="adamw", batches=batches), 1e-12)


def test_hybrid_sharding_follows_one_rank_on_the_real_nodes(monkeypatch):
    """parallel.zero.shard = "node" on the nodes MPI finds (COMM_TYPE_SHARED, no
    HPCDP_RANKS_PER_NODE): ZeRO-3 sharded in the node, replicated across; uneven
    layouts are refused on every rank, naming the fix."""
    from test_ddp import GPT, _world, assert_close, reference, train
    from test_zero import SMALL, zero

    from hpcdp.config_error import ConfigError

    monkeypatch.delenv("HPCDP_RANKS_PER_NODE", raising=False)
    s = zero(3, bucket_mb=SMALL, prefetch=1, shard="node")
    if not EVEN:
        from hpcdp.nn import build_model
        from hpcdp.optim import SGD
        model = build_model(GPT, dtype="float64", seed=7)
        with pytest.raises(ConfigError, match=r'shard = "node" needs the same number of ranks on every '
                                              r'node \(nodes have between 1 and 2 ranks.*\): place ranks evenly, '
                                              r'set HPCDP_RANKS_PER_NODE, or use parallel.zero.shard = "world"'):
            s.setup(model.flat, SGD(lr=0.1, dtype="float64"), _world())
        return
    batches = (8, 8)
    got, _, _ = train(GPT, s, _world(), optim="adamw", batches=batches)
    assert_close(got, reference(GPT, optim="adamw", batches=batches), 1e-12)
    assert (s.shard_size, s.shard_rank) == (LAYOUT[0], MPI.COMM_WORLD.Get_rank() % LAYOUT[0])
    led = s.ledger.totals()
    if len(LAYOUT) > 1:  # bytes crossed nodes only in the shard's allreduce
        assert led["reduce_scatter.inter"]["sent_bytes"] > 0


def _ps_layouts():
    """(servers, colocated): a dedicated server on the last node (its workers elsewhere),
    and one server per rank (every node serves a shard)."""
    return [(1, False), (MPI.COMM_WORLD.Get_size(), True)]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("servers,colocated", _ps_layouts())
def test_parameter_server_follows_one_rank(mode, servers, colocated):
    from hpcdp.strategies.ps import ParameterServer, PSConfig
    from test_ps_support import reference, same_on_all, train, world

    w = world()
    # async with staleness 0 applies every gradient of a step before the next pull:
    # the synchronous result, bit for bit (tests/mpi/test_ps_async.py)
    ps = ParameterServer(PSConfig(servers=servers, colocated=colocated, mode=mode,
                                  **({"staleness": 0} if mode == "async" else {})))
    got, _ = train(ps, w, optim="adamw")
    workers = list(ps.roles.workers)
    if not colocated:
        assert w.size - 1 not in workers  # the server is the last rank: on the last node
    if got is not None:
        np.testing.assert_allclose(got, reference(optim="adamw"), rtol=1e-12, atol=1e-14)
    assert same_on_all(w.comm, got, workers)


def test_async_parameter_server_with_staleness_trains_on_every_worker():
    """Staleness 2: workers may run ahead; every gradient is applied once, none staler
    than 2 (the bound holds across the link)."""
    from hpcdp.strategies.ps import ParameterServer, PSConfig
    from test_ps_async import gathered_staleness
    from test_ps_support import train, world

    ps = ParameterServer(PSConfig(servers=1, colocated=False, mode="async", staleness=2))
    steps = 6
    got, _ = train(ps, world(), steps=steps)
    st = gathered_staleness(MPI.COMM_WORLD, ps)
    assert len(st) == steps * ps.dp_size
    assert st[:, 3].max() <= 2
    if got is not None:
        assert np.isfinite(got).all()


@pytest.mark.parametrize("strategy", ["ddp", "zero3", "ps-dedicated"])
def test_exact_mode_weight_hash_equals_one_rank(strategy, tmp_path_factory):
    from test_exact import BASE, STRATEGIES, _hashes, _out_dir, _reference

    from hpcdp.config import load_config
    from hpcdp.train import run_training
    from hpcdp.world import World

    want = _reference(3, tmp_path_factory)
    out = _out_dir(tmp_path_factory, strategy)
    cfg = load_config(None, BASE + STRATEGIES[strategy] + ["train.exact_micro_batch=3",
                                                          f'run.out_dir="{out}"'])
    run_training(cfg, world=World.from_mpi(), out=io.StringIO())
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert _hashes(out) == want, f"{strategy} across nodes differs from one rank"


if __name__ == "__main__":
    sys.exit("run under mpiexec with pytest --with-mpi (see the module docstring)")
