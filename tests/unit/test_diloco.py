"""DiLoCo's pure parts: options, fragments and their schedule, the 8-bit wire, the
byte formulas (tests/mpi/test_diloco.py runs the strategy on real ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config_parallel import DiLoCoConfig
from hpcdp.strategies.diloco import wire as W
from hpcdp.strategies.diloco.fragments import Schedule, check_tiling, plan_fragments


@pytest.mark.parametrize("kw,words", [
    ({"groups": "rack"}, "parallel.diloco.groups"),
    ({"groups": 0}, "parallel.diloco.groups"),
    ({"inner": "ps"}, "parallel.diloco.inner"),
    ({"sync_every": 0}, "parallel.diloco.sync_every"),
    ({"sync_every": 10, "fragments": 3}, "does not divide parallel.diloco.sync_every"),
    ({"sync_every": 8, "fragments": 4, "overlap": 2}, "must be < sync_every / fragments = 2"),
    ({"outer_momentum": 0.0}, "parallel.diloco.outer_nesterov"),
    ({"outer_dtype": "int4"}, "parallel.diloco.outer_dtype"),
    ({"mixing": 1.0}, "parallel.diloco.mixing"),
    ({"outer_lr": 0.0}, "parallel.diloco.outer_lr"),
])
def test_options_refused_naming_the_key(kw, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("(", r"\(")):
        DiLoCoConfig(**kw)


def test_exact_mode_refused_and_config_parses():
    from hpcdp.config import config_from_dict
    raw = {"parallel": {"strategy": "diloco", "diloco": {"groups": 2, "sync_every": 4, "fragments": 2,
                                                          "overlap": 1, "outer_dtype": "int8"},
                        "ddp": {"bucket_mb": 1.0}}}
    cfg = config_from_dict(raw)
    assert cfg.parallel.sub().fragments == 2 and cfg.parallel.sub("ddp").bucket_mb == 1.0
    with pytest.raises(ConfigError, match="cannot be the same bits"):
        config_from_dict({**raw, "train": {"reproducible": "exact"}})


def _units(sizes):
    class U:
        def __init__(self, i, off, size):
            self.index, self.offset, self.size = i, off, size
    out, off = [], 0
    for i, s in enumerate(sizes):
        out.append(U(i, off, s))
        off += s
    return out, off


@pytest.mark.parametrize("sizes", [[5], [3, 3, 3, 3], [100, 1, 1, 1, 50, 2], [1, 2, 3, 4, 5, 6, 7]])
def test_fragments_cover_every_parameter_exactly_once(sizes):
    units, n = _units(sizes)
    for parts in range(1, len(sizes) + 1):
        frags = plan_fragments(units, n, parts)
        assert len(frags) == parts
        cover = np.zeros(n, dtype=int)
        for f in frags:
            cover[f.offset:f.offset + f.size] += 1
            # whole units only
            assert {u.index for u in units if f.offset <= u.offset < f.offset + f.size} == set(f.units)
        assert (cover == 1).all()
        check_tiling(frags, n)
    with pytest.raises(ValueError, match="at least"):
        plan_fragments(units, n, len(sizes) + 1)


def test_fragments_of_a_gpt_are_balanced_units():
    from hpcdp.nn import build_model
    model = build_model({"kind": "gpt", "vocab_size": 50, "block_size": 8, "n_layer": 4, "n_head": 2,
                         "n_embd": 16, "tied_head": True, "dropout": 0.0}, dtype="float32", seed=0)
    flat = model.flat
    frags = plan_fragments(flat.units, flat.numel, 3)
    check_tiling(frags, flat.numel)
    assert sorted(i for f in frags for i in f.units) == [u.index for u in flat.units]
    assert max(f.size for f in frags) < 0.6 * flat.numel


@pytest.mark.parametrize("H,P,tau", [(1, 1, 0), (6, 1, 0), (6, 3, 1), (8, 4, 1), (12, 2, 5)])
def test_schedule_each_fragment_once_per_H_sent_tau_before(H, P, tau):
    s = Schedule(H, P, tau)
    lands = {p: [] for p in range(P)}
    sends = {p: [] for p in range(P)}
    in_flight = 0
    for t in range(1, 5 * H + 1):
        q = s.sent_at(t)
        if q is not None:
            sends[q].append(t)
            in_flight += 1
        p = s.lands_at(t)
        if p is not None:
            lands[p].append(t)
            in_flight -= 1
        assert in_flight in (0, 1)                       # at most one exchange in flight
        if s.boundary(t):
            assert in_flight == 0                        # outer boundaries: nothing in flight
    for p in range(P):
        assert np.diff(lands[p]).tolist() == [H] * (len(lands[p]) - 1)
        assert [t + tau for t in sends[p]] == lands[p]
        assert lands[p][0] == (p + 1) * H // P
        assert s.last_landing(p, 5 * H) == lands[p][-1]
    if P == 1 and tau == 0:
        assert lands[0] == list(range(H, 5 * H + 1, H))  # plain DiLoCo


@pytest.mark.parametrize("groups", [1, 2, 3, 4, 8])
def test_int8_round_trip_error_bound(groups):
    rng = np.random.default_rng(groups)
    B = 64
    n = 1000  # a short last block
    k = W.levels(groups)
    xs = [(rng.standard_normal(n) * rng.uniform(0.01, 3.0, size=n)).astype(np.float32) for _ in range(groups)]
    xs[0][128:192] = 0.0                                  # an all-zero block
    absmax = np.max([W.block_absmax(x, B) for x in xs], axis=0)   # the shared scale (an allreduce max)
    step = W.steps(absmax, k)
    qs = [W.quantize(x, step, B, k) for x in xs]
    total = np.sum([q.astype(np.int64) for q in qs], axis=0)
    assert np.abs(total).max() <= 127                    # the sum fits int8: the ring adds exactly
    bound = np.repeat(absmax / (2 * k), B)[:n] * (1 + 1e-6) + 1e-12
    for x, q in zip(xs, qs):
        err = np.abs(W.dequantize(q, step, B) - x)
        assert (err <= bound).all(), err.max()
    mean = W.dequantize(total.astype(np.int8), step, B, scale=1.0 / groups)
    assert (np.abs(mean - np.mean(xs, axis=0)) <= bound).all()
    assert (W.dequantize(qs[0], step, B)[128:192] == 0).all()


def test_int8_refuses_too_many_groups():
    with pytest.raises(ValueError, match="at most 127 groups"):
        W.levels(128)


def test_outer_bytes_match_the_ring_formula():
    from hpcdp.strategies.diloco.exchange import outer_bytes
    n, M = 10_000, 4
    f32 = outer_bytes(n, M, 1, "float32")["outer"][0]
    assert f32 == 2 * (M - 1) * (n // M) * 4
    b8 = outer_bytes(n, M, 1, "int8", 256)
    assert b8["outer"][0] == 2 * (M - 1) * (n // M)
    assert b8["outer_scale"][0] > 0
    ratio = f32 / (b8["outer"][0] + b8["outer_scale"][0])
    assert 3.8 < ratio < 4.0
    assert outer_bytes(n, M, 1, "bfloat16")["outer"][0] * 2 == f32


def test_cost_model_prices_diloco_beside_ddp_on_a_slow_link():
    from hpcdp.comm.model.cost import Topology, load_profile
    from hpcdp.scale.model import Workload, diloco_step, step
    from hpcdp.scale.predict import diloco_options, link_rate, with_link

    n = 168_576
    wl = Workload("gpt", params=n, itemsize=4, buckets=[n // 2, n - n // 2], flops_per_sample=3e8,
                  optimizer_state=2, batch=32)
    slow = with_link(load_profile("emulated-cluster"), link_rate("10mbit"))
    assert slow.inter.beta_s_per_byte == pytest.approx(8 / 10e6)
    t = Topology.of(4, 2)
    ddp = step(slow, wl, "ddp", 4, 8, per_node=2)
    plain = diloco_step(slow, wl, t, 8, **diloco_options("diloco-H100"))
    int8 = diloco_step(slow, wl, t, 8, **diloco_options("diloco-H100-int8"))
    stream = diloco_step(slow, wl, t, 8, **diloco_options("diloco-H100-P4-T1"))
    # per node and step through the NIC: DDP's flat ring against 1/H of the outer exchange
    assert ddp.inter_bytes_node / plain.inter_bytes_node == pytest.approx(150, rel=0.01)
    assert ddp.inter_bytes_node / int8.inter_bytes_node > 300
    assert stream.inter_bytes_node == plain.inter_bytes_node   # the same bytes, in P pieces
    assert stream.exposed_s < plain.exposed_s < ddp.exposed_s
    assert plain.step_s < ddp.step_s / 5
    with pytest.raises(SystemExit, match="H<n>"):
        diloco_options("diloco-X3")
    with pytest.raises(SystemExit, match="overlap"):
        diloco_options("diloco-H8-P4-T2")
