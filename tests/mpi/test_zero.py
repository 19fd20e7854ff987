"""ZeRO stages 1-3 on real MPI ranks: equivalence with one rank and with DDP, bytes
equal to the formula, memory equal to the ownership rule, reduce-scatters during
backward, and bad input.

Run under ``mpiexec -n 1|2|3|4 python -m pytest --with-mpi tests/mpi/test_zero.py``.
Every rank trains the N-rank run AND computes the one-rank reference itself (the
harness of test_ddp.py), so nothing is compared across processes but the results.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from test_ddp import GPT, _world, assert_close, ddp, reference, train

pytestmark = pytest.mark.mpi

# Units of 64 and 27 elements: for N = 2, 3 and 4 some unit's length is not a multiple
# of N, so shards are uneven and cut through parameters.
MLP = {"kind": "mlp", "sizes": [7, 8, 3]}
SMALL = 16 * 8 / 2**20       # 16 float64 elements: every unit is a group of its own
ONE_GROUP = 25.0             # every unit in one group


def zero(stage, **opts):
    from hpcdp.config_parallel import ZeroConfig
    from hpcdp.strategies.zero import make_zero
    return make_zero(ZeroConfig(stage=stage, **opts), timeout=60.0)


_REFS: dict = {}


def ref(cfg, optim, batches, dtype="float64"):
    """The one-rank reference (cached: several tests compare with the same one)."""
    key = (str(cfg), optim, batches, dtype)
    if key not in _REFS:
        _REFS[key] = reference(cfg, optim=optim, batches=batches, dtype=dtype)
    return _REFS[key]


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("accum", [1, 3])
def test_mlp_equals_one_rank_float64(stage, optim, accum):
    got, stats, _ = train(MLP, zero(stage, bucket_mb=SMALL), _world(), accum=accum, optim=optim)
    assert_close(got, ref(MLP, optim, (12, 12, 12)), 1e-12)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("accum,bucket", [(1, SMALL), (2, ONE_GROUP)])
def test_gpt_equals_one_rank_float64(stage, optim, accum, bucket):
    batches = (8, 8, 8)
    got, _, _ = train(GPT, zero(stage, bucket_mb=bucket, prefetch=2), _world(), accum=accum,
                      optim=optim, batches=batches)
    assert_close(got, ref(GPT, optim, batches), 1e-12)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_equals_ddp_on_the_same_ranks_with_uneven_slices(stage):
    """10 and 7 samples do not divide over 3 or 4 ranks; the last batch is short."""
    batches = (10, 10, 7)
    got, _, _ = train(GPT, zero(stage, bucket_mb=SMALL, prefetch=0), _world(), accum=2,
                      optim="adamw", batches=batches)
    want, _, _ = train(GPT, ddp(bucket_mb=SMALL), _world(), accum=2, optim="adamw", batches=batches)
    assert_close(got, want, 1e-12)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_float32_equals_one_rank_to_float_tolerance(stage, model):
    cfg = MLP if model == "mlp" else GPT
    got, _, _ = train(cfg, zero(stage, bucket_mb=SMALL / 2), _world(), accum=2, optim="adamw",
                      dtype="float32", batches=(8, 8, 8))
    assert_close(got, ref(cfg, "adamw", (8, 8, 8), "float32"), 2e-5)


@pytest.mark.parametrize("stage", [1, 3])
def test_parameters_straddle_shard_boundaries(stage):
    """The shards really cut through parameters and the units' lengths do not divide
    by N, so the equivalence tests above cover straddling and uneven shards."""
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD
    world = _world()
    strat = zero(stage, bucket_mb=SMALL)
    model = build_model(MLP, dtype="float64", seed=7)
    strat.setup(model.flat, SGD(lr=0.1, dtype="float64"), world)
    owned = strat.owned_ranges("optim")
    strat.close()
    cuts = {o for o, _ in owned} | {o + s for o, s in owned}
    inside = [s.name for s in model.flat.layout for c in cuts if s.offset < c < s.offset + s.size]
    if world.size > 1:
        assert inside, "no parameter straddles a shard boundary"
        assert any(u.size % world.size for u in model.flat.units)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_16bit_wire_is_close_to_the_float32_wire_with_half_the_bytes(stage, wire):
    """comm_dtype: the reduce-scatters (and stage 3's unit gathers) carry 16-bit values;
    master weights and Adam state stay float32. Tolerance: test_ddp.WIRE_RTOL."""
    from test_ddp import WIRE_RTOL

    world = _world()
    kw = dict(accum=2, optim="sgd", dtype="float32", batches=(8, 8, 8))
    want, s32, _ = train(GPT, zero(stage, bucket_mb=SMALL / 2), world, **kw)
    strat = zero(stage, bucket_mb=SMALL / 2, comm_dtype=wire)
    got, s16, _ = train(GPT, strat, world, **kw)
    state = strat.optimizer.state_arrays()  # Adam's moments: float32, this rank's shard only
    assert state and all(np.dtype(a.dtype) == np.float32 and a.size == strat.shard_numel
                         for a in state.values())
    if world.size == 1:
        assert np.array_equal(got, want)
        return
    assert not np.array_equal(got, want)
    assert_close(got, want, WIRE_RTOL[wire] * (2 if stage == 3 else 1))
    for a, b in zip(s16, s32):
        assert 2 * a["grad_bytes_sent"] == b["grad_bytes_sent"] > 0
        gathers = (b["bytes_sent"] - b["grad_bytes_sent"], a["bytes_sent"] - a["grad_bytes_sent"])
        # stage 3 gathers units on the wire (working copies); stages 1-2 gather the master
        # replica after the update in float32
        assert gathers[1] * (2 if stage == 3 else 1) == gathers[0]


# -- bytes -----------------------------------------------------------------------------

@pytest.mark.parametrize("stage,accum", [(1, 1), (1, 3), (2, 1), (2, 3), (3, 1), (3, 2)])
def test_ledger_bytes_equal_the_formula_exactly(stage, accum):
    from hpcdp.comm.model.volume import zero_step_bytes

    world = _world()
    strat = zero(stage, bucket_mb=SMALL, prefetch=1)
    _, stats, flat = train(GPT, strat, world, accum=accum, batches=(8, 8, 8))
    sizes = [b.size for b in strat.plan.buckets]
    sent, recv = zero_step_bytes(stage, sizes, world.size, world.rank, 8, micro_batches=accum)
    for s in stats:
        assert (s["bytes_sent"], s["bytes_recv"]) == (sent, recv)
    if stage in (1, 2) and accum == 1:
        # the same bytes as DDP's allreduce over all ranks: 2(N-1) x gradient bytes
        tot = np.array([sent], dtype=np.int64)
        allt = np.empty_like(tot)
        world.comm.Allreduce(tot, allt)
        assert allt[0] == 2 * (world.size - 1) * flat.nbytes
    if stage == 3:  # the unit gathers' in-flight time covers the time blocked on them
        for s in stats:
            assert 0 < s["gather_s"] and 0 <= s["gather_wait_s"] <= s["gather_s"] + 0.05
    if stage == 3 and accum == 1:
        tot = np.array([sent], dtype=np.int64)
        allt = np.empty_like(tot)
        world.comm.Allreduce(tot, allt)
        assert allt[0] == 3 * (world.size - 1) * flat.nbytes


def test_stage2_reduce_scatters_start_during_backward():
    """Event order: the first reduce-scatter is launched before the last gradient of
    the backward is final (the embeddings' are last), in every step."""
    world = _world()
    strat = zero(2, bucket_mb=SMALL)
    events = []
    real_rs = type(strat)._reduce_scatter

    def spy(self, buf):
        events.append("rs")
        return real_rs(self, buf)

    strat._reduce_scatter = spy.__get__(strat)
    orig_setup = strat.setup

    def setup(flat, optimizer, w):
        orig_setup(flat, optimizer, w)
        for name, p in flat.params.items():
            p.register_grad_ready_hook(lambda q, name=name: events.append(name))
    strat.setup = setup
    _, stats, _ = train(GPT, strat, world, batches=(8, 8))
    # step 1: the tied wte's gradient is the last to be final (its embedding use)
    assert events.index("rs") < events.index("wte.weight")
    assert all(s["buckets_in_backward"] >= 1 for s in stats)


# -- memory ------------------------------------------------------------------------------

MEM_GPT = {"kind": "gpt", "vocab_size": 64, "block_size": 16, "n_layer": 6, "n_head": 2,
           "n_embd": 32, "tied_head": True, "dropout": 0.0}


def _mem_run(strategy_obj, world, stage):
    """Build lazily (as train.py does), train 2 steps, return (tracker figures, flat)."""
    from hpcdp.autograd import Tensor
    from hpcdp.backend import get_backend
    from hpcdp.nn import build_model
    from hpcdp.optim import AdamW
    from hpcdp.step import LocalBatch, train_step

    gc.collect()
    mem = get_backend("cpu").memory
    base = dict(mem.live)
    mem.reset_peak()
    model = build_model(MEM_GPT, dtype="float32", seed=1, storage=())
    model.flat.materialize(strategy_obj.full_storage)
    strategy_obj.setup(model.flat, AdamW(lr=1e-3, dtype="float32"), world)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 64, (8, 16)), rng.integers(0, 64, (8, 16))
    for _ in range(2):
        train_step(model, strategy_obj, LocalBatch([np.arange(2)], 2 * world.size, np.arange(1)),
                   lambda i: (Tensor(x[i]), Tensor(y[i])))
    live = {k: mem.live[k] - base[k] for k in mem.live}
    peak = {k: mem.peak[k] - base[k] for k in mem.peak}
    strategy_obj.close()
    return live, peak, model.flat


@pytest.mark.parametrize("engine", ["default", "compiled"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_persistent_memory_equals_the_ownership_rule_and_the_formula(stage, engine):
    from hpcdp.comm import set_engine
    from hpcdp.comm.engines.registry import asked
    from hpcdp.comm.core.context import get_context
    from hpcdp.memcheck import state_bytes
    from hpcdp.strategies.zero.groups import group_ranges

    world = _world()
    N = world.size
    strat = ddp() if stage == 0 else zero(stage, bucket_mb=0.05, prefetch=1)
    # "compiled": the engine's progress thread must hold no finished request (and so no
    # buffer of an earlier run) while it waits, or the tracker's deltas come out short
    before = asked(get_context(world.comm))
    set_engine(world.comm, before if engine == "default" else "compiled")
    try:
        live, peak, flat = _mem_run(strat, world, stage)
    finally:
        set_engine(world.comm, before)
    psi = flat.numel
    groups = [(0, psi)] if stage == 0 else group_ranges(strat.plan)
    exact = state_bytes(stage, groups, N, world.rank, 4, 2)
    assert (live["params"], live["grads"], live["optim"]) == (exact["params"], exact["grads"], exact["optim"])
    formula = {0: 16 * psi, 1: 8 * psi + 8 * psi / N, 2: 4 * psi + 12 * psi / N, 3: 16 * psi / N}[stage]
    persistent = live["params"] + live["grads"] + live["optim"]
    assert abs(persistent - formula) <= 0.05 * formula, (persistent, formula)
    assert live["working"] == 0  # nothing left in flight between steps
    if stage >= 2:  # no full-size gradient buffer, ever
        assert peak["grads"] == exact["grads"]
        assert exact["grads"] < 4 * psi or N == 1
    if stage == 3:
        # no full parameter buffer, ever: only the shard is tagged "params" ...
        assert peak["params"] == exact["params"]
        # ... and the working set is the documented one: the root unit (parameters
        # and gradients) + the current and the prefetched block + 2 block gradients
        units = {u.name: u.size for u in flat.units}
        block = max(v for k, v in units.items() if k != "root")
        bound = 4 * (2 * units["root"] + 2 * block + 2 * block)
        assert 0 < peak["working"] <= bound, (peak["working"], bound)
        assert peak["working"] < 4 * psi  # less than one full parameter buffer


# -- bad input ---------------------------------------------------------------------------

def test_stage3_with_a_model_that_cannot_be_split_is_an_error_on_every_rank():
    from hpcdp.config_error import ConfigError
    from hpcdp.nn.params import FlatParams
    from hpcdp.optim import SGD

    flat = FlatParams.from_arrays([("a", np.ones(5)), ("b", np.ones(3))], dtype="float64")
    for stage in (2, 3):
        with pytest.raises(ConfigError, match=rf"parallel.zero.stage = {stage} needs a model that "
                                              "splits into units.*no model"):
            zero(stage).setup(flat, SGD(lr=0.1, dtype="float64"), _world())


def _swap_blocks_on_last_rank(model, world, how):
    if world.rank == world.size - 1:
        model.h = list(reversed(model.h)) if how == "order" else [model.h[0]] + list(model.h)


@pytest.mark.parametrize("how", ["order", "count"])
def test_units_in_a_different_order_or_number_are_a_named_error_on_every_rank(how):
    from hpcdp.strategies.zero import UnitOrderMismatch

    world = _world()
    if world.size == 1:
        pytest.skip("needs several ranks")
    with pytest.raises(UnitOrderMismatch) as e:
        _train_modified(zero(3), world, lambda m: _swap_blocks_on_last_rank(m, world, how))
    msg = str(e.value)
    assert f"rank {world.size - 1}:" in msg and "ranks disagree on the next unit" in msg
    assert ("unit 'h.1'" in msg) and ("unit 'h.0'" in msg if how == "order" else True)


def test_debug_mode_checks_the_unit_order_on_every_step():
    from hpcdp.config_parallel import ZeroConfig
    from hpcdp.strategies.zero import UnitOrderMismatch, make_zero

    world = _world()
    if world.size == 1:
        pytest.skip("needs several ranks")
    strat = make_zero(ZeroConfig(stage=3), timeout=60.0, debug=True)
    with pytest.raises(UnitOrderMismatch, match="step 3"):
        _train_modified(strat, world, lambda m: None,
                        at_step=(3, lambda m: _swap_blocks_on_last_rank(m, world, "order")))


def _train_modified(strat, world, modify, at_step=None):
    from hpcdp.autograd import Tensor
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD
    from hpcdp.step import LocalBatch, train_step

    model = build_model(GPT, dtype="float64", seed=7, storage=())
    modify(model)
    strat.setup(model.flat, SGD(lr=0.1, dtype="float64"), world)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (4, 5)), rng.integers(0, 11, (4, 5))
    try:
        for step in range(1, 4):
            if at_step is not None and step == at_step[0]:
                at_step[1](model)
            train_step(model, strat, LocalBatch([np.arange(2)], 2 * world.size, np.arange(1)),
                       lambda i: (Tensor(x[i]), Tensor(y[i])))
    finally:
        strat.close()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_nonfinite_gradient_in_one_shard_is_skipped_on_every_rank(stage):
    """train.on_nonfinite = "skip": the guard wraps optimizer.step; each rank holds a
    different shard, so the decision is taken on the global norm: a NaN in rank 0's
    shard alone makes every rank skip the same update (parameters unchanged)."""
    from hpcdp.autograd import Tensor
    from hpcdp.failure.nonfinite import NonFiniteGuard
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD
    from hpcdp.step import LocalBatch, train_step

    world = _world()
    strat = zero(stage, bucket_mb=SMALL)
    model = build_model(MLP, dtype="float64", seed=7, storage=())
    model.flat.materialize(strat.full_storage)
    opt = SGD(lr=0.1, dtype="float64")
    guard = NonFiniteGuard("skip", world.rank)
    guard.guard(opt)
    strat.setup(model.flat, opt, world)
    finish = strat.finish_gradients

    def poisoned_finish():
        finish()
        if world.rank == 0:  # only rank 0's shard goes bad
            g = strat.gshard if stage >= 2 else strat.flat.grad[strat.mine[0][0]:]
            g[0] = np.nan
    strat.finish_gradients = poisoned_finish
    before = np.array(strat.gather_full_params())
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 7)), rng.integers(0, 3, 8)
    train_step(model, strat, LocalBatch([np.arange(2)], 2 * world.size, np.arange(1)),
               lambda i: (Tensor(x[i]), Tensor(y[i])))
    after = np.array(strat.gather_full_params())
    strat.close()
    assert guard.total_skipped == 1  # on every rank (the harness agrees outcomes)
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("stage", [2, 3])
def test_mpi_collectives_for_small_groups_give_the_same_weights(stage):
    """algorithm = "auto": groups below comm's crossover go through MPI's own
    reduce-scatter and all-gather (uneven chunks included); the result is the same."""
    got, _, _ = train(GPT, zero(stage, bucket_mb=SMALL, algorithm="auto"), _world(), accum=2,
                      optim="adamw", batches=(8, 8, 8))
    assert_close(got, ref(GPT, "adamw", (8, 8, 8)), 1e-12)


