"""MPI's own collectives as a selectable algorithm and as the baseline.

Started as non-blocking MPI collectives (Iallreduce, Ireduce_scatter,
Iallgatherv) so they poll under the same timeout as hpcdp's own algorithms. The
ledger records the bytes handed to MPI (one message each way per piece); what MPI
moves internally is not visible. Allreduce buffers are cut into pieces below
2 GiB; reduce-scatter and all-gather pass per-rank counts, which mpi4py sends
through MPI-4 large-count calls when a chunk exceeds the int limit.
"""

from __future__ import annotations

from mpi4py import MPI

from hpcdp.comm.core.ops import mpi_datatype
from hpcdp.comm.core.requests import pieces
from hpcdp.shard import shard_bounds


def native_allreduce(req, src, work, op):
    ctx, T = req.ctx, mpi_datatype(work.dtype)
    mpi_op = op.mpi_op(work.dtype)
    itemsize = work.dtype.itemsize
    reqs = []
    for o, ln in pieces(work.size, itemsize, req.max_bytes):
        s = MPI.IN_PLACE if src is work else [src[o:o + ln], T]
        reqs.append(ctx.data.Iallreduce(s, [work[o:o + ln], T], mpi_op))
        req.sent_bytes += ln * itemsize
        req.recv_bytes += ln * itemsize
        req.sent_msgs += 1
        req.recv_msgs += 1
    yield reqs
    op.finalize(work, ctx.size)


def native_reduce_scatter(req, src, out, op):
    ctx, T = req.ctx, mpi_datatype(src.dtype)
    counts = [size for _, size in shard_bounds(src.size, ctx.size)]
    itemsize = src.dtype.itemsize
    yield [ctx.data.Ireduce_scatter([src, T], [out, T], counts, op.mpi_op(src.dtype))]
    req.sent_bytes += src.size * itemsize
    req.recv_bytes += out.size * itemsize
    req.sent_msgs += 1
    req.recv_msgs += 1
    op.finalize(out, ctx.size)


def native_all_gather(req, chunk, full, in_place):
    ctx, T = req.ctx, mpi_datatype(full.dtype)
    bounds = shard_bounds(full.size, ctx.size)
    counts = [size for _, size in bounds]
    displs = [off for off, _ in bounds]
    s = MPI.IN_PLACE if in_place else [chunk, T]
    yield [ctx.data.Iallgatherv(s, [full, counts, displs, T])]
    itemsize = full.dtype.itemsize
    req.sent_bytes += counts[ctx.rank] * itemsize
    req.recv_bytes += full.size * itemsize
    req.sent_msgs += 1
    req.recv_msgs += 1



def start_allreduce(ctx, call, ledger, timeout, *, src, work, result, op, segment_bytes, max_message_bytes):
    """The registered start of MPI's own allreduce (hpcdp.comm.algorithms)."""
    from hpcdp.comm.core.requests import GenRequest

    req = GenRequest(ctx, "allreduce", call, ledger, timeout,
                     lambda r: native_allreduce(r, src, work, op), max_message_bytes)
    req.result = result
    return req
