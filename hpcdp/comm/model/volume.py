"""How many bytes each collective moves: the one place for the analytic formulas.

Every byte count that hpcdp predicts lives here, exact to the element (uneven
shards by :func:`hpcdp.shard.shard_range` included), so tests can assert the ledger
against them with ``==`` and the cost model (``hpcdp scale``) prices the same
numbers. Functions return ``(sent, received)`` bytes of one ``rank``.

Notation: ``n`` elements of ``itemsize`` bytes, ``N`` ranks, chunks
``c_i = shard_range(n, N, i)[1]``.

- ring reduce-scatter: rank r sends every chunk but its own (``n - c_r``) and
  receives every chunk but ``c_{r-1}``; ring all-gather sends every chunk but
  ``c_{r+1}`` and receives every chunk but its own. With ``N | n`` each phase is
  ``(N-1)/N * S`` per rank; an allreduce is both phases, ``2(N-1)/N * S``.
- recursive doubling (any N, non-powers of two folded in): ``log2 p`` full-buffer
  exchanges for the ``p = 2^floor(log2 N)`` ranks that stay, plus one fold/unfold.
- MPI's own collectives ("native", and "auto" below its crossover): the bytes
  handed to the MPI call (:func:`native_bytes`); hpcdp.comm.select.collective_bytes resolves
  "auto" the way the collectives do.
- parameter server (K servers, shard j by ``shard_range(n, K, j)``): a push sends each
  worker's shard j to server j; a pull sends it back. Server j receives
  ``(W - 1) * |shard j|`` (``W`` if it is not a worker itself) per push.
- ZeRO per step (stage 1/2: one reduce-scatter + one all-gather of the flat buffer,
  the same bytes as DDP's allreduce; stage 3: two all-gathers + one reduce-scatter,
  1.5x). See docs/zero.md.
- hierarchical allreduce (``M`` nodes of ``L`` ranks, local rank ``l``): intra-node a
  ring reduce-scatter + all-gather of the whole buffer over the ``L`` ranks of the node
  (``ring_allreduce_bytes(n, L, l)``); inter-node a ring allreduce of chunk ``l``
  (``shard_range(n, L, l)``) over the ``M`` ranks with local rank ``l``. With even
  division: ``2(L-1)/L * S`` on intra-node links and ``2(M-1)/M * S / L`` per rank
  on inter-node links (``2(M-1)/M * S`` per node, spread over its ``L`` ranks).
"""

from __future__ import annotations

from hpcdp.shard import shard_range


