"""ZeRO without MPI: [parallel.zero] options and their errors, group planning, the
exact memory prediction, and the stage byte formula with micro-batches."""

import pytest

from hpcdp.comm.volume import all_gather_bytes, reduce_scatter_bytes, zero_step_bytes
from hpcdp.config_error import ConfigError
from hpcdp.config import load_config
from hpcdp.memcheck import state_bytes
from hpcdp.nn import build_model
from hpcdp.strategies.zero.groups import group_ranges, plan_groups, plan_unit_groups


def zcfg(*sets):
    return load_config(None, ["parallel.strategy=zero", *sets]).parallel.sub()


def test_defaults_and_options():
    c = zcfg()
    assert (c.stage, c.bucket_mb, c.prefetch, c.overlap) == (1, 25.0, 1, True)
    assert zcfg("parallel.zero.stage=3", "parallel.zero.prefetch=0").prefetch == 0


@pytest.mark.parametrize("sets, msg", [
    (["parallel.zero.stage=4"], "parallel.zero.stage: 4 is not allowed; choose one of 1, 2, 3"),
    (["parallel.zero.stage=\"two\""], "parallel.zero.stage: 'two' is not allowed; choose one of 1, 2, 3"),
    (["parallel.zero.prefetch=-1"], r"parallel.zero.prefetch: -1 is out of range; allowed \[0, inf\)"),
    (["parallel.zero.bucket_mb=0"], "parallel.zero.bucket_mb: 0.0 is out of range"),
    (["parallel.zero.shards=2"], "parallel.zero.shards: unknown key"),
    (["parallel.ps.servers=2"], r"parallel.ps: a \[parallel.ps\] table with parallel.strategy = 'zero'"),
])
def test_bad_options_name_the_key(sets, msg):
    with pytest.raises(ConfigError, match=msg):
        zcfg(*sets)


def test_ps_with_zero_options_is_refused_too():
    with pytest.raises(ConfigError, match=r"parallel.zero: .*has no parameter server"):
        load_config(None, ["parallel.strategy=ps", "parallel.zero.stage=2"])


GPT = {"kind": "gpt", "vocab_size": 11, "block_size": 5, "n_layer": 3, "n_head": 2, "n_embd": 8}


def test_groups_are_whole_units_cut_from_the_end():
    flat = build_model(GPT, storage=()).flat
    units = [(u.offset, u.size) for u in flat.units]   # root 144, blocks 872 each
    assert sorted((b.offset, b.size) for b in plan_unit_groups(flat).buckets) == units
    assert [b.offset for b in plan_unit_groups(flat).buckets] == [u[0] for u in reversed(units)]
    # cap of two blocks: h.2 + h.1, then h.0 + root (1016 <= 1744)
    two = plan_groups(flat, 2 * 872)
    assert [(b.offset, b.size) for b in two.buckets] == [(144 + 872, 1744), (0, 1016)]
    # a cap smaller than every unit: one group per unit, never a split unit
    assert group_ranges(plan_groups(flat, 10)) == units
    # one group for everything
    assert group_ranges(plan_groups(flat, 10**9)) == [(0, flat.numel)]


@pytest.mark.parametrize("N", [1, 2, 3, 4, 7])
def test_state_bytes_are_the_formulas_when_n_divides(N):
    psi = 4 * 3 * 5 * 7 * 16  # divisible by every N here
    g = [(0, psi)]
    assert state_bytes(0, g, N, 0, 4, 2)["total"] == 16 * psi
    assert state_bytes(1, g, N, 0, 4, 2)["total"] == 4 * psi + 4 * psi + 8 * psi // N
    assert state_bytes(2, g, N, 0, 4, 2)["total"] == 4 * psi + 12 * psi // N
    assert state_bytes(3, g, N, 0, 4, 2)["total"] == 16 * psi // N


def test_state_bytes_with_uneven_groups_sum_to_the_whole():
    groups = [(0, 7), (7, 13), (20, 5)]
    for stage in (1, 2, 3):
        parts = [state_bytes(stage, groups, 3, r, 8, 1) for r in range(3)]
        assert sum(p["optim"] for p in parts) == 25 * 8
        if stage >= 2:
            assert sum(p["grads"] for p in parts) == 25 * 8


def test_zero_bytes_with_micro_batches():
    sizes, N, r, b = [10, 7], 3, 1, 4
    rs = [reduce_scatter_bytes(n, N, r, b) for n in sizes]
    ag = [all_gather_bytes(n, N, r, b) for n in sizes]
    sent = lambda k_rs, k_ag: sum(k_rs * x[0] for x in rs) + sum(k_ag * x[0] for x in ag)  # noqa: E731
    assert zero_step_bytes(1, sizes, N, r, b, micro_batches=3)[0] == sent(1, 1)
    assert zero_step_bytes(2, sizes, N, r, b, micro_batches=3)[0] == sent(3, 1)
    assert zero_step_bytes(3, sizes, N, r, b, micro_batches=3)[0] == sent(3, 6)
