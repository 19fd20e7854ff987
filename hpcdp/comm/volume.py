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
  handed to the MPI call (:func:`native_bytes`); :func:`collective_bytes` resolves
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


def collective_bytes(collective: str, algorithm: str, n: int, N: int, rank: int,
                     itemsize: int) -> tuple[int, int]:
    """(sent, received) bytes of one ``collective`` (allreduce, reduce_scatter,
    all_gather) with ``algorithm`` ("auto" resolved by hpcdp.comm.auto.choose): the
    formula the algorithm registered (hpcdp.comm.algorithms)."""
    from hpcdp.comm.algorithms import get
    from hpcdp.comm.auto import choose

    algo = choose(collective, n * itemsize, N, algorithm)
    formula = get(collective, algo).bytes
    if formula is None:  # e.g. hierarchical: bytes per link kind, from the node layout
        raise ValueError(f"collective_bytes: the {algo} {collective} moves bytes on two link kinds; "
                         f"use {algo}_bytes (hierarchical_bytes(n, nodes, per_node, node, local_rank, "
                         "itemsize) for the hierarchical allreduce)")
    return formula(n, N, rank, itemsize)


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


__all__ = ["ring_bytes", "ring_messages", "ring_allreduce_bytes", "expected_step_bytes", "reduce_scatter_bytes", "all_gather_bytes",
           "recursive_bytes", "recursive_allreduce_bytes", "native_bytes", "native_allreduce_bytes",
           "native_reduce_scatter_bytes", "native_all_gather_bytes", "collective_bytes", "ps_push_bytes", "ps_pull_bytes",
           "zero_step_bytes", "hierarchical_bytes"]