def ring_bytes(n: int, N: int, rank: int, itemsize: int,
               phases=("rs", "ag")) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` in a ring over ``n`` elements.

    ``phases``: ``("rs",)`` reduce-scatter, ``("ag",)`` all-gather, both: allreduce.
    """
    if N == 1 or n == 0:
        return 0, 0

    def size(c):  # O(1) per chunk: the cost model calls this at thousands of ranks
        return shard_range(n, N, c % N)[1]

    sent = recv = 0
    if "rs" in phases:
        sent += n - size(rank)
        recv += n - size(rank - 1)
    if "ag" in phases:
        sent += n - size(rank + 1)
        recv += n - size(rank)
    return sent * itemsize, recv * itemsize


def ring_messages(n: int, N: int, rank: int, itemsize: int, segment_bytes: int,
                  phases=("rs", "ag")) -> tuple[int, int]:
    """(sent, received) messages of ``rank`` in hpcdp's pipelined ring: every chunk that
    :func:`ring_bytes` counts travels as ``ceil(chunk / segment)`` messages (segments of
    ``max(1, segment_bytes // itemsize)`` elements; empty chunks send nothing)."""
    if N == 1 or n == 0:
        return 0, 0
    seg = max(1, segment_bytes // itemsize)

    def segs(c):
        return -(-shard_range(n, N, c % N)[1] // seg)

    base, rem = divmod(n, N)  # rem chunks of base + 1 elements, the others base
    total = rem * -(-(base + 1) // seg) + (N - rem) * -(-base // seg)
    sent = recv = 0
    if "rs" in phases:
        sent += total - segs(rank)
        recv += total - segs(rank - 1)
    if "ag" in phases:
        sent += total - segs(rank + 1)
        recv += total - segs(rank)
    return sent, recv


def ring_allreduce_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    return ring_bytes(n, N, rank, itemsize, ("rs", "ag"))


def expected_step_bytes(plan, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    """Gradient bytes (sent, received) of one DDP step on ``rank`` with ring allreduce:
    the sum of :func:`ring_allreduce_bytes` over the buckets of ``plan``
    (``hpcdp.strategies.buckets.plan_buckets``)."""
    sent = recv = 0
    for b in plan.buckets:
        s, r = ring_allreduce_bytes(b.size, N, rank, itemsize)
        sent, recv = sent + s, recv + r
    return sent, recv


def reduce_scatter_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    return ring_bytes(n, N, rank, itemsize, ("rs",))


def all_gather_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    return ring_bytes(n, N, rank, itemsize, ("ag",))


def recursive_bytes(n_bytes: int, N: int, rank: int) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` for an ``n_bytes`` recursive-doubling allreduce."""
    p = 1 << (N.bit_length() - 1)
    rem = N - p
    rounds = p.bit_length() - 1
    if rank < 2 * rem and rank % 2 == 0:
        return n_bytes, n_bytes  # folded into its odd partner, gets the result back
    extra = n_bytes if rank < 2 * rem else 0
    return rounds * n_bytes + extra, rounds * n_bytes + extra


def recursive_allreduce_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    """:func:`recursive_bytes` in the (elements, ranks, rank, itemsize) form of the others."""
    return recursive_bytes(n * itemsize, N, rank) if N > 1 and n else (0, 0)


def native_bytes(collective: str, n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    """(sent, received) bytes the ledger records for MPI's own collective
    (``algorithm="native"``, also what "auto" picks below its crossover): the bytes
    handed to the MPI call, not what MPI moves inside. allreduce: the buffer each
    way; reduce_scatter: the whole input out, this rank's chunk in; all_gather: this
    rank's chunk out, the whole result in."""
    if N == 1 or n == 0:
        return 0, 0
    if collective == "allreduce":
        return n * itemsize, n * itemsize
    chunk = shard_range(n, N, rank)[1]
    if collective == "reduce_scatter":
        return n * itemsize, chunk * itemsize
    if collective == "all_gather":
        return chunk * itemsize, n * itemsize
    raise ValueError(f"native_bytes: unknown collective {collective!r}")


def native_allreduce_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    return native_bytes("allreduce", n, N, rank, itemsize)


def native_reduce_scatter_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    return native_bytes("reduce_scatter", n, N, rank, itemsize)


def native_all_gather_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    return native_bytes("all_gather", n, N, rank, itemsize)


def ps_push_bytes(n: int, rank: int, servers, workers, itemsize: int) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` in one push of ``n`` elements to ``servers``."""
    servers, workers = list(servers), list(workers)
    sent = recv = 0
    if rank in workers:
        for j, s in enumerate(servers):
            if s != rank:
                sent += shard_range(n, len(servers), j)[1]
    if rank in servers:
        size = shard_range(n, len(servers), servers.index(rank))[1]
        recv += size * sum(1 for w in workers if w != rank)
    return sent * itemsize, recv * itemsize


def ps_pull_bytes(n: int, rank: int, servers, workers, itemsize: int) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` in one pull: the mirror image of a push."""
    recv, sent = ps_push_bytes(n, rank, servers, workers, itemsize)
    return sent, recv


def zero_step_bytes(stage: int, unit_sizes, N: int, rank: int, itemsize: int,
                    micro_batches: int = 1) -> tuple[int, int]:
    """(sent, received) bytes of one ZeRO step on ``rank``, all by the ring.

    ``unit_sizes``: the element counts of the pieces each collective runs on (one
    entry per group for stages 1/2, one per unit for stage 3); each piece is sharded
    by the shard rule on its own. Stage 1: reduce-scatter + all-gather of each piece
    (gradients accumulate locally over micro-batches); stage 2: a reduce-scatter per
    micro-batch (no full gradient buffer to accumulate in) + one all-gather; stage 3:
    per micro-batch all-gather (forward) + all-gather (backward) + reduce-scatter.
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
    m = int(micro_batches)
    rs_times, ag_times = {1: (1, 1), 2: (m, 1), 3: (m, 2 * m)}[stage]
    sent = recv = 0
    for n in unit_sizes:
        rs = reduce_scatter_bytes(n, N, rank, itemsize)
        ag = all_gather_bytes(n, N, rank, itemsize)
        sent += rs_times * rs[0] + ag_times * ag[0]
        recv += rs_times * rs[1] + ag_times * ag[1]
    return sent, recv


