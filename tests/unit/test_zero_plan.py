"""ZeRO without MPI: [parallel.zero] options and their errors, group planning, the
exact memory prediction, and the stage byte formula with micro-batches."""

import pytest

from hpcdp.comm.model.volume import all_gather_bytes, reduce_scatter_bytes, zero_step_bytes
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
    (["parallel.ps.servers=2"], r"parallel.ps.servers: parallel.strategy is 'zero', which does not read "
                                r"\[parallel.ps\]"),
])
def test_bad_options_name_the_key(sets, msg):
    with pytest.raises(ConfigError, match=msg):
        zcfg(*sets)


def test_ps_with_zero_options_is_refused_too():
    with pytest.raises(ConfigError, match=r"parallel.zero.stage: parallel.strategy is 'ps', which does not "
                                          r"read \[parallel.zero\]"):
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


def test_the_zero_papers_figure_1_mixed_precision_adam_arithmetic():
    """Rajbhandari et al. (2020), Figure 1: Psi = 7.5 B, N = 64, K = 12 (fp32 master
    copy, Adam's m and v) with 16-bit parameters and gradients: 120, 31.4, 16.6 and
    1.9 GB per rank for DDP and stages 1, 2, 3."""
    from hpcdp.memcheck import mixed_state_bytes

    psi, N, g = 7_500_000_000, 64, [(0, 7_500_000_000)]
    gb = [mixed_state_bytes(s, g, N, 0, 2)["total"] / 1e9 for s in (0, 1, 2, 3)]
    assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]
    # the exact terms: (2 + 2 + K) Psi, 2 Psi + 2 Psi + K Psi / N, 2 Psi + (2 + K) Psi / N, 16 Psi / N
    k = 12
    assert mixed_state_bytes(0, g, N, 0, 2)["total"] == (2 + 2 + k) * psi
    assert mixed_state_bytes(1, g, N, 0, 2)["total"] == 4 * psi + k * psi / N
    assert mixed_state_bytes(2, g, N, 0, 2)["total"] == 2 * psi + (2 + k) * psi / N
    assert mixed_state_bytes(3, g, N, 0, 2)["total"] == (2 + 2 + k) * psi / N
    # the optimizer state (master copy and moments) is what stage 1 shards
    assert mixed_state_bytes(1, g, N, 0, 2)["optim"] == k * psi / N
    # SGD with momentum: K = 8; without: K = 4 (the master copy alone)
    assert mixed_state_bytes(0, g, N, 0, 1)["total"] == 12 * psi
    assert mixed_state_bytes(3, g, N, 0, 0)["total"] == 8 * psi / N
    # the full-precision formulas stay the default (fp32: 16 Psi, 4 + 4 + 8 / N, ...)
    assert state_bytes(1, g, N, 0, 4, 2)["total"] == 8 * psi + 8 * psi / N


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (4, 8), (1, 4), (3, 1)])
def test_hybrid_state_divides_by_ranks_per_node(nodes, per_node):
    """Hybrid sharding: the ownership rule over the node's L ranks, the same on every
    node (the state is replicated across nodes)."""
    psi = 4 * 3 * 5 * 7 * 16
    g = [(0, psi)]
    L = per_node
    for stage, want in ((1, 8 * psi + 8 * psi // L), (2, 4 * psi + 12 * psi // L), (3, 16 * psi // L)):
        assert state_bytes(stage, g, L, 0, 4, 2)["total"] == want


def test_hybrid_inter_node_bytes_against_zero3s_flat_ring():
    """Hybrid's bytes per link kind (its ledger's formula) against the flat ring's
    ZeRO-3 on the same node-ordered ranks, where only a rank whose ring successor is
    on the next node sends across. Per rank (each rank's own link): the busiest
    hybrid rank moves at most 1/L of the busiest flat rank's inter-node bytes
    (2(M-1)/(M L) against 3(N-1)/N of Psi). Per job (a node's links shared by its
    ranks): hybrid moves 2(M-1) Psi across, the flat ring M 3(N-1)/N Psi: less, but
    not 1/L (the flat ring crosses only M times)."""
    from hpcdp.comm.model.volume import zero_step_bytes
    from hpcdp.strategies.zero.hybrid import hybrid_step_bytes

    sizes = [1000, 357, 64]
    psi = sum(sizes) * 4
    for M, L in ((2, 2), (4, 8), (8, 4), (2, 16)):
        N = M * L
        flat = [zero_step_bytes(3, sizes, N, r, 4)[0] if (r + 1) % L == 0 else 0 for r in range(N)]
        per = [hybrid_step_bytes(3, sizes, M, L, r // L, r % L, 4) for r in range(N)]
        hyb = [p["inter"][0] for p in per]
        assert max(hyb) <= max(flat) / L
        for kind in ("intra", "inter"):  # sent equals received over the job, per link kind
            assert sum(p[kind][0] for p in per) == sum(p[kind][1] for p in per)
        assert sum(hyb) == 2 * (M - 1) * psi  # every shard allreduced across nodes once
        assert abs(sum(flat) - M * 3 * (N - 1) / N * psi) <= 3 * M * N * 4  # uneven chunks
        assert sum(hyb) < sum(flat)
    # at 2 nodes x 2 ranks the job total meets 1/L as well: 2 Psi against 4.5 Psi
    flat = sum(zero_step_bytes(3, sizes, 4, r, 4)[0] for r in (1, 3))
    assert sum(hybrid_step_bytes(3, sizes, 2, 2, r // 2, r % 2, 4)["inter"][0] for r in range(4)) <= flat / 2


def test_the_cluster_measurement_script_predicts_hybrid_and_flat_inter_node_bytes():
    """jobs/zero_hybrid_cluster.py's prediction column: per node and step, ZeRO-3's flat
    ring sends 3 (N-1)/N Psi across at 2 nodes x 2 ranks, hybrid 2 (M-1)/M Psi; a
    250 Mbit/s link makes both slower, the flat ring more."""
    import subprocess
    import sys
    from pathlib import Path

    ROOT = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(ROOT / "jobs"))
    try:
        import zero_hybrid_cluster as z
    finally:
        sys.path.pop(0)
    psi4 = 805_632 * 4
    fast = {lay: z.predict(lay, "none", 4) for lay in ("flat", "hybrid")}
    slow = {lay: z.predict(lay, "250mbit", 4) for lay in ("flat", "hybrid")}
    assert fast["flat"]["inter"] == 3 * 3 / 4 * psi4 and fast["hybrid"]["inter"] == psi4
    assert slow["flat"]["step_ms"] - fast["flat"]["step_ms"] > slow["hybrid"]["step_ms"] - fast["hybrid"]["step_ms"] > 0
    # the few-step variants: the hierarchical collectives cross with the node's slice only
    # (3 collectives x (M-1)/M x Psi per node); recursive halving / doubling's first
    # exchange, at distance N/2 = 2, crosses with half the buffer from each of the node's
    # 2 ranks (3 collectives x Psi per node: the veth carried 10.27 MB, docs/results.md)
    assert z.predict("flat-hierarchical", "none", 4)["inter"] == 3 * 1 / 2 * psi4
    assert z.predict("flat-recursive", "none", 4)["inter"] == 3 * psi4
    out = subprocess.run([sys.executable, str(ROOT / "jobs/zero_hybrid_cluster.py"), "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "--rates" in out.stdout


def test_inflight_union_counts_overlapping_gathers_once():
    from hpcdp.strategies.zero.stage3 import inflight_union

    spans = [(0.0, 2.0), (1.0, 3.0),  # overlapping: [0, 3]
             (1.5, 2.5),              # inside it
             (5.0, 6.0)]
    assert inflight_union(spans) == 4.0
    assert inflight_union([]) == 0.0