# -- hybrid sharding (parallel.zero.shard = "node") ------------------------------------
# HPCDP_RANKS_PER_NODE emulates nodes on one machine: 2 per node where the world size is
# even (4 ranks: 2 nodes x 2), else 1 (every rank a node: the state fully replicated).

@pytest.fixture
def nodes(monkeypatch):
    from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV
    world = _world()
    per = 2 if world.size % 2 == 0 else 1
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(per))
    return world, world.size // per, per


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_equals_one_rank_and_ddp_and_its_ledger_the_formula(stage, nodes):
    from hpcdp.strategies.zero.hybrid import hybrid_step_bytes

    world, M, L = nodes
    batches = (10, 10, 7)
    strat = zero(stage, bucket_mb=SMALL, prefetch=1, shard="node")
    got, stats, flat = train(GPT, strat, world, accum=2, optim="adamw", batches=batches)
    assert (strat.shard_size, strat.shard_rank) == (L, world.rank % L)
    assert_close(got, ref(GPT, "adamw", batches), 1e-12)
    want, _, _ = train(GPT, ddp(bucket_mb=SMALL), world, accum=2, optim="adamw", batches=batches)
    assert_close(got, want, 1e-12)
    # bytes per link kind, exactly the formula (every step)
    sizes = [b.size for b in strat.plan.buckets]
    expect = hybrid_step_bytes(stage, sizes, M, L, world.rank // L, world.rank % L, 8, micro_batches=2)
    led = strat.ledger.totals()
    steps = len(batches)
    for kind, names in (("intra", ("reduce_scatter.intra", "all_gather.intra")),
                        ("inter", ("reduce_scatter.inter",))):
        sent = sum(led.get(n, {}).get("sent_bytes", 0) for n in names)
        recv = sum(led.get(n, {}).get("recv_bytes", 0) for n in names)
        assert (sent, recv) == (steps * expect[kind][0], steps * expect[kind][1]), kind
    assert "reduce_scatter" not in led and "all_gather" not in led  # every byte has its link kind
    for s in stats:
        assert s["bytes_sent"] == expect["intra"][0] + expect["inter"][0]


def test_hybrid_carries_the_16bit_wire_on_both_link_kinds(nodes):
    """shard = "node" with comm_dtype: the node reduce-scatter, the cross-node allreduce
    and stage 3's node gathers all carry 16-bit values: every byte halves."""
    from test_ddp import WIRE_RTOL

    world, M, L = nodes
    kw = dict(accum=2, optim="sgd", dtype="float32", batches=(8, 8, 8))
    want, s32, _ = train(GPT, zero(3, bucket_mb=SMALL / 2, shard="node"), world, **kw)
    got, s16, _ = train(GPT, zero(3, bucket_mb=SMALL / 2, shard="node", comm_dtype="bfloat16"),
                        world, **kw)
    if world.size == 1:
        assert np.array_equal(got, want)
        return
    assert_close(got, want, 2 * WIRE_RTOL["bfloat16"])
    for a, b in zip(s16, s32):
        assert 2 * a["bytes_sent"] == b["bytes_sent"] > 0


def test_shard_world_is_the_default_bit_for_bit():
    batches = (8, 8, 8)
    a, _, _ = train(GPT, zero(3, bucket_mb=SMALL), _world(), accum=2, optim="adamw", batches=batches)
    b, _, _ = train(GPT, zero(3, bucket_mb=SMALL, shard="world"), _world(), accum=2, optim="adamw",
                    batches=batches)
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("stage", [1, 3])
def test_hybrid_memory_divides_by_ranks_per_node_exactly(stage, nodes):
    from hpcdp.memcheck import state_bytes
    from hpcdp.strategies.zero.groups import group_ranges

    world, M, L = nodes
    strat = zero(stage, bucket_mb=0.05, prefetch=1, shard="node")
    live, _, flat = _mem_run(strat, world, stage)
    exact = state_bytes(stage, group_ranges(strat.plan), L, world.rank % L, 4, 2)
    assert (live["params"], live["grads"], live["optim"]) == (exact["params"], exact["grads"], exact["optim"])
    assert strat.state_ranks(world) == L
    psi = flat.numel
    formula = {1: 8 * psi + 8 * psi / L, 3: 16 * psi / L}[stage]
    assert abs(live["params"] + live["grads"] + live["optim"] - formula) <= 0.05 * formula


def test_a_node_size_that_does_not_divide_the_world_is_a_clear_error(monkeypatch):
    from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV
    from hpcdp.config_error import ConfigError
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD

    world = _world()
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(world.size + 1))
    model = build_model(MLP, dtype="float64", seed=7)
    if world.size == 1:
        pytest.skip("every node size but 1 is larger than one rank; 1 divides it")
    with pytest.raises(ConfigError, match=rf"{RANKS_PER_NODE_ENV}={world.size + 1} does not divide the "
                                          rf"{world.size} ranks.*parallel.zero.shard = \"world\""):
        zero(1, shard="node").setup(model.flat, SGD(lr=0.1, dtype="float64"), world)


