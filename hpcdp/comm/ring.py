"""The ring: reduce-scatter, all-gather and allreduce on point-to-point calls, and its
Python engine (:class:`RingRequest`). The schedule below (steps, segments and their
rules) is computed once, by hpcdp.comm.schedules.ring, for this engine and the compiled
one (hpcdp.comm.engines.compiled).

Rank r talks only to its neighbours: it sends to ``r+1`` and receives from
``r-1`` (mod N). Chunk c of the buffer is ``shard_range(n, N, c)``.

- Reduce-scatter, steps t = 0..N-2: rank r sends chunk ``(r-t-1) mod N`` and
  receives chunk ``(r-t-2) mod N``, which it reduces with its own copy of that
  chunk. The chunk it receives at step t is the one it forwards at step t+1, so
  after N-1 steps rank r owns chunk r fully reduced.
- All-gather, steps u = 0..N-2: rank r sends chunk ``(r-u) mod N`` and receives
  chunk ``(r-u-1) mod N`` straight into place (copy instead of add).

Per rank, reduce-scatter sends every chunk but its own (``n - |chunk r|``
elements) and receives every chunk but ``r-1``'s; all-gather sends every chunk
but ``r+1``'s and receives every chunk but its own. With ``N | n`` each phase
moves ``(N-1)/N * S`` bytes each way, allreduce ``2(N-1)/N * S``.

Pipelining: each chunk is cut into segments of ``segment_bytes``. The segment k
received at step t is reduced and immediately forwarded as segment k of step
t+1 (Isend/Irecv), so sending one segment overlaps receiving and adding the
next. Received reduce-scatter segments land in a scratch of two chunk-sized
slots (step parity), reused once the segment two steps back has been reduced:
scratch memory is ``2 * ceil(n/N)`` elements, not ``n``. An out-of-place
reduce-scatter runs its other chunks through a pooled full-length scratch, and its
last step reduces this rank's chunk straight into the caller's output (no final
copy). Messages of one step
share one tag and are posted in segment order on both sides (MPI keeps order per
sender and tag), steps have distinct tags, and concurrent requests distinct
tag ranges (sequence numbers).

16-bit wire (``wire``, hpcdp.comm.engines.wire): the buffers stay float32 and only the
messages are 16-bit. Received reduce-scatter segments land in a 16-bit scratch, are
widened into a float32 segment and reduced in float32; what is sent is narrowed
into a 16-bit mirror of the buffer first (one for the reduce-scatter's sends, one
that all-gather messages are received into and forwarded from). hpcdp.comm.engines.wire
says where rounding happens.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.requests import Request, mpi_buffer
from hpcdp.comm.schedules.ring import REDUCE, WINDOW, ring_schedule
from hpcdp.shard import place_shard, shard_range

DEFAULT_SEGMENT_BYTES = 1 << 20


class RingRequest(Request):
    """A ring collective as a progressable state machine (see module docstring).

    ``work`` is the full-length buffer the ring runs in (the result for
    allreduce/all-gather); ``src`` holds this rank's contribution (``src is
    work`` in place). ``phases`` is a subset of ``("rs", "ag")``.
    """

    def __init__(self, ctx, name, call, ledger, timeout, *, work, src, op, phases,
                 segment_bytes=DEFAULT_SEGMENT_BYTES, max_message_bytes=None,
                 result=None, final_out=None, wire=None):
        super().__init__(ctx, name, call, ledger, timeout, max_message_bytes)
        N, r = ctx.size, ctx.rank
        if work is None:  # out-of-place reduce-scatter: chunks pass through a pooled scratch
            work = self._scratch_like(src, src.size)
        self.work, self.src, self.op, self.N = work, src, op, N
        self.result = result
        # out-of-place reduce-scatter: ``(out, off, size)``, this rank's chunk of the
        # scratch is ``out`` itself: the last step reduces straight into it (no copy)
        self.final_out = final_out
        self.left, self.right = (r - 1) % N, (r + 1) % N
        self.wire = wire
        itemsize = work.dtype.itemsize if wire is None else wire.itemsize
        seg_bytes = self.max_bytes if segment_bytes is None else min(int(segment_bytes), self.max_bytes)
        if seg_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1 (or None for whole chunks), got {segment_bytes}")
        seg = max(1, seg_bytes // itemsize)
        sch = ring_schedule(work.size, N, r, seg, tuple(phases), src is not work)
        self.seg, self.bounds, self.nseg, self.steps = seg, sch.bounds, sch.nseg, sch.steps
        T = len(sch.steps)
        self.last_rs, self.mc = sch.last_rs, sch.mc
        self.tmp = None
        if "rs" in phases and N > 1 and self.mc > 0:  # (a 16-bit wire: 16-bit slots)
            self.tmp = self._scratch_like(work, 2 * self.mc) if wire is None else \
                self.scratch(2 * self.mc, wire.dtype)
        if wire is not None:  # 16-bit messages, float32 sums (module docstring)
            self._wire_scratch(phases, N)
        self.tags = [ctx.tag(self.seq, t) for t in range(T)]
        self.send_next, self.send_ready = [0] * T, [set() for _ in range(T)]
        self.recv_next, self.recv_ok = [0] * T, [set() for _ in range(T)]
        self.recvs, self.recv_meta = [], []  # posted receives, at most WINDOW
        self.sends, self.send_meta = [], []  # posted sends; None once complete
        self.send_head = 0                    # sends before it are all complete
        self.sends_open = 0
        self.left_recv, self.left_send = sch.left_recv, sch.left_send
        # an all-gather receive waits for the reduce-scatter send that reads its chunk
        self.copy_after = dict(sch.copy_after)
        if T:
            for k in range(self.nseg[self.steps[0][0]]):
                self._ready_send(0, k)
        for t, k in sch.open_recvs:
            self._allow_recv(t, k)

    def _wire_scratch(self, phases, N) -> None:
        n, wd = self.work.size, self.wire.dtype
        if self.tmp is not None:
            self.w32 = self.scratch(min(self.seg, self.mc), np.float32)
        self.wrs = self.scratch(n, wd) if "rs" in phases and N > 1 else None
        self.wag = self.scratch(n, wd) if "ag" in phases and N > 1 else None

    def _wire_send(self, t, lo, hi):
        """The 16-bit words of this send (narrowed now where they are not yet)."""
        sc, _, kind = self.steps[t]
        if kind == REDUCE:
            if t == 0:  # later steps: narrowed when the segment was reduced (_on_recv)
                self.wire.narrow(self.src[lo:hi], self.wrs[lo:hi])
            return self.wrs[lo:hi]
        if sc == self.ctx.rank:  # all-gather of the own chunk: everyone gets the same bits
            self.wire.round_trip(self.work[lo:hi], self.wag[lo:hi])
        return self.wag[lo:hi]

    def _scratch_like(self, like, n):
        if isinstance(like, np.ndarray):
            return self.scratch(n, like.dtype)
        from hpcdp.comm.core.device import device_scratch
        return device_scratch(self.ctx, n, like.dtype)

    def _seg(self, chunk, k):
        off, size = self.bounds[chunk]
        lo = off + k * self.seg
        return lo, min(lo + self.seg, off + size)

    def _ready_send(self, t, k):
        ready = self.send_ready[t]
        ready.add(k)
        sc, _, kind = self.steps[t]
        buf = self.src if (t == 0 and kind == REDUCE) else self.work
        while self.send_next[t] in ready:
            kk = self.send_next[t]
            ready.discard(kk)
            lo, hi = self._seg(sc, kk)
            msg = buf[lo:hi] if self.wire is None else self._wire_send(t, lo, hi)
            self.sends.append(self.ctx.data.Isend(mpi_buffer(msg), self.right, self.tags[t]))
            self.send_meta.append((t, kk))
            self.sends_open += 1
            self.sent_bytes += (hi - lo) * msg.dtype.itemsize
            self.sent_msgs += 1
            self.send_next[t] += 1

    def _allow_recv(self, t, k):
        self.recv_ok[t].add(k)
        if len(self.recvs) < WINDOW:
            self._post_recvs()

    def _post_recvs(self):
        """Post allowed receives, earliest step first, in segment order per step."""
        for t in range(len(self.steps)):
            ok = self.recv_ok[t]
            if not ok:
                continue
            _, rc, kind = self.steps[t]
            while self.recv_next[t] in ok:
                if len(self.recvs) >= WINDOW:
                    return
                kk = self.recv_next[t]
                ok.discard(kk)
                lo, hi = self._seg(rc, kk)
                if kind == REDUCE:
                    base = (t % 2) * self.mc + kk * self.seg
                    target = self.tmp[base:base + hi - lo]
                else:
                    target = self.work[lo:hi] if self.wire is None else self.wag[lo:hi]
                req = self.ctx.data.Irecv(mpi_buffer(target), self.left, self.tags[t])
                self.recvs.append(req)
                self.recv_meta.append((t, kk))
                self._recv_src[id(req)] = (req, self.left)
                self.recv_bytes += (hi - lo) * target.dtype.itemsize
                self.recv_msgs += 1
                self.recv_next[t] += 1

    def _on_recv(self, t, k):
        _, rc, kind = self.steps[t]
        if kind == REDUCE:
            lo, hi = self._seg(rc, k)
            base = (t % 2) * self.mc + k * self.seg
            if t == self.last_rs and self.final_out is not None:
                res, roff, _ = self.final_out
                out = res[lo - roff:hi - roff]
            else:
                out = self.work[lo:hi]
            got = self.tmp[base:base + hi - lo]
            if self.wire is not None:  # widen exactly, add in float32
                self.wire.widen(got, self.w32[:hi - lo])
                got = self.w32[:hi - lo]
            self.op.reduce(out, got, self.src[lo:hi])
            if t == self.last_rs:
                self.op.finalize(out, self.N)
            elif self.wire is not None:  # the float32 partial sum, narrowed to be forwarded
                self.wire.narrow(out, self.wrs[lo:hi])
            t2 = t + 2
            if t2 < len(self.steps) and self.steps[t2][2] == REDUCE and k < self.nseg[self.steps[t2][1]]:
                self._allow_recv(t2, k)
        elif self.wire is not None:  # an all-gather segment: widen into place
            lo, hi = self._seg(rc, k)
            self.wire.widen(self.wag[lo:hi], self.work[lo:hi])
        if t + 1 < len(self.steps):
            self._ready_send(t + 1, k)
        self.left_recv -= 1

    def _on_send(self, t, k):
        self.left_send -= 1
        waiting = self.copy_after.pop((t, k), None)
        if waiting is not None:
            self._allow_recv(waiting, k)

    def _test_sends(self) -> bool:
        """Testsome over the WINDOW oldest open sends (amortised O(WINDOW))."""
        while self.send_head < len(self.sends) and self.sends[self.send_head] is None:
            self.send_head += 1
        pos = []
        i = self.send_head
        while i < len(self.sends) and len(pos) < WINDOW:
            if self.sends[i] is not None:
                pos.append(i)
            i += 1
        idx = MPI.Request.Testsome([self.sends[i] for i in pos])
        if not idx:
            return False
        for j in idx:
            i = pos[j]
            self.sends[i] = None
            self.sends_open -= 1
            self._on_send(*self.send_meta[i])
        return True

    def _progress(self) -> bool:
        progressed = True
        while progressed:
            progressed = False
            if self.recvs:
                idx = MPI.Request.Testsome(self.recvs)
                if idx:
                    progressed = True
                    events = [self.recv_meta[i] for i in idx]
                    finished = set(idx)
                    self.recvs = [q for i, q in enumerate(self.recvs) if i not in finished]
                    self.recv_meta = [m for i, m in enumerate(self.recv_meta) if i not in finished]
                    for t, k in events:
                        self._on_recv(t, k)
                    self._post_recvs()
            if self.sends_open:
                progressed |= self._test_sends()
        if self.left_recv == 0 and self.left_send == 0:
            return True
        return False


def expected_bytes(n: int, N: int, rank: int, itemsize: int,
                   phases=("rs", "ag")) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` in a ring over ``n`` elements
    (:func:`hpcdp.comm.model.volume.ring_bytes`, the one formula)."""
    from hpcdp.comm.model.volume import ring_bytes

    return ring_bytes(n, N, rank, itemsize, phases)


