"""The cost model (hpcdp.comm.model.cost: collectives; hpcdp.scale.model: steps) against hand-computed cases (no MPI)."""

import math

import pytest

from hpcdp.comm.model import cost as CM
from hpcdp.scale import model as M
from hpcdp.scale.predict import expand_ranks
from hpcdp.comm.model import volume as V

MiB = 1 << 20


def prof(**kw):
    base = dict(name="hand", intra={"alpha_s": 1e-6, "beta_s_per_byte": 1e-9},
                inter={"alpha_s": 1e-5, "beta_s_per_byte": 1e-8}, gamma_s_per_byte=1e-10,
                call_s={"ring": 0.0}, msg_s=0.0, ctrl_msg_s=0.0, flops_per_s=1e9,
                optimizer_s_per_param=0.0, ranks_per_node=4, nics_per_node=1, overlap=1.0)
    base.update(kw)
    return CM.profile_from_dict(base)


def test_ring_one_node_and_two_nodes():
    p, S = prof(), 4 * MiB  # 4 ranks: chunks of exactly one 1 MiB segment, one message per step
    one = CM.ring_allreduce(p, S, CM.Topology(1, 4))
    assert one.latency_s == pytest.approx(6 * 1e-6)
    assert one.bandwidth_s == pytest.approx(2 * 3 / 4 * S * 1e-9)
    assert one.reduce_s == pytest.approx(3 / 4 * S * 1e-10)
    assert one.total_s == pytest.approx(6e-6 + 6291456e-9 + 3145728e-10)
    assert one.intra == (6291456, 6291456) and one.inter == (0, 0)
    two = CM.ring_allreduce(p, S, CM.Topology(2, 2))  # spans nodes: every step at inter speed
    assert two.total_s == pytest.approx(6e-5 + 6291456e-8 + 3145728e-10)
    assert two.inter == (6291456, 6291456)


def test_hierarchical_two_by_two():
    p, S = prof(nics_per_node=2), 4 * MiB
    h = CM.hierarchical_allreduce(p, S, CM.Topology(2, 2))
    # intra: reduce-scatter + all-gather over 2 ranks, one step each of a 2 MiB chunk
    #        (2 segments): 4 messages, S bytes; inter: allreduce of 2 MiB over 2 nodes
    #        (1 MiB chunks): 2 messages, 2 MiB; reduced: S/2 + 1 MiB
    want = 4e-6 + S * 1e-9 + 2e-5 + 2 * MiB * 1e-8 + (S / 2 + MiB) * 1e-10
    assert h.total_s == pytest.approx(want)
    n = S // 4
    counts = V.hierarchical_bytes(n, 2, 2, 1, 1, 4)
    assert (h.intra, h.inter) == (counts["intra"], counts["inter"])
    assert h.total_s < CM.ring_allreduce(p, S, CM.Topology(2, 2)).total_s
    # one NIC for 2 ranks: the two cross-node rings share it, inter bandwidth time doubles
    shared = CM.hierarchical_allreduce(prof(nics_per_node=1), S, CM.Topology(2, 2))
    assert shared.bandwidth_s - h.bandwidth_s == pytest.approx(2 * MiB * 1e-8)


def test_software_terms_grow_with_the_group():
    p = prof(call_s={"ring": 1e-5, "recursive": 2e-5}, ctrl_msg_s=1e-6, msg_s=3e-6)
    r = CM.ring_allreduce(p, 8 * 4, CM.Topology(1, 8))  # 8 elements: one per rank
    assert r.software_s == pytest.approx(1e-5 + 14 * 3e-6)  # call, messages: nothing per peer
    dbg = CM.ring_allreduce(prof(call_s={"ring": 1e-5}, ctrl_msg_s=1e-6, msg_s=3e-6, debug=True),
                           8 * 4, CM.Topology(1, 8))
    assert dbg.software_s == pytest.approx(1e-5 + 14e-6 + 14 * 3e-6)  # + 2(N-1) fingerprints
    assert r.latency_s == pytest.approx(14 * 1e-6)                   # the wire's part
    d = CM.recursive_allreduce(p, 4096, CM.Topology(1, 8))
    assert d.software_s == pytest.approx(2e-5 + 3 * 3e-6)


