"""Hierarchical reduce-scatter and all-gather: the fast links first, the slow ones on
1/L of the data.

Nodes are the communicator's topology (hpcdp.comm.nodes: ``MPI.COMM_TYPE_SHARED``, or
blocks of ``[comm] ranks_per_node`` ranks): ``M`` nodes of ``L`` ranks; rank ``g(m, l)`` is local
rank ``l`` on node ``m``. ZeRO's contract holds: rank ``r`` ends the reduce-scatter with
ring chunk ``r`` (``shard_range(n, N, r)``) and the all-gather starts from it.

The "node-local slice" of local rank ``l`` is the chunks of the ranks ``g(0, l), g(1,
l), ..., g(M-1, l)`` (one per node, the ranks that will own them). The buffer is packed
into a scratch slice by slice (slice 0 first, in node order inside a slice), then:

- reduce-scatter: (1) recursive-halving reduce-scatter of the packed buffer over the
  node's ``L`` ranks (intra-node links), chunk ``l`` = slice ``l``; (2) recursive-halving
  reduce-scatter of slice ``l`` over the ``M`` ranks with local rank ``l`` (inter-node
  links, one rank per node), chunk ``m`` = ring chunk ``g(m, l)``: this rank's;
- all-gather, the reverse: (1) recursive-doubling all-gather of slice ``l`` over the
  ranks with local rank ``l`` (inter-node), (2) of the packed buffer over the node
  (intra-node), then unpacked into ring order.

Addition order: the node's ranks' data is added first (the binary tree of
hpcdp.comm.schedules.halving over local ranks), then the nodes' partial sums (the tree over
nodes); integer payloads are exact in any order. ``mean``: sums, one division by N on
the owned chunk.

Bytes (hpcdp.comm.model.volume.hier_shard_bytes, per link kind, ledger names
``reduce_scatter.intra`` / ``.inter`` and ``all_gather.intra`` / ``.inter``): with even
division, ``(L-1)/L * S`` intra-node and ``(M-1)/M * S / L`` inter-node per rank per
collective, in ``log2 L + log2 M`` steps (non-powers of two fold as in halving.py).

The two sub-communicators it sends on are duplicates of the topology's (its own
tags never meet the hierarchical allreduce's), made on first use; hpcdp.comm.prepare
does that up front (ZeRO calls it at setup, while no request is in flight).
"""

from __future__ import annotations

from hpcdp.comm.schedules.halving import Peers, all_gather_steps, reduce_scatter_steps, scratch_like
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.core.requests import GenRequest
from hpcdp.comm.nodes import duplicate, topology


class Layout:
    """The communicator's topology (its rank table) and two duplicates of its
    sub-communicators (this module's own channels)."""

    def __init__(self, ctx, t, timeout):
        self.h = t
        self.local = duplicate(ctx, t.local, timeout, "hierarchical reduce-scatter setup")
        self.cross = duplicate(ctx, t.cross, timeout, "hierarchical reduce-scatter setup")
        self.table = t.table  # table[m][l] = rank in the communicator
        self.M, self.L = t.nodes, t.per_node
        self._packs: dict = {}  # n -> packing(n): groups and units repeat every step

    def packing(self, n: int, N: int):
        """``(src, dst, size)`` copies ring order -> packed order, and the offsets of the
        packed slices (``slice_at``, L+1 entries) and of this rank's slice's pieces
        (``piece_at``, M+1 entries)."""
        from hpcdp.shard import shard_range

        hit = self._packs.get(n)
        if hit is not None:
            return hit
        moves, pos = [], 0
        slice_at, piece_at = [0], None
        for l in range(self.L):
            pieces = [pos]
            for m in range(self.M):
                off, size = shard_range(n, N, self.table[m][l])
                moves.append((off, pos, size))
                pos += size
                pieces.append(pos)
            slice_at.append(pos)
            if l == self.h.local_rank:
                piece_at = pieces
        if len(self._packs) > 256:
            self._packs.clear()
        self._packs[n] = (moves, slice_at, piece_at)
        return self._packs[n]