@pytest.mark.parametrize("stage", [1, 3])
def test_hybrid_with_mpi_collectives_for_small_groups_gives_the_same_weights(stage, nodes):
    """algorithm = "auto" in the node and across: MPI's own collectives for small groups
    (the lean path) record under the same link-kind names."""
    world, M, L = nodes
    strat = zero(stage, bucket_mb=SMALL, algorithm="auto", shard="node")
    got, _, _ = train(GPT, strat, world, accum=2, optim="adamw", batches=(8, 8, 8))
    assert_close(got, ref(GPT, "adamw", (8, 8, 8)), 1e-12)
    names = set(strat.ledger.totals())
    assert not names & {"reduce_scatter", "all_gather", "allreduce"}
    if L > 1:
        assert {"reduce_scatter.intra", "all_gather.intra"} <= names
    if M > 1:
        assert "reduce_scatter.inter" in names

@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("algorithm", ["recursive", "hierarchical", "auto-profile"])
def test_few_step_collectives_equal_ddp_and_one_rank(stage, algorithm, monkeypatch):
    """Recursive halving / doubling, the hierarchical reduce-scatter / all-gather (2
    emulated nodes on an even world) and "auto" with a machine profile (the cost model
    picks per group/unit) leave every shard at its ring chunk: the weights equal DDP's
    and one rank's, uneven slices and a short last batch included."""
    from mpi4py import MPI

    from hpcdp.comm.auto import forget

    N = MPI.COMM_WORLD.Get_size()
    if N % 2 == 0:
        monkeypatch.setenv("HPCDP_RANKS_PER_NODE", str(N // 2))
    name = algorithm
    if algorithm == "auto-profile":
        monkeypatch.setenv("HPCDP_PROFILE", "example-cluster")
        name = "auto"
    forget()
    try:
        batches = (10, 10, 7)
        got, _, _ = train(GPT, zero(stage, bucket_mb=SMALL, algorithm=name), _world(), accum=2,
                          optim="adamw", batches=batches)
        want, _, _ = train(GPT, ddp(bucket_mb=SMALL), _world(), accum=2, optim="adamw",
                           batches=batches)
    finally:
        monkeypatch.undo()
        forget()
    assert_close(got, want, 1e-12)
    assert_close(got, ref(GPT, "adamw", batches), 1e-12)
