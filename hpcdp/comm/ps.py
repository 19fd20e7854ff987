"""Parameter-server primitives: workers push to and pull from server ranks.

The key space (a flat buffer of n elements) is split over the K server ranks with
``shard_range(n, K, j)``: server ``servers[j]`` owns shard j and talks to every
worker. By default every rank is a worker and rank 0 the one server (a worker may
double as server: it does not message itself).

- push: each worker sends shard j of its buffer to server j; server j reduces the
  workers' shards (``op``, in worker rank order, so results are deterministic).
- pull: server j sends its shard to every worker, which writes it at the shard's
  position of its buffer.
- ``ps_allreduce`` = push + pull: gather-to-server then broadcast back.

Bytes (ledger; S = buffer bytes, W workers, all workers also servers or not):
one server receives (W-1)*S in a push and sends (W-1)*S in a pull (W*S if it is
not a worker), while each worker sends and receives S (less its own shard if it
is a server). With K servers each server carries 1/K of that: the same total
volume as a ring allreduce, all on the servers' links.

Blocking and non-blocking: ``ips_push`` / ``ips_pull`` / ``ips_allreduce`` return
requests with ``test()`` / ``wait()``; ``wait()`` returns, on a server, its
reduced shard (push) and on a worker its buffer (pull).
"""

from __future__ import annotations

import numpy as np

from hpcdp.comm.collectives import _arrive, _check_writeable, flat_view
from hpcdp.comm.context import get_context
from hpcdp.comm.ops import resolve
from hpcdp.comm.requests import GenRequest
from hpcdp.shard import shard_range


def _roles(ctx, servers, workers):
    servers = [int(s) for s in servers]
    workers = list(range(ctx.size)) if workers is None else sorted(int(w) for w in workers)
    for what, ranks in (("servers", servers), ("workers", workers)):
        if not ranks:
            raise ValueError(f"parameter server: {what} must name at least one rank")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"parameter server: {what} {ranks} has duplicates")
        bad = [r for r in ranks if not 0 <= r < ctx.size]
        if bad:
            raise ValueError(f"parameter server: {what} {bad} outside the communicator (size {ctx.size})")
    return servers, workers


def _push(req, buf, servers, workers, op, out, step):
    """Generator: push ``buf`` (workers) and reduce into ``out`` (server); returns ``out``."""
    ctx = req.ctx
    rank, n, tag = ctx.rank, buf.size, ctx.tag(req.seq, step)
    sends = []
    if rank in workers:
        for j, srv in enumerate(servers):
            if srv != rank:
                off, size = shard_range(n, len(servers), j)
                if size:
                    sends += req.isend(buf[off:off + size], srv, tag)
    if rank in servers:
        j = servers.index(rank)
        off, size = shard_range(n, len(servers), j)
        others = [w for w in workers if w != rank]
        tmp = req.scratch(len(others) * size, buf.dtype)
        recvs = [req.irecv(tmp[i * size:(i + 1) * size], w, tag) if size else []
                 for i, w in enumerate(others)]
        have = rank in workers
        if have and out.ctypes.data != buf[off:off + size].ctypes.data:
            out[...] = buf[off:off + size]
        for i in range(len(others)):
            yield recvs[i]
            part = tmp[i * size:(i + 1) * size]
            if have:
                op.reduce(out, out, part)
            else:
                out[...] = part
                have = True
        op.finalize(out, len(workers))
    yield sends
    return out if rank in servers else None