def test_recursive_doubling_rounds_and_fold():
    p, S = prof(), 1000
    four = CM.recursive_allreduce(p, S, CM.Topology(1, 4))
    assert four.total_s == pytest.approx(2 * (1e-6 + S * 1e-9) + 2 * S * 1e-10)
    three = CM.recursive_allreduce(p, S, CM.Topology(1, 3))  # 1 round + fold and unfold
    assert three.total_s == pytest.approx(3 * (1e-6 + S * 1e-9) + 2 * S * 1e-10)
    # 2 nodes of 2: the first round inside the node, the second across
    two = CM.recursive_allreduce(p, S, CM.Topology(2, 2))
    assert two.total_s == pytest.approx(1e-6 + S * 1e-9 + 1e-5 + S * 1e-8 + 2 * S * 1e-10)


def test_parameter_server_one_node():
    p, S = prof(), 4000
    c = CM.ps_push_pull(p, S, CM.Topology(1, 4), servers=1)
    # the server gets S from 3 workers, reduces them, sends S back to each
    assert c.total_s == pytest.approx(2 * (3e-6 + 3 * S * 1e-9) + 3 * S * 1e-10)
    assert c.link_bytes == 6 * S
    two = CM.ps_push_pull(p, S, CM.Topology(1, 4), servers=2)  # half the shard per peer
    assert two.bandwidth_s == pytest.approx(c.bandwidth_s / 2)


def test_scheduled_exposure_and_overlap_blend():
    assert M.scheduled_exposed(10.0, [2, 5, 9], [1, 1, 3]) == pytest.approx(2.0)
    assert M.scheduled_exposed(10.0, [0, 0], [1, 1]) == 0.0
    wl = M.Workload("w", params=1000, itemsize=4, buckets=[500, 500], flops_per_sample=3e6,
                    optimizer_state=2, batch=8)
    for overlap in (0.0, 1.0):
        p = prof(overlap=overlap)
        st = M.step(p, wl, "ddp", 4, 8)
        costs = [CM.ring_allreduce(p, 2000, CM.Topology(1, 4)).total_s] * 2
        t_b = 2 / 3 * 8 * 3e6 / 1e9
        sched = M.scheduled_exposed(t_b, [t_b / 2, t_b], costs)
        assert st.exposed_s == pytest.approx(sum(costs) if overlap == 0 else sched)
        assert st.step_s == pytest.approx(8 * 3e6 / 1e9 + st.exposed_s)


def test_one_rank_step_is_compute_and_contention_scales_it():
    wl = M.Workload("w", params=1000, itemsize=4, buckets=[1000], flops_per_sample=3e6,
                    optimizer_state=2, batch=8)
    p = prof(optimizer_s_per_param=1e-6, step_overhead_s=0.5e-3, contention={"1": 1.0, "2": 1.5})
    st = M.step(p, wl, "ddp", 1, 8)
    assert st.step_s == pytest.approx(8 * 3e6 / 1e9 + 1e-3 + 0.5e-3) and st.comm_s == 0
    assert M.compute_times(p, wl, 8, 2)[0] == pytest.approx(1.5 * 8e-3)
    assert M.compute_times(p, wl, 8, 3)[0] == pytest.approx(1.5 * 8e-3)  # nearest measured below


def test_zero_volumes_and_memory():
    wl = M.Workload("w", params=4096, itemsize=4, buckets=[2048, 2048], flops_per_sample=1e6,
                    optimizer_state=2, batch=8)
    p = prof()
    ddp, z1, z3 = (M.step(p, wl, s, 4, 8) for s in ("ddp", "zero1", "zero3"))
    assert z1.link_bytes == ddp.link_bytes  # reduce-scatter + all-gather = allreduce
    ag = sum(sum(V.all_gather_bytes(2048, 4, 3, 4)) for _ in range(2))
    assert z3.link_bytes == ddp.link_bytes + ag  # stage 3: one more all-gather
    P = 4096 * 4
    assert ddp.memory_bytes == 4 * P
    assert z1.memory_bytes == 2 * P + 2 * P // 4
    assert M.step(p, wl, "zero2", 4, 8).memory_bytes == P + 3 * P // 4
    assert z3.memory_bytes == 4 * P // 4 + 2 * 2048 * 4