def layout(ctx, timeout=None) -> Layout:
    """Built on first use (collective) and kept on the context (hpcdp.comm.forget)."""
    found = ctx.extra.get("hier_shard")
    if found is None:
        limit = ctx.timeout if timeout is None else float(timeout)
        found = ctx.extra["hier_shard"] = Layout(ctx, topology(ctx, timeout=limit), limit)
    return found


class _KindRequest(GenRequest):
    """Records its bytes per link kind (``<name>.intra``, ``<name>.inter``)."""

    def __init__(self, ctx, name, call, ledger, timeout, body, max_message_bytes):
        self.kind_ledger = ledger
        self.kinds = {"intra": [0, 0, 0, 0], "inter": [0, 0, 0, 0]}
        super().__init__(ctx, name, call, None, timeout, body, max_message_bytes)

    def mark(self, kind, before):
        now = (self.sent_bytes, self.recv_bytes, self.sent_msgs, self.recv_msgs)
        c = self.kinds[kind]
        for i in range(4):
            c[i] += now[i] - before[i]
        return now

    def figures(self):
        return (self.sent_bytes, self.recv_bytes, self.sent_msgs, self.recv_msgs)

    def _complete(self) -> None:
        super()._complete()
        if self.kind_ledger is not None:
            for kind, (s, r, sm, rm) in self.kinds.items():
                self.kind_ledger.record(f"{self.name}.{kind}", s, r, sm, rm, calls=1)


def start_reduce_scatter(ctx, call, ledger, timeout, *, src, out, in_place, result, op,
                         segment_bytes, max_message_bytes):
    """The registered start (hpcdp.comm.algorithms)."""
    lay = layout(ctx, timeout)
    h, n, N = lay.h, src.size, ctx.size
    moves, slice_at, piece_at = lay.packing(n, N)
    sub = resolve("sum") if op.is_mean else op
    cross_steps = 2 + lay.L.bit_length() + 1  # the intra phase's tags end below this

    def body(req):
        packed = scratch_like(req, n, src)
        for a, b, size in moves:
            packed[b:b + size] = src[a:a + size]
        tmp = scratch_like(req, n, src)
        before = req.figures()
        yield from reduce_scatter_steps(req, packed, slice_at.__getitem__, sub, tmp,
                                        Peers(lay.local, h.local_rank, lay.L))
        before = req.mark("intra", before)
        yield from reduce_scatter_steps(req, packed, piece_at.__getitem__, sub, tmp,
                                        Peers(lay.cross, h.node, lay.M), cross_steps)
        req.mark("inter", before)
        mine = packed[piece_at[h.node]:piece_at[h.node + 1]]
        op.finalize(mine, N)
        out[...] = mine

    req = _KindRequest(ctx, "reduce_scatter", call, ledger, timeout, body, max_message_bytes)
    req.result = result
    return req


def start_all_gather(ctx, call, ledger, timeout, *, full, result, segment_bytes,
                     max_message_bytes):
    """The registered start: ``full`` holds this rank's chunk in position."""
    lay = layout(ctx, timeout)
    h, n, N = lay.h, full.size, ctx.size
    moves, slice_at, piece_at = lay.packing(n, N)
    cross_steps = 2 + lay.L.bit_length() + 1
    a0, b0, size0 = moves[h.node + lay.M * h.local_rank]  # this rank's chunk

    def body(req):
        packed = scratch_like(req, n, full)
        packed[b0:b0 + size0] = full[a0:a0 + size0]
        before = req.figures()
        yield from all_gather_steps(req, packed, piece_at.__getitem__,
                                    Peers(lay.cross, h.node, lay.M), cross_steps)
        before = req.mark("inter", before)
        yield from all_gather_steps(req, packed, slice_at.__getitem__,
                                    Peers(lay.local, h.local_rank, lay.L))
        req.mark("intra", before)
        for a, b, size in moves:
            full[a:a + size] = packed[b:b + size]

    req = _KindRequest(ctx, "all_gather", call, ledger, timeout, body, max_message_bytes)
    req.result = result
    return req


__all__ = ["Layout", "layout", "start_reduce_scatter", "start_all_gather"]