def _pull(req, buf, servers, workers, shard, step):
    """Generator: servers send their shard, workers receive it into ``buf``."""
    ctx = req.ctx
    rank, n, tag = ctx.rank, buf.size, ctx.tag(req.seq, step)
    reqs = []
    if rank in servers:
        j = servers.index(rank)
        off, size = shard_range(n, len(servers), j)
        if shard is None or shard.size != size:
            raise ValueError(f"parameter server pull: server rank {rank} must pass shard= with "
                             f"shard_range({n}, {len(servers)}, {j}) = {size} elements")
        for w in workers:
            if w != rank and size:
                reqs += req.isend(shard, w, tag)
        if rank in workers and shard.ctypes.data != buf[off:off + size].ctypes.data:
            buf[off:off + size] = shard
    if rank in workers:
        for j, srv in enumerate(servers):
            off, size = shard_range(n, len(servers), j)
            if srv != rank and size:
                reqs += req.irecv(buf[off:off + size], srv, tag)
    yield reqs
    return buf if rank in workers else None


def _start(name, body, buf, comm, servers, workers, op_name, ledger, timeout, max_message_bytes):
    ctx = get_context(comm)
    servers, workers = _roles(ctx, servers, workers)
    call = _arrive(ctx, name, buf.dtype, buf.size, servers[0] * 65536 + len(servers),
                      "ps", op_name, timeout)
    return GenRequest(ctx, name, call, ledger, timeout,
                      lambda req: body(req, servers, workers), max_message_bytes)


def _server_out(ctx, buf, servers, out, in_place):
    if ctx.rank not in servers:
        return None
    off, size = shard_range(buf.size, len(servers), servers.index(ctx.rank))
    if out is not None:
        out = flat_view(out, "out")
        if out.size != size or out.dtype != buf.dtype:
            raise ValueError(f"parameter server push: out must be {size} elements of {buf.dtype} "
                             f"(this server's shard), got {out.size} of {out.dtype}")
        return out
    if in_place:
        return buf[off:off + size]
    return np.empty(size, dtype=buf.dtype)


def ips_push(buf, *, comm, servers=(0,), workers=None, op="sum", out=None, ledger=None,
             timeout=None, max_message_bytes=None):
    """Start a push; ``wait()`` returns the server's reduced shard (None on pure workers)."""
    ctx = get_context(comm)
    buf = flat_view(buf, "buf")
    op = resolve(op)
    srv, _ = _roles(ctx, servers, workers)
    target = _server_out(ctx, buf, srv, out, in_place=False)
    return _start("ps_push", lambda req, s, w: _push(req, buf, s, w, op, target, 0),
                  buf, comm, servers, workers, op.name, ledger, timeout, max_message_bytes)


def ips_pull(buf, *, comm, servers=(0,), workers=None, shard=None, ledger=None,
             timeout=None, max_message_bytes=None):
    """Start a pull into ``buf`` on workers; servers pass their ``shard``."""
    buf = flat_view(buf, "buf")
    _check_writeable(buf, "buf")
    shard = None if shard is None else flat_view(shard, "shard")
    return _start("ps_pull", lambda req, s, w: _pull(req, buf, s, w, shard, 0),
                  buf, comm, servers, workers, "", ledger, timeout, max_message_bytes)


def ips_allreduce(buf, *, comm, servers=(0,), workers=None, op="sum", ledger=None,
                  timeout=None, max_message_bytes=None):
    """Push + pull in place: every worker's ``buf`` ends with the reduction."""
    ctx = get_context(comm)
    buf = flat_view(buf, "buf")
    _check_writeable(buf, "buf")
    op = resolve(op)
    srv, wrk = _roles(ctx, servers, workers)
    target = _server_out(ctx, buf, srv, None, in_place=ctx.rank in wrk)

    def body(req, s, w):
        shard = yield from _push(req, buf, s, w, op, target, 0)
        return (yield from _pull(req, buf, s, w, shard, 1))
    return _start("ps_allreduce", body, buf, comm, servers, workers, op.name, ledger, timeout,
                  max_message_bytes)


def ps_push(buf, **kw):
    return ips_push(buf, **kw).wait()


def ps_pull(buf, **kw):
    return ips_pull(buf, **kw).wait()


def ps_allreduce(buf, **kw):
    return ips_allreduce(buf, **kw).wait()