def test_crossovers():
    p = prof()
    # latency 2(N-1) alpha >= bandwidth 2(N-1)/N S beta  <=>  N >= S beta / alpha = 1048.6
    lat, soft = M.ring_latency_crossover(p, MiB, per_node=1 << 20)
    assert lat == 2048 and soft is None  # no software cost in this profile
    assert M.ring_latency_crossover(prof(ctrl_msg_s=2e-6), MiB, per_node=1 << 20)[1] is None
    lat, soft = M.ring_latency_crossover(prof(ctrl_msg_s=2e-6, debug=True), MiB, per_node=1 << 20)
    assert soft == 1024  # debug: 2(N-1) 2e-6 >= 2(N-1)/N 1.05e-3  <=>  N >= 524
    assert M.hierarchical_crossover(prof(nics_per_node=4), 4 * MiB, 4, [1, 2, 4, 8, 16]) == 8
    assert CM.fastest_allreduce(64, p, 1, 4) == "recursive"
    assert CM.fastest_allreduce(64 * MiB, p, 1, 4) == "ring"
    assert CM.fastest_allreduce(4 * MiB, prof(nics_per_node=4), 4, 4) == "hierarchical"


def test_ps_keeps_up_until():
    wl = M.Workload("w", params=10 ** 6, itemsize=4, buckets=[10 ** 6], flops_per_sample=1e8,
                    optimizer_state=2, batch=8)
    p = prof(ranks_per_node=1)
    last, first = M.ps_keeps_up_until(p, wl, 8, 1, [1, 2, 4, 8, 16, 32, 64])
    # compute 0.8 s; one server moves 2 (N-1) * 4 MB at 1e-8 s/B = 0.08 (N-1) s
    assert (last, first) == (8, 16)


