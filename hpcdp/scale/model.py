"""The workload half of the cost model: a training config's step, strategy by strategy.

The link half (what each collective costs on a machine :class:`Profile`) is
:mod:`hpcdp.comm.model.cost`; this module reads a config's model and bucket plan
(:func:`workload_from_config`) and prices one step of each strategy on top of it.

A step: forward and backward take ``batch * flops_per_sample / flops_per_s`` (backward
two thirds of it), the optimizer ``optimizer_s_per_param`` per parameter it updates,
plus ``step_overhead_s``; all times the measured ``contention`` factor for the number of
ranks that share a node (compute-only runs measure it: memory bandwidth, shared caches,
oversubscribed cores). Communication that a strategy starts during compute overlaps it
by the profile's ``overlap`` fraction: 1 where a NIC or DMA engine moves the bytes, 0
where the CPU that computes also copies them (shared-memory MPI without a progress
thread): ``exposed = overlap * scheduled_exposed + (1 - overlap) * total``.

Strategies (per step, ``P`` parameters of ``itemsize`` bytes, buckets of the DDP plan):
DDP (ring, recursive doubling, hierarchical or the fastest per bucket), the synchronous
parameter server with K colocated servers (push + server update + pull; servers are
ranks 0..K-1, so K <= ranks per node share one node's NICs), and ZeRO stages 1-3
(reduce-scatter during backward, all-gather after the step; stage 3 also all-gathers
each unit before its forward and backward). The ZeRO units are taken to be the DDP
buckets.

Efficiency here is :func:`predicted_efficiency` (of two predicted steps); a measured
study's efficiency is :func:`hpcdp.scale.study.add_measured_efficiency`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hpcdp.comm.model.cost import (Cost, Profile, Topology, all_gather, allreduce, hierarchical_allreduce,
                             pick, ps_push_pull, reduce_scatter, ring_allreduce)

# -- the workload of a config ----------------------------------------------------------

@dataclass
class Workload:
    """What the model needs from a training config."""

    name: str
    params: int
    itemsize: int
    buckets: list           # element counts, launch order (backward order)
    flops_per_sample: float
    optimizer_state: int    # optimizer state elements per parameter (AdamW 2, SGD+momentum 1)
    batch: int              # global batch of the config

    @property
    def grad_bytes(self) -> int:
        return self.params * self.itemsize


def flops_per_sample(model_cfg, params: int) -> float:
    """Training FLOPs of one sample (3x the forward: Kaplan et al. 2020, sec. 2.1).
    GPT forward per token: 2 per non-embedding weight, 2 * n_layer * T * d for attention,
    2 * d * V for the tied output head. MLP: 2 per weight."""
    if model_cfg.kind == "gpt":
        d, T, V_, Lyr = model_cfg.n_embd, model_cfg.block_size, model_cfg.vocab_size, model_cfg.n_layer
        non_emb = params - V_ * d - T * d
        return 3 * T * (2 * non_emb + 2 * Lyr * T * d + 2 * d * V_)
    return 3 * 2 * params


def workload_from_config(cfg) -> Workload:
    """Parameter count and DDP bucket plan of a loaded config (builds the model once)."""
    import numpy as np

    from hpcdp.nn import build_model
    from hpcdp.strategies.buckets import bucket_cap_elements, plan_buckets

    model = build_model(cfg.model, dtype=cfg.run.dtype, device="cpu")
    flat = model.flat
    itemsize = np.dtype(cfg.run.dtype).itemsize
    ddp = cfg.parallel.sub("ddp") if hasattr(cfg.parallel, "sub") else None
    mb = getattr(ddp, "bucket_mb", 25.0) if ddp is not None else 25.0
    per_param = getattr(ddp, "bucketing", "size") == "per_param"
    plan = plan_buckets(flat.layout, None if per_param else bucket_cap_elements(mb, itemsize))
    state = {"adamw": 2, "sgd": 1 if getattr(cfg.optim, "momentum", 0) else 0}.get(cfg.optim.kind, 2)
    return Workload(name=f"{cfg.model.kind} {flat.numel:,} params", params=flat.numel,
                    itemsize=itemsize, buckets=[b.size for b in plan.buckets],
                    flops_per_sample=flops_per_sample(cfg.model, flat.numel),
                    optimizer_state=state, batch=cfg.train.global_batch)


# -- a step ----------------------------------------------------------------------------

@dataclass
class Step:
    """One predicted training step of one strategy at N ranks."""

    strategy: str
    ranks: int
    batch_per_rank: float
    step_s: float
    compute_s: float
    comm_s: float           # all communication time
    exposed_s: float        # the part the step waits for
    link_bytes: int         # busiest rank, sent + received per step
    inter_bytes_node: int   # through the busiest node's NICs per step, sent + received
    memory_bytes: int       # parameters + gradients + optimizer state per rank
    algorithms: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def compute_times(p: Profile, wl: Workload, batch: float, ranks_on_node: int,
                  opt_fraction: float = 1.0) -> tuple[float, float, float]:
    """(forward, backward, optimizer) seconds for ``batch`` samples on one rank."""
    k = p.contention_at(ranks_on_node)
    fb = batch * wl.flops_per_sample / p.flops_per_s * k
    opt = (p.step_overhead_s + opt_fraction * wl.params * p.optimizer_s_per_param) * k
    return fb / 3, 2 * fb / 3, opt


def scheduled_exposed(duration: float, ready: list, costs: list) -> float:
    """Comm ops on one link, op i ready at ``ready[i]`` (seconds into a compute phase of
    ``duration``), run in order: how far the last one ends past the phase."""
    end = 0.0
    for r, c in zip(ready, costs):
        end = max(end, r) + c
    return max(0.0, end - duration)


def _exposed(p: Profile, duration: float, ready: list, costs: list) -> float:
    return p.overlap * scheduled_exposed(duration, ready, costs) + (1 - p.overlap) * sum(costs)


def _ready_in_backward(wl: Workload, t_b: float) -> list:
    done, out = 0, []
    for size in wl.buckets:
        done += size
        out.append(t_b * done / wl.params)
    return out


def _memory(wl: Workload, N: int, stage: int) -> int:
    P, s = wl.params, wl.itemsize
    state = wl.optimizer_state * P * s
    if stage == 0:
        return 2 * P * s + state
    if stage == 1:
        return 2 * P * s + state // N
    if stage == 2:
        return P * s + (P * s + state) // N
    return (2 * P * s + state) // N + 2 * max(wl.buckets) * s  # + two gathered units


def _inter_node(c: Cost, t: Topology, streams: int) -> int:
    return 0 if t.nodes <= 1 else sum(c.inter) * streams


# algorithms in which only one rank of a node crosses to the next node per step (a ring
# over ranks placed node by node); in every other one each of a node's L ranks has its
# own cross-node partner (recursive doubling / halving, Bruck, the hierarchical ones)
ONE_STREAM_PER_NODE = ("ring",)


def node_streams(algorithm: str, t: Topology) -> int:
    """How many of a node's ranks send a rank's inter-node bytes at once."""
    return 1 if algorithm in ONE_STREAM_PER_NODE else t.per_node


def _inter_node_of(pairs, t: Topology) -> int:
    """Inter-node bytes through one node's NICs for ``[(algorithm, Cost), ...]``."""
    return sum(_inter_node(c, t, node_streams(a, t)) for a, c in pairs)