def hierarchical_bytes(n: int, nodes: int, per_node: int, node: int, local_rank: int,
                       itemsize: int) -> dict[str, tuple[int, int]]:
    """``{"intra": (sent, recv), "inter": (sent, recv)}`` bytes of the rank with local
    rank ``local_rank`` on node ``node`` in a hierarchical allreduce of ``n`` elements
    over ``nodes`` nodes of ``per_node`` ranks (see the module docstring)."""
    chunk = shard_range(n, per_node, local_rank)[1]
    return {"intra": ring_allreduce_bytes(n, per_node, local_rank, itemsize),
            "inter": ring_allreduce_bytes(chunk, nodes, node, itemsize)}


# -- few-step reduce-scatter / all-gather (hpcdp.comm.schedules.halving, bruck, hier_shard) -----

def _fold(N: int):
    p = 1 << (N.bit_length() - 1)
    rem = N - p
    return p, rem, (lambda i: 2 * i if i < rem else i + rem)


def offsets_of(n: int, N: int):
    """``at(c)``: offset of ring chunk ``c`` (``shard_range``), ``at(N) = n``: O(1)."""
    base, rem = divmod(n, N)
    return lambda c: c * base + min(c, rem)


def halving_steps(N: int, rank: int) -> list[tuple[int, int, int, int]]:
    """The halving steps of ``rank`` among ``N`` (non-powers of two folded as in
    hpcdp.comm.schedules.halving): ``(peer, virtual distance, kept window, given window)`` with
    windows as ``(first, end)`` ring-chunk indices; empty for a folded-out rank."""
    p, rem, vstart = _fold(N)
    if rank < 2 * rem and rank % 2 == 0:
        return []
    me = rank // 2 if rank < 2 * rem else rank - rem
    lo, hi, out = 0, p, []
    while hi - lo > 1:
        half = (hi - lo) // 2
        mid = lo + half
        keep, give, pv = ((lo, mid), (mid, hi), me + half) if me < mid else ((mid, hi), (lo, mid), me - half)
        peer = 2 * pv + 1 if pv < rem else pv + rem
        out.append((peer, half, (vstart(keep[0]), vstart(keep[1])), (vstart(give[0]), vstart(give[1]))))
        lo, hi = keep
    return out