# -- the ring's launch from checked buffers (hpcdp.comm.engines.registry's ``bufs``) ----

def ring_arguments(ctx, collective: str, bufs: dict) -> dict:
    """The ring request's buffers for one collective's checked buffers (an allreduce's
    ``src, work, result, op``; a reduce-scatter's ``src, out, in_place, result, op``; an
    all-gather's ``chunk, full, result``, the chunk copied into place here): ``work,
    src, op, phases, result, final_out``. Both engines that run the ring use it."""
    if collective == "allreduce":
        return dict(work=bufs["work"], src=bufs["src"], op=bufs["op"], phases=("rs", "ag"),
                    result=bufs["result"], final_out=None)
    if collective == "reduce_scatter":
        src, out = bufs["src"], bufs["out"]
        if bufs["in_place"]:
            return dict(work=src, src=src, op=bufs["op"], phases=("rs",),
                        result=bufs["result"], final_out=None)
        off = shard_range(src.size, ctx.size, ctx.rank)[0]
        return dict(work=None, src=src, op=bufs["op"], phases=("rs",), result=bufs["result"],
                    final_out=(out, off, out.size))
    full, chunk = bufs["full"], bufs.get("chunk")
    if chunk is not None:
        place_shard(full, chunk, ctx.size, ctx.rank)
    return dict(work=full, src=full, op=None, phases=("ag",), result=bufs["result"],
                final_out=None)


def start(ctx, call, ledger, timeout, *, collective, segment_bytes, max_message_bytes,
          wire=None, **bufs) -> RingRequest:
    """The ring's registered start (hpcdp.comm.algorithms, one per collective with
    ``collective`` bound): the ring on the Python engine. ``wire``: a 16-bit
    hpcdp.comm.engines.wire.Wire or None."""
    return RingRequest(ctx, collective, call, ledger, timeout, segment_bytes=segment_bytes,
                       max_message_bytes=max_message_bytes, wire=wire,
                       **ring_arguments(ctx, collective, bufs))