def step(p: Profile, wl: Workload, strategy: str, N: int, batch_per_rank: float,
         algorithm: str = "ring", servers: int = 1, per_node: int | None = None) -> Step:
    """Predicted step of ``strategy`` ("ddp", "ps", "zero1", "zero2", "zero3") at N ranks
    (nodes of ``per_node`` ranks, default the profile's)."""
    t = Topology.of(N, per_node or p.ranks_per_node)
    s = wl.itemsize
    if strategy in HYBRID:
        return hybrid_step(p, wl, strategy, t, batch_per_rank)
    if strategy == "ddp":
        t_f, t_b, t_o = compute_times(p, wl, batch_per_rank, t.per_node)
        used, costs, total, pairs = [], [], Cost(), []
        for size in wl.buckets:
            a, c = allreduce(p, size * s, t, algorithm, s)
            used.append(a)
            costs.append(c.total_s)
            total = total + c
            pairs.append((a, c))
        exposed = _exposed(p, t_b, _ready_in_backward(wl, t_b), costs)
        return Step("ddp", N, batch_per_rank, t_f + t_b + t_o + exposed, t_f + t_b + t_o,
                    sum(costs), exposed, total.link_bytes, _inter_node_of(pairs, t),
                    _memory(wl, N, 0), "/".join(sorted(set(used))) if N > 1 else "-")
    if strategy == "ps":
        if not 1 <= servers <= N:
            raise ValueError(f"cost model: {servers} parameter servers on {N} ranks")
        # workers run no optimizer (update = "server"): each server updates its shard
        t_f, t_b, t_o = compute_times(p, wl, batch_per_rank, t.per_node, 1.0 / servers)
        c = ps_push_pull(p, wl.grad_bytes, t, servers, s)
        comm = c.total_s
        memory = 2 * wl.params * s + wl.optimizer_state * wl.params * s // servers
        return Step(f"ps{servers}", N, batch_per_rank, t_f + t_b + t_o + comm, t_f + t_b + t_o,
                    comm, comm, c.link_bytes, _inter_node(c, t, min(servers, t.per_node)),
                    memory, "push/pull")
    if strategy in ("zero1", "zero2", "zero3"):
        stage = int(strategy[-1])
        t_f, t_b, t_o = compute_times(p, wl, batch_per_rank, t.per_node, 1.0 / N)
        # ZeRO's collectives by parallel.zero.algorithm: "ring" (the default), an
        # explicit one, or "auto": the cheapest per group / unit (hpcdp.comm.model.cost.pick)
        picked_rs = [pick("reduce_scatter", p, size * s, t, algorithm, s) for size in wl.buckets]
        picked_ag = [pick("all_gather", p, size * s, t, algorithm, s) for size in wl.buckets]
        rs, ag = [c for _, c in picked_rs], [c for _, c in picked_ag]
        used = sorted({a for a, _ in picked_rs + picked_ag})
        gathers = 2 if stage == 3 else 1
        total = Cost()
        for c in rs + ag * gathers:
            total = total + c
        rs_t, ag_t = [c.total_s for c in rs], [c.total_s for c in ag]
        if stage < 3:  # reduce-scatter during backward; all-gather after the step,
            #            overlapping the next forward at best
            exposed = (_exposed(p, t_b, _ready_in_backward(wl, t_b), rs_t)
                       + _exposed(p, t_f, [0.0] * len(ag_t), ag_t))
        else:  # each unit gathered before its forward (prefetched), and again before its
            #    backward, then its gradient reduce-scattered
            exposed = (_exposed(p, t_f, [0.0] * len(ag_t), ag_t)
                       + _exposed(p, t_b, _ready_in_backward(wl, t_b),
                                  [a + r for a, r in zip(ag_t, rs_t)]))
        comm = sum(rs_t) + gathers * sum(ag_t)
        inter = _inter_node_of(picked_rs + picked_ag * gathers, t)
        return Step(strategy, N, batch_per_rank, t_f + t_b + t_o + exposed, t_f + t_b + t_o,
                    comm, exposed, total.link_bytes, inter,
                    _memory(wl, N, stage), "/".join(used) if N > 1 else "-")
    raise ValueError(f"cost model: unknown strategy {strategy!r}; choose ddp, ps, zero1, zero2, zero3")