def test_profiles_and_ranks_lists(tmp_path):
    for name in CM.available_profiles():
        assert CM.load_profile(name).name == name
    assert {"example-cluster", "example-cluster-1nic"} <= set(CM.available_profiles())
    with pytest.raises(ValueError, match="no shipped profile"):
        CM.load_profile(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n')
    with pytest.raises(ValueError, match="not a machine profile"):
        CM.load_profile(str(bad))
    with pytest.raises(ValueError, match="overlap"):
        prof(overlap=2.0)
    assert expand_ranks("1,2,4,...,64") == [1, 2, 4, 8, 16, 32, 64]
    assert expand_ranks("4,2") == [1, 2, 4]
    assert CM.Topology.of(6, 4) == CM.Topology(2, 4) and CM.Topology.of(2, 4) == CM.Topology(1, 2)


def test_flops_per_sample_gpt_counts_attention_and_head():
    class G:
        kind, n_embd, block_size, vocab_size, n_layer = "gpt", 8, 4, 10, 2
    P = 1000
    non_emb = P - 10 * 8 - 4 * 8
    assert M.flops_per_sample(G, P) == 3 * 4 * (2 * non_emb + 2 * 2 * 4 * 8 + 2 * 8 * 10)
    assert math.isclose(M.flops_per_sample(type("m", (), {"kind": "mlp"}), P), 6000)


def test_recursive_halving_and_doubling_steps_and_fold():
    p, S = prof(), 4 * MiB
    rs = CM.halving_reduce_scatter(p, S, CM.Topology(1, 4))  # 2 steps: S/2 then S/4, added
    assert rs.total_s == pytest.approx(2e-6 + 3 / 4 * S * 1e-9 + 3 / 4 * S * 1e-10)
    assert rs.intra == V.halving_reduce_scatter_bytes(S // 4, 4, 3, 4) == (3 * S // 4,) * 2
    ag = CM.doubling_all_gather(p, S, CM.Topology(1, 4))  # the mirror, nothing to add
    assert ag.total_s == pytest.approx(2e-6 + 3 / 4 * S * 1e-9)
    # 2 nodes of 2, ranks node by node: the first halving step (distance 2) crosses nodes,
    # both ranks of a node at once through its one NIC (bandwidth time x2)
    two = CM.halving_reduce_scatter(p, S, CM.Topology(2, 2))
    assert two.total_s == pytest.approx(1e-5 + S / 2 * 1e-8 * 2 + 1e-6 + S / 4 * 1e-9
                                        + 3 / 4 * S * 1e-10)
    assert (two.inter, two.intra) == ((S // 2,) * 2, (S // 4,) * 2)
    # 3 ranks: fold (the whole buffer in, added), one step (2 chunks out, 1 in), unfold
    S3 = 3000
    three = CM.halving_reduce_scatter(p, S3, CM.Topology(1, 3))
    assert three.total_s == pytest.approx(3e-6 + (S3 + 2000 + 1000) * 1e-9 + (S3 + 1000) * 1e-10)


def test_bruck_and_hierarchical_scatter_gather():
    p = prof()
    b = CM.bruck_all_gather(p, 5000, CM.Topology(1, 5))  # 3 steps: 1, 2, 1 chunks of 1000 B
    assert b.total_s == pytest.approx(3e-6 + 4000 * 1e-9)
    assert b.intra == V.bruck_all_gather_bytes(1250, 5, 4, 4) == (4000, 4000)
    # 5 ranks, latency-bound: Bruck's 3 steps beat the ring's 4 and recursive doubling's
    # fold + 2 + unfold
    assert CM.pick("all_gather", p, 5000, CM.Topology(1, 5))[0] == "bruck"
    assert CM.pick("all_gather", p, 4000, CM.Topology(1, 4))[0] == "recursive"
    S = 4 * MiB
    h = CM.hier_reduce_scatter(prof(nics_per_node=1), S, CM.Topology(2, 2))
    # in the node: one halving step of S/2; across: S/4 of the slice, the node's 2 ranks
    # sharing one NIC (bandwidth time x2)
    assert h.total_s == pytest.approx(1e-6 + S / 2 * 1e-9 + 1e-5 + S / 4 * 1e-8 * 2
                                      + (S / 2 + S / 4) * 1e-10)
    want = V.hier_shard_bytes("reduce_scatter", S // 4, 2, 2, 1, 1, 4)
    assert (h.intra, h.inter) == (want["intra"], want["inter"]) == (((S // 2,) * 2), ((S // 4,) * 2))
    assert CM.pick("reduce_scatter", p, 1 << 30, CM.Topology(2, 2))[0] == "hierarchical"
    assert CM.pick("reduce_scatter", p, 1 << 30, CM.Topology(2, 2), "ring")[0] == "ring"
    with pytest.raises(ValueError, match="reduce_scatter algorithm 'tree'"):
        CM.pick("reduce_scatter", p, 1, CM.Topology(1, 2), "tree")


def test_zero3_with_auto_stays_near_ddp_at_scale():
    """docs/scaling.md's aim: ZeRO-3 with the few-step collectives within 2x of DDP with
    auto at 4096 ranks (GPT-sized buckets, example-cluster); the ring is far behind."""
    wl = M.Workload("w", params=805_632, itemsize=4, buckets=[262_144] * 3 + [43_200],
                    flops_per_sample=1e7, optimizer_state=2, batch=8)
    p = CM.load_profile("example-cluster")
    ddp = M.step(p, wl, "ddp", 4096, 8, algorithm="auto")
    z3 = M.step(p, wl, "zero3", 4096, 8, algorithm="auto")
    ring = M.step(p, wl, "zero3", 4096, 8)
    assert z3.step_s < 2 * ddp.step_s < ring.step_s
    assert ring.algorithms == "ring" and z3.algorithms != "ring"


def test_inter_node_bytes_count_every_rank_that_crosses():
    """Through one node's NICs per step: a ring over node-blocked ranks crosses with one
    rank per node; recursive halving / doubling has every rank of the node exchange with
    a rank of the other node in its first step (half the buffer each way at N = 4, L = 2),
    so the node moves L times a rank's inter-node bytes (the veth measured 10.27 MB where
    one rank's 4.83 MB was printed before)."""
    wl = M.Workload("w", params=4096, itemsize=4, buckets=[2048, 2048], flops_per_sample=1e6,
                    optimizer_state=2, batch=8)
    p = prof()
    B = 2048 * 4
    ring = M.step(p, wl, "zero3", 4, 2, algorithm="ring", per_node=2)
    rec = M.step(p, wl, "zero3", 4, 2, algorithm="recursive", per_node=2)
    # per bucket and node: reduce-scatter + 2 all-gathers; ring: one rank's 3/4 B each
    # way per phase; recursive: 2 ranks x B/2 each way per phase
    assert ring.inter_bytes_node == 2 * 3 * (2 * 3 * B // 4)
    assert rec.inter_bytes_node == 2 * 3 * (2 * 2 * B // 2)
    assert M.node_streams("ring", CM.Topology(2, 2)) == 1
    assert M.node_streams("hierarchical", CM.Topology(2, 2)) == 2
    ddp = M.step(p, wl, "ddp", 4, 2, algorithm="recursive", per_node=2)
    assert ddp.inter_bytes_node == 2 * 2 * (2 * B)  # one whole-buffer round across, 2 ranks


def test_what_bounds_the_ring_and_from_which_n():
    """software 2(N-1) msg_s > wire 2(N-1) alpha + 2(N-1)/N S beta  <=>
    N > S beta / (msg_s - alpha) = 1 MiB x 1e-9 / 4e-6 = 262: software-bound from 512;
    a per-call cost over a per-message cost below alpha: software first, the wire from
    2(N-1)(alpha - msg_s) + bandwidth >= call, here from N = 64."""
    assert M.ring_bound(prof(msg_s=5e-6), MiB, per_node=1 << 20, max_ranks=4096) == ("software", 512)
    assert M.ring_bound(prof(), MiB, per_node=1 << 20, max_ranks=4096) == ("wire", 2)
    # alpha 1 us, msg 0.5 us, call 1 ms: (2(N-1) 0.5 us + 2(N-1)/N 1.05 ms) vs 1 ms + ...
    p = prof(msg_s=5e-7, call_s={"ring": 2e-3})
    who, since = M.ring_bound(p, MiB, per_node=1 << 20, max_ranks=1 << 14)
    assert who == "wire"
    c = lambda n: M.ring_allreduce(p, MiB, CM.Topology.of(n, 1 << 20))  # noqa: E731
    assert c(since).latency_s + c(since).bandwidth_s >= c(since).software_s
    assert c(since // 2).latency_s + c(since // 2).bandwidth_s < c(since // 2).software_s


def test_the_crossover_in_bytes_where_the_wire_bounds_the_ring():
    """Per message the ring is wire-bound once alpha + (S/N) beta >= msg_s: with msg_s
    5 us, alpha 1 us, beta 1 ns/B, from messages of ~4 KB, S ~ N x 4 KB (the per-call
    cost shifts it a little); msg_s below alpha: every size; no bandwidth: never."""
    p = prof(msg_s=5e-6)
    for N in (64, 1024):
        S = M.ring_wire_bytes(p, N, per_node=1 << 20)
        c = lambda s: M.ring_allreduce(p, s, CM.Topology.of(N, 1 << 20))  # noqa: E731
        assert c(S).latency_s + c(S).bandwidth_s >= c(S).software_s
        assert c(S - 4).latency_s + c(S - 4).bandwidth_s < c(S - 4).software_s
        assert 0.9 * N * 4000 < S < 1.2 * N * 4000 * 1.05 and S % 4 == 0
    assert M.ring_wire_bytes(prof(msg_s=5e-7), 64, per_node=1 << 20) == 64 * 4  # every size
    assert M.ring_wire_bytes(prof(msg_s=5e-6, intra={"alpha_s": 1e-6, "beta_s_per_byte": 0.0},
                                  inter={"alpha_s": 1e-6, "beta_s_per_byte": 0.0}),
                             64, per_node=1 << 20, max_bytes=1 << 30) is None


def test_few_step_collectives_can_have_their_own_cost_per_message():
    """few_step_msg_s prices the messages of recursive doubling / halving and Bruck (Python
    requests under the compiled engine) apart from the ring's msg_s; 0 keeps msg_s."""
    t = CM.Topology(1, 4)
    base, split = prof(msg_s=2e-6), prof(msg_s=2e-6, few_step_msg_s=1.5e-5)
    assert CM.ring_allreduce(split, MiB, t).software_s == CM.ring_allreduce(base, MiB, t).software_s
    for fn, steps in ((CM.recursive_allreduce, 2), (CM.halving_reduce_scatter, 2),
                      (CM.doubling_all_gather, 2), (CM.bruck_all_gather, 2)):
        assert fn(split, MiB, t).software_s - fn(base, MiB, t).software_s == pytest.approx(steps * 1.3e-5)
    assert prof().few_msg_s == prof().msg_s