def halving_offsets_bytes(at, N: int, rank: int, itemsize: int, collective: str) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` in a recursive-halving reduce-scatter
    (``collective="reduce_scatter"``) or recursive-doubling all-gather (``"all_gather"``,
    its mirror: sent and received swap) over chunks at offsets ``at(0..N)``."""
    if N == 1:
        return 0, 0
    p, rem, _ = _fold(N)
    whole = at(N) - at(0)

    def size(a, b):
        return at(b) - at(a)
    # the fold: the whole buffer in (reduce-scatter), everything but the chunk out (all-gather)
    fold = whole if collective == "reduce_scatter" else None
    if rank < 2 * rem and rank % 2 == 0:
        mine = size(rank, rank + 1)
        sent, recv = (fold or whole - mine), mine
    else:
        sent = recv = 0
        if rank < 2 * rem:
            theirs = size(rank - 1, rank)
            recv += fold or whole - theirs
            sent += theirs
        for _, _, keep, give in halving_steps(N, rank):
            sent += size(*give)
            recv += size(*keep)
    if collective == "all_gather":
        sent, recv = recv, sent
    return sent * itemsize, recv * itemsize


def halving_reduce_scatter_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    """Recursive halving (hpcdp.comm.schedules.halving) on the ring's chunks: with ``N = 2^k`` the
    ring's ``(N-1)/N * S`` each way; a fold rank of a non-power of two adds ``S``."""
    return halving_offsets_bytes(offsets_of(n, N), N, rank, itemsize, "reduce_scatter") if n else (0, 0)


def doubling_all_gather_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    """Recursive doubling all-gather: the mirror of :func:`halving_reduce_scatter_bytes`."""
    return halving_offsets_bytes(offsets_of(n, N), N, rank, itemsize, "all_gather") if n else (0, 0)


def bruck_all_gather_bytes(n: int, N: int, rank: int, itemsize: int) -> tuple[int, int]:
    """Bruck's all-gather (hpcdp.comm.schedules.bruck): receives every chunk but its own once;
    sends chunks ``rank .. rank+c_k-1`` at step k (``c_k = min(2^k, N - 2^k)``)."""
    if N == 1 or n == 0:
        return 0, 0
    at = offsets_of(n, N)

    def span(first, count):  # chunks first .. first+count-1, mod N
        first %= N
        end = first + count
        return at(min(end, N)) - at(first) + (at(end - N) if end > N else 0)
    sent, d = 0, 1
    while d < N:
        sent += span(rank, min(d, N - d))
        d <<= 1
    return sent * itemsize, (n - span(rank, 1)) * itemsize


def hier_shard_layout(n: int, nodes: int, per_node: int):
    """The packed layout of hpcdp.comm.hier_shard with ranks placed node by node (rank
    ``m * L + l``): ``(slice_at, piece_at(l))``: the offsets of the L node-local slices,
    and of the M pieces of slice ``l``."""
    N, L, M = nodes * per_node, per_node, nodes
    base, rem = divmod(n, N)

    def slice_size(l):  # M chunks of base, plus one for each m with m*L + l < rem
        return M * base + (-(-(rem - l) // L) if rem > l else 0)
    starts = [0]
    for l in range(L):
        starts.append(starts[-1] + slice_size(l))

    def piece_at(l):
        return lambda m: starts[l] + m * base + min(m, max(0, -(-(rem - l) // L)))
    return starts.__getitem__, piece_at


def hier_shard_bytes(collective: str, n: int, nodes: int, per_node: int, node: int, local_rank: int,
                     itemsize: int) -> dict[str, tuple[int, int]]:
    """``{"intra": (sent, recv), "inter": (sent, recv)}`` of the rank ``(node,
    local_rank)`` in a hierarchical reduce-scatter or all-gather (hpcdp.comm.hier_shard)
    of ``n`` elements, ranks node by node: recursive halving (doubling) over the node's
    ``L`` ranks on the packed buffer, and over the ``M`` nodes on slice ``local_rank``.
    With even division ``(L-1)/L * S`` intra-node, ``(M-1)/M * S / L`` inter-node."""
    if n == 0 or nodes * per_node == 1:
        return {"intra": (0, 0), "inter": (0, 0)}
    slice_at, piece_at = hier_shard_layout(n, nodes, per_node)
    return {"intra": halving_offsets_bytes(slice_at, per_node, local_rank, itemsize, collective),
            "inter": halving_offsets_bytes(piece_at(local_rank), nodes, node, itemsize, collective)}


__all__ = ["ring_bytes", "ring_messages", "ring_allreduce_bytes", "expected_step_bytes", "reduce_scatter_bytes", "all_gather_bytes",
           "recursive_bytes", "recursive_allreduce_bytes", "native_bytes", "native_allreduce_bytes",
           "native_reduce_scatter_bytes", "native_all_gather_bytes", "ps_push_bytes", "ps_pull_bytes",
           "zero_step_bytes", "hierarchical_bytes", "offsets_of", "halving_steps",
           "halving_offsets_bytes", "halving_reduce_scatter_bytes", "doubling_all_gather_bytes",
           "bruck_all_gather_bytes", "hier_shard_layout", "hier_shard_bytes"]