HYBRID = ("hybrid1", "hybrid2", "hybrid3")


def hybrid_step(p: Profile, wl: Workload, strategy: str, t: Topology, batch_per_rank: float) -> Step:
    """ZeRO stage 1-3 with hybrid sharding (``parallel.zero.shard = "node"``): state
    sharded over the node's L ranks; per unit a ring reduce-scatter in the node, then a
    ring allreduce of the rank's 1/L chunk across the M nodes (L such rings share the
    node's NICs), all-gathers in the node (hpcdp.strategies.zero.hybrid). The same
    schedule as the flat stages otherwise."""
    from hpcdp.comm.model.cost import ring_phases_cost

    stage, s = int(strategy[-1]), wl.itemsize
    L, M, N = t.per_node, t.nodes, t.ranks
    share = max(1.0, L / p.nics_per_node)
    t_f, t_b, t_o = compute_times(p, wl, batch_per_rank, L, 1.0 / L)
    rs = [ring_phases_cost(p, size * s, L, "intra", ("rs",), itemsize=s)
          + ring_phases_cost(p, -(-size // L) * s, M, "inter", ("rs", "ag"), share, s)
          for size in wl.buckets]
    ag = [ring_phases_cost(p, size * s, L, "intra", ("ag",), itemsize=s) for size in wl.buckets]
    gathers = 2 if stage == 3 else 1
    total = Cost()
    for c in rs + ag * gathers:
        total = total + c
    rs_t, ag_t = [c.total_s for c in rs], [c.total_s for c in ag]
    if stage < 3:
        exposed = (_exposed(p, t_b, _ready_in_backward(wl, t_b), rs_t)
                   + _exposed(p, t_f, [0.0] * len(ag_t), ag_t))
    else:
        exposed = (_exposed(p, t_f, [0.0] * len(ag_t), ag_t)
                   + _exposed(p, t_b, _ready_in_backward(wl, t_b), [a + r for a, r in zip(ag_t, rs_t)]))
    comm = sum(rs_t) + gathers * sum(ag_t)
    return Step(strategy, N, batch_per_rank, t_f + t_b + t_o + exposed, t_f + t_b + t_o, comm, exposed,
                total.link_bytes, _inter_node(total, t, L), _memory(wl, L, stage),
                "ring/node" if N > 1 else "-")


def predicted_efficiency(base: Step, point: Step, study: str = "weak") -> float:
    """Weak: t(1)/t(N) at the same per-rank batch; strong: t(1)/(N t(N))."""
    if study == "weak":
        return base.step_s / point.step_s
    return base.step_s / (point.ranks * point.step_s)


# -- crossovers ------------------------------------------------------------------------

def ring_latency_crossover(p: Profile, nbytes: int, per_node: int, max_ranks: int = 1 << 20,
                           itemsize: int = 4):
    """Smallest N (powers of two) where the ring's wire latency 2(N-1) alpha reaches its
    bandwidth time for an ``nbytes`` bucket, and where hpcdp's software cost (per
    message, per call; debug mode's fingerprints) does. None where it does not up to ``max_ranks``."""
    lat = soft = None
    N = 2
    while N <= max_ranks and (lat is None or soft is None):
        c = ring_allreduce(p, nbytes, Topology.of(N, per_node), itemsize)
        if lat is None and c.latency_s >= c.bandwidth_s:
            lat = N
        if soft is None and c.software_s >= c.bandwidth_s:
            soft = N
        N *= 2
    return lat, soft


def ring_bound(p: Profile, nbytes: int, per_node: int, max_ranks: int = 4096, itemsize: int = 4):
    """What bounds the flat ring for an ``nbytes`` bucket up to ``max_ranks`` (powers of
    two from 2): ``("wire" | "software", N)``, the one that is larger at ``max_ranks``
    (the wire: latency + bandwidth time; hpcdp's software: per message and per call)
    and the first N from which it stays so. Per message the ring is wire-bound when
    ``msg_s < alpha + m beta`` for its messages of m bytes; a per-call cost makes
    software bound a small group first."""
    who, since, N = None, 2, 2
    while N <= max_ranks:
        c = ring_allreduce(p, nbytes, Topology.of(N, per_node), itemsize)
        now = "wire" if c.latency_s + c.bandwidth_s >= c.software_s else "software"
        if now != who:
            who, since = now, N
        N *= 2
    return who, since


def ring_wire_bytes(p: Profile, N: int, per_node: int, itemsize: int = 4,
                    max_bytes: int = 1 << 40):
    """The crossover in bytes: the smallest allreduce of the flat ring at ``N`` ranks
    from which the wire (latency + bandwidth) takes at least as long as hpcdp's
    software (per message, per call), to one item; ``N * itemsize`` (its smallest
    size) when the wire bounds it at every size, None when hpcdp's software bounds it
    up to ``max_bytes``. Per message the ring is wire-bound once ``alpha + m beta >=
    msg_s`` for its messages of m = S/N bytes; the per-call cost moves the crossover to
    larger buckets on few ranks."""
    t = Topology.of(N, per_node)

    def wire(S):
        c = ring_allreduce(p, S, t, itemsize)
        return c.latency_s + c.bandwidth_s >= c.software_s

    lo = N * itemsize
    if wire(lo):
        return lo
    hi = 2 * lo
    while not wire(hi):
        if hi >= max_bytes:
            return None
        lo, hi = hi, 2 * hi
    while hi - lo > itemsize:  # wire(lo) false, wire(hi) true
        mid = (lo + hi) // (2 * itemsize) * itemsize
        lo, hi = (mid, hi) if not wire(mid) else (lo, mid)
    return hi


def hierarchical_crossover(p: Profile, nbytes: int, per_node: int, ranks: list,
                           itemsize: int = 4):
    """First N of ``ranks`` (>= 2 nodes) where the hierarchical allreduce beats the flat
    ring for an ``nbytes`` bucket, or None."""
    for N in ranks:
        t = Topology.of(N, per_node)
        if t.nodes < 2 or t.per_node < 2 or t.ranks != N:
            continue
        if hierarchical_allreduce(p, nbytes, t, itemsize).total_s < ring_allreduce(p, nbytes, t, itemsize).total_s:
            return N
    return None


def ps_keeps_up_until(p: Profile, wl: Workload, batch_per_rank: float, servers: int,
                      ranks: list, per_node: int | None = None):
    """Largest N of ``ranks`` where K servers move a step's pushes and pulls in no more
    time than the workers compute (so an asynchronous PS could hide them); the next N
    is where the servers stop keeping up. Returns (last N that keeps up, first N that
    does not) with None where there is none."""
    last = first = None
    for N in ranks:
        if servers > N:
            continue
        st = step(p, wl, "ps", N, batch_per_rank, servers=servers, per_node=per_node)
        t = Topology.of(N, per_node or p.ranks_per_node)
        t_f, t_b, _ = compute_times(p, wl, batch_per_rank, t.per_node, 0.0)
        if st.comm_s <= t_f + t_b:
            last = N
        elif first is None:
            first = N
    return last, first


__all__ = ["Workload", "Step", "workload_from_config", "step", "node_streams", "hybrid_step", "HYBRID", "predicted_efficiency",
           "compute_times", "scheduled_exposed", "ring_latency_crossover", "ring_bound",
           "hierarchical_crossover", "ps_keeps_up_until", "flops_per_sample"]
