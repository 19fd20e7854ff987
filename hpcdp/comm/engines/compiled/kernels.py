"""The compiled ring's state machine: ``advance``, ``@njit(nogil=True, cache=True)``,
posts, tests and reduces every segment of a ring collective, calling MPI through
the addresses in its plan (hpcdp.comm.engines.compiled.ccall, .binding).

It is hpcdp.comm.ring's algorithm step for step (that module's docstring): the same
chunks, segments, tags, scratch slots, receive window and dependency rules, so the
same segments are added in the same order (``received (op) own``) and results are
bit-for-bit the Python ring's. Only the bookkeeping moved from Python sets and lists
into flat arrays:

- message ``m = t * S + k`` (step t, segment k; S the most segments of a chunk);
  ``recv_st[m]`` / ``send_st[m]``: 0 waiting, 1 allowed/ready, 2 posted, 3 complete;
- posted requests live in ``rreq`` / ``sreq`` in posting order (slot j, message
  ``rmeta[j]``); ``MPI_Testsome`` runs over a window from the oldest open slot;
- ``st`` holds the counters (``ST_*`` below): open requests, remaining messages and
  the ledger's bytes and messages, counted when posted as the Python ring does.

``advance`` returns DONE, PROGRESS (something moved), IDLE, ABORTED (the communicator's
abort flag is set: hpcdp.comm.abort), TIMEOUT (CLOCK_MONOTONIC,
time.monotonic's clock, passed the deadline), PEER (a peer started the missing-rank diagnosis: its status
message waits on the control communicator) or FAILED (an MPI call returned an
error: ``st[ST_ERR]``). Modes: ``ONCE`` (passes until nothing moves; ``test()``),
``BLOCK`` (until done or the deadline, spinning like MPI and yielding the core
after SPIN_POLLS fruitless polls as hpcdp.comm.core.debug does; ``wait()``),
``BACKGROUND`` (the progress thread: sleeps between fruitless passes with a
doubling back-off, never busy-polls, returns when done, at the deadline or when
``st[ST_STOP]`` asks it to hand over to a waiting thread).
"""

from __future__ import annotations

import numpy as np
import math

from numba import njit

from hpcdp.comm.engines.compiled.ccall import ccall, peek
from hpcdp.comm.schedules.ring import REDUCE, WINDOW  # the ring's one schedule: a step's kind, receives posted

DONE, PROGRESS, IDLE, TIMEOUT, PEER, FAILED, ABORTED = 1, 2, 0, -1, -2, -3, -4
ONCE, BLOCK, BACKGROUND = 0, 1, 2
# ``mode | (tag base + 1) << FRESH_SHIFT``: a mode that also asks for the reset
# (P_FRESH), one Python integer instead of a store into the state (the blocking front)
FRESH_SHIFT = 2
FRESH_SHIFT_MASK = (1 << FRESH_SHIFT) - 1
OP_SUM, OP_MAX, OP_MIN = 0, 1, 2
TEST_WINDOW = 64   # requests per MPI_Testsome
SPIN_POLLS = 2000  # as hpcdp.comm.core.debug.SPIN_POLLS

# One int64 array ``I`` carries the plan and the state (a call into compiled code
# costs per argument, so there are few). Its head P holds the scalars below, then
# the offsets of its sections: st, steps (T x 4: send chunk, receive chunk, kind,
# tag), chunk offsets / sizes / segment counts (N each), and per message recv_st,
# send_st, copy_after, rmeta, smeta (T*S each), recv_next, send_next (T each).
P_N, P_T, P_S, P_SEG, P_ITEM, P_LEFT, P_RIGHT, P_LAST_RS, P_OP, P_MEAN, P_INT, \
    P_MC, P_STATUS_TAG, P_HSIZE, P_ANY, P_BACKOFF, \
    O_ST, O_STEPS, O_OFF, O_SIZE, O_NSEG, O_RST, O_SST, O_COPY, O_RMETA, O_SMETA, \
    O_RNEXT, O_SNEXT, O_END, \
    F_ISEND, F_IRECV, F_TESTSOME, F_IPROBE, F_CLOCK, F_USLEEP, F_YIELD, P_HALF, \
    P_FRESH, P_TAGBASE, P_NULL, P_RES_OFF, P_ABORT = range(42)
P_LEN = 42
# P_ABORT: the address of the communicator's abort flag (an int64, hpcdp.comm.abort):
# nonzero makes advance return ABORTED (checked on entry and every 64 idle polls)
# P_RES_OFF: an out-of-place reduce-scatter's last step reduces its chunk straight
# into the caller's output ``res`` (``res[i - P_RES_OFF]`` for buffer index i); -1:
# every step writes ``work``
# A state is reused call after call (hpcdp.comm.engines.compiled.request.State): ``I`` holds
# the live part [0, L) (L = P[O_END]) and the plan's template after it [L, 2L). The
# caller writes the call's tag base + 1 into P_FRESH of the live part (one store), or
# passes it in the mode (FRESH_SHIFT); the next ``advance`` then resets the live part from the template (P_TAGBASE = the base,
# P_FRESH = 0), writes the tags and sets every request handle to MPI_REQUEST_NULL
# (P_NULL) inside compiled code. The reset keeps st[ST_STOP]: a waiting thread may
# have asked for the request before the progress thread's first pass (request.wait).
# after the 2*T*S request handles, H holds the handles of the data communicator, the
# control communicator and MPI_BYTE (H's dtype is the ABI's handle width)
H_COMM, H_CTRL, H_BYTE = 0, 1, 2
CLOCK_MONOTONIC = 1  # Linux; time.monotonic() reads the same clock
# st: the state's scalars
ST_LEFT_RECV, ST_LEFT_SEND, ST_RHEAD, ST_RPOST, ST_SHEAD, ST_SPOST, ST_OPEN_R, ST_OPEN_S, \
    ST_SENT_B, ST_RECV_B, ST_SENT_M, ST_RECV_M, ST_ERR, ST_STOP, ST_POLLS, ST_TS = range(16)
ST_LEN = 18  # ST_TS, ST_TS + 1: a struct timespec



@njit(nogil=True, cache=True)
def _reduce(op, out, a, b_):
    # out = a (op) b over three equal-length contiguous slices: numpy's np.add /
    # np.maximum / np.minimum elementwise (max, min: NaN in either propagates, as
    # numpy's). Its own function on slices, not inlined into _pass: there LLVM kept
    # the loop scalar (one vaddss per element); here it vectorises it (vaddps for
    # float32, inspect_asm), the same IEEE operation per element, so the same bits.
    n = out.size
    if op == OP_SUM:
        for i in range(n):
            out[i] = a[i] + b_[i]
    elif op == OP_MAX:
        for i in range(n):
            x, y = a[i], b_[i]
            r = x if x > y else y
            out[i] = x if x != x else r
    else:
        for i in range(n):
            x, y = a[i], b_[i]
            r = x if x < y else y
            out[i] = x if x != x else r

# float16: Numba has no half arithmetic on the CPU, so half buffers travel as uint16
# and each element is converted, computed in float32 and rounded back, exactly as
# NumPy's half loops do (npy_half_to_float, the float32 operation, npy_float_to_half
# with round-to-nearest-even; max/min: (a >= b or isnan(a)) ? a : b on the halves;
# a NaN operand comes back quieted, an invalid operation as NumPy's default NaN).
@njit(nogil=True, cache=True, inline="always")
def _h2f(h):
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    if e == 0:
        v = math.ldexp(float(m), -24)
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(float(1024 + m), e - 25)
    return np.float32(-v if h & 0x8000 else v)


@njit(nogil=True, cache=True, inline="always")
def _rne(x):
    fl = math.floor(x)
    d = x - fl
    if d > 0.5 or (d == 0.5 and int(fl) % 2 == 1):
        fl += 1.0
    return int(fl)


@njit(nogil=True, cache=True, inline="always")
def _f2h(v):
    """float32 value (not NaN) -> half bits, round to nearest even."""
    s = 0x8000 if math.copysign(1.0, v) < 0 else 0
    a = abs(float(v))
    if a >= 65520.0:  # 65504 is the largest half; 65520 and up round to inf
        return s | 0x7C00
    if a < 6.103515625e-05:  # 2**-14: subnormal (or the smallest normal after rounding)
        return s | _rne(math.ldexp(a, 24))
    E = math.frexp(a)[1] - 1
    r = _rne(math.ldexp(a, 10 - E))
    if r == 2048:
        r, E = 1024, E + 1
    if E + 15 >= 31:
        return s | 0x7C00
    return s | ((E + 15) << 10) | (r - 1024)


@njit(nogil=True, cache=True, inline="always")
def _half_op(op, x, y):
    hx, hy = np.uint32(x), np.uint32(y)
    nx, ny = (hx & 0x7FFF) > 0x7C00, (hy & 0x7FFF) > 0x7C00
    fx, fy = _h2f(hx), _h2f(hy)
    if op == OP_MAX:
        return hx if (fx >= fy or nx) else hy
    if op == OP_MIN:
        return hx if (fx <= fy or nx) else hy
    if nx:
        return hx | 0x200
    if ny:
        return hy | 0x200
    r = np.float32(fx + fy)
    if r != r:
        return np.uint32(0xFE00)
    return np.uint32(_f2h(r))


@njit(nogil=True, cache=True, inline="always")
def _half_div(x, n):
    hx = np.uint32(x)
    if (hx & 0x7FFF) > 0x7C00:
        return hx | 0x200
    return np.uint32(_f2h(np.float32(_h2f(hx) / np.float32(n))))


@njit(nogil=True, cache=True)
def _reduce_half(op, out, a, b_):
    for i in range(out.size):
        out[i] = _half_op(op, a[i], b_[i])


@njit(nogil=True, cache=True)
def _finalize_half(out, lo, n, N):
    for i in range(lo, lo + n):
        out[i] = _half_div(out[i], N)


@njit(nogil=True, cache=True, inline="always")
def _finalize(out, lo, n, is_int, div):
    # mean: np.floor_divide(a, N) for integers, np.true_divide(a, dtype(N)) else
    if is_int:
        for i in range(lo, lo + n):
            out[i] = out[i] // div[0]
    else:
        for i in range(lo, lo + n):
            out[i] = out[i] / div[0]

@njit(nogil=True, cache=True)
def _post_sends(t, P, hv, steps, off, size, nseg, work, src, st, send_st, send_next, sreq,
                smeta):
    S, seg, item, hs = P[P_S], P[P_SEG], P[P_ITEM], P[P_HSIZE]
    sc, kind, tag = steps[t, 0], steps[t, 2], steps[t, 3]
    base = src.ctypes.data if (t == 0 and kind == REDUCE) else work.ctypes.data
    end = off[sc] + size[sc]
    while send_next[t] < nseg[sc] and send_st[t * S + send_next[t]] == 1:
        kk = send_next[t]
        lo = off[sc] + kk * seg
        hi = min(lo + seg, end)
        j = st[ST_SPOST]
        err = ccall(P[F_ISEND], (base + lo * item, np.int32((hi - lo) * item), hv[H_BYTE],
                                 np.int32(P[P_RIGHT]), np.int32(tag), hv[H_COMM],
                                 sreq.ctypes.data + j * hs))
        if err != 0:
            st[ST_ERR] = err
            return
        smeta[j] = t * S + kk
        send_st[t * S + kk] = 2
        st[ST_SPOST] += 1
        st[ST_OPEN_S] += 1
        st[ST_SENT_B] += (hi - lo) * item
        st[ST_SENT_M] += 1
        send_next[t] += 1

@njit(nogil=True, cache=True)
def _post_recvs(P, hv, steps, off, size, nseg, work, tmp, st, recv_st, recv_next, rreq, rmeta):
    T, S, seg, item, hs, mc = P[P_T], P[P_S], P[P_SEG], P[P_ITEM], P[P_HSIZE], P[P_MC]
    for t in range(T):
        rc, kind, tag = steps[t, 1], steps[t, 2], steps[t, 3]
        end = off[rc] + size[rc]
        while recv_next[t] < nseg[rc] and recv_st[t * S + recv_next[t]] == 1:
            if st[ST_OPEN_R] >= WINDOW:
                return
            kk = recv_next[t]
            lo = off[rc] + kk * seg
            hi = min(lo + seg, end)
            if kind == REDUCE:
                addr = tmp.ctypes.data + ((t % 2) * mc + kk * seg) * item
            else:
                addr = work.ctypes.data + lo * item
            j = st[ST_RPOST]
            err = ccall(P[F_IRECV], (addr, np.int32((hi - lo) * item), hv[H_BYTE],
                                     np.int32(P[P_LEFT]), np.int32(tag), hv[H_COMM],
                                     rreq.ctypes.data + j * hs))
            if err != 0:
                st[ST_ERR] = err
                return
            rmeta[j] = t * S + kk
            recv_st[t * S + kk] = 2
            st[ST_RPOST] += 1
            st[ST_OPEN_R] += 1
            st[ST_RECV_B] += (hi - lo) * item
            st[ST_RECV_M] += 1
            recv_next[t] += 1

@njit(nogil=True, cache=True)
def _pass(P, hv, steps, off, size, nseg, work, src, res, tmp, div, st, recv_st, send_st, recv_next,
          send_next, copy_after, rreq, rmeta, sreq, smeta, idx, outc, stat):
    """One round of tests and the work they release; True if anything moved."""
    T, S, seg, hs, N = P[P_T], P[P_S], P[P_SEG], P[P_HSIZE], P[P_N]
    moved = False
    lo = st[ST_RHEAD]
    n = min(st[ST_RPOST] - lo, TEST_WINDOW)
    if n > 0:
        err = ccall(P[F_TESTSOME], (np.int32(n), rreq.ctypes.data + lo * hs, outc.ctypes.data,
                                    idx.ctypes.data, stat.ctypes.data))
        if err != 0:
            st[ST_ERR] = err
            return False
        for q in range(max(outc[0], 0)):  # MPI_UNDEFINED (< 0): all null
            m = rmeta[lo + idx[q]]
            recv_st[m] = 3
            st[ST_OPEN_R] -= 1
            moved = True
            t, k = m // S, m % S
            rc, kind = steps[t, 1], steps[t, 2]
            if kind == REDUCE:
                slo = off[rc] + k * seg
                ln = min(seg, off[rc] + size[rc] - slo)
                abase = (t % 2) * P[P_MC] + k * seg
                dst, dlo = work, slo
                if t == P[P_LAST_RS] and P[P_RES_OFF] >= 0:
                    dst, dlo = res, slo - P[P_RES_OFF]
                if P[P_HALF]:
                    _reduce_half(P[P_OP], dst[dlo:dlo + ln], tmp[abase:abase + ln],
                                 src[slo:slo + ln])
                else:
                    _reduce(P[P_OP], dst[dlo:dlo + ln], tmp[abase:abase + ln],
                            src[slo:slo + ln])
                if t == P[P_LAST_RS] and P[P_MEAN]:
                    if P[P_HALF]:
                        _finalize_half(dst, dlo, ln, N)
                    else:
                        _finalize(dst, dlo, ln, P[P_INT], div)
                t2 = t + 2
                if t2 < T and steps[t2, 2] == REDUCE and k < nseg[steps[t2, 1]]:
                    recv_st[t2 * S + k] = 1
            if t + 1 < T:
                send_st[(t + 1) * S + k] = 1
                _post_sends(t + 1, P, hv, steps, off, size, nseg, work, src, st, send_st,
                            send_next, sreq, smeta)
            st[ST_LEFT_RECV] -= 1
        while st[ST_RHEAD] < st[ST_RPOST] and recv_st[rmeta[st[ST_RHEAD]]] == 3:
            st[ST_RHEAD] += 1
        if moved:
            _post_recvs(P, hv, steps, off, size, nseg, work, tmp, st, recv_st, recv_next, rreq,
                        rmeta)
    lo = st[ST_SHEAD]
    n = min(st[ST_SPOST] - lo, TEST_WINDOW)
    if n > 0 and st[ST_ERR] == 0:
        err = ccall(P[F_TESTSOME], (np.int32(n), sreq.ctypes.data + lo * hs, outc.ctypes.data,
                                    idx.ctypes.data, stat.ctypes.data))
        if err != 0:
            st[ST_ERR] = err
            return False
        got = False
        for q in range(max(outc[0], 0)):  # MPI_UNDEFINED (< 0): all null
            m = smeta[lo + idx[q]]
            send_st[m] = 3
            st[ST_OPEN_S] -= 1
            st[ST_LEFT_SEND] -= 1
            moved = got = True
            w = copy_after[m]
            if w >= 0:
                recv_st[w * S + m % S] = 1
        while st[ST_SHEAD] < st[ST_SPOST] and send_st[smeta[st[ST_SHEAD]]] == 3:
            st[ST_SHEAD] += 1
        if got:
            _post_recvs(P, hv, steps, off, size, nseg, work, tmp, st, recv_st, recv_next, rreq,
                        rmeta)
    return moved

@njit(nogil=True, cache=True)
def _reset(I, H):
    """A fresh call on a reused state (the comment at P_FRESH)."""
    L = I[O_END]
    base = I[P_FRESH] - 1
    stop = I[I[O_ST] + ST_STOP]
    for i in range(L):
        I[i] = I[L + i]
    I[P_TAGBASE] = base
    I[I[O_ST] + ST_STOP] = stop
    T, S = I[P_T], I[P_S]
    o = I[O_STEPS]
    for t in range(T):
        I[o + 4 * t + 3] = base + t
    null = I[P_NULL]
    for j in range(2 * T * S):
        H[j] = null


@njit(nogil=True, cache=True)
def advance(mode, deadline, I, H, work, src, res, tmp, div, X, stat):
    """See the module docstring (modes and return codes). ``res``: the output of
    an out-of-place reduce-scatter (P_RES_OFF; else ``work``). ``H``: the receive
    then the send request handles (T*S each); ``X`` (int32): Testsome's
    indices, then its count / Iprobe's flag in the last slot."""
    P = I[:P_LEN]
    if mode > BACKGROUND:  # a fresh call's tag base + 1 rides in the mode (FRESH_SHIFT)
        P[P_FRESH] = mode >> FRESH_SHIFT
        mode &= FRESH_SHIFT_MASK
    if P[P_FRESH] != 0:
        _reset(I, H)
    if peek(P[P_ABORT]) != 0:
        return ABORTED
    T, S, N = P[P_T], P[P_S], P[P_N]
    TS = T * S
    st = I[P[O_ST]:P[O_ST] + ST_LEN]
    steps = I[P[O_STEPS]:P[O_STEPS] + 4 * T].reshape((T, 4))
    off, size, nseg = I[P[O_OFF]:P[O_OFF] + N], I[P[O_SIZE]:P[O_SIZE] + N], \
        I[P[O_NSEG]:P[O_NSEG] + N]
    recv_st, send_st = I[P[O_RST]:P[O_RST] + TS], I[P[O_SST]:P[O_SST] + TS]
    copy_after = I[P[O_COPY]:P[O_COPY] + TS]
    rmeta, smeta = I[P[O_RMETA]:P[O_RMETA] + TS], I[P[O_SMETA]:P[O_SMETA] + TS]
    recv_next, send_next = I[P[O_RNEXT]:P[O_RNEXT] + T], I[P[O_SNEXT]:P[O_SNEXT] + T]
    rreq, sreq, hv = H[:TS], H[TS:2 * TS], H[2 * TS:]
    idx, outc = X[:TEST_WINDOW], X[TEST_WINDOW:]
    if st[ST_POLLS] == 0:  # the first call posts step 0's sends and the allowed receives
        st[ST_POLLS] = 1
        if T > 0:
            _post_sends(0, P, hv, steps, off, size, nseg, work, src, st, send_st, send_next,
                        sreq, smeta)
        _post_recvs(P, hv, steps, off, size, nseg, work, tmp, st, recv_st, recv_next, rreq,
                    rmeta)
        if st[ST_ERR] != 0:
            return FAILED
    idle = 0
    sleep_us = 1
    any_moved = False
    while True:
        moved = True
        while moved:
            moved = _pass(P, hv, steps, off, size, nseg, work, src, res, tmp, div, st, recv_st,
                          send_st, recv_next, send_next, copy_after, rreq, rmeta, sreq,
                          smeta, idx, outc, stat)
            if st[ST_ERR] != 0:
                return FAILED
            any_moved |= moved
        if st[ST_LEFT_RECV] == 0 and st[ST_LEFT_SEND] == 0:
            return DONE
        if mode == ONCE:
            return PROGRESS if any_moved else IDLE
        if mode == BACKGROUND:
            if st[ST_STOP] != 0:
                return PROGRESS
            if any_moved:
                sleep_us = 1
                any_moved = False
            else:
                if _now(P, st) > deadline:
                    return TIMEOUT
                if peek(P[P_ABORT]) != 0:
                    return ABORTED
                ccall(P[F_USLEEP], (np.uint32(sleep_us),))
                sleep_us = min(sleep_us * 2, P[P_BACKOFF])
            continue
        idle += 1
        if idle > SPIN_POLLS and idle % 64 == 0:
            ccall(P[F_YIELD], ())
        if idle & 63 == 0:
            if _now(P, st) > deadline:
                return TIMEOUT
            if peek(P[P_ABORT]) != 0:
                return ABORTED
            if idle > SPIN_POLLS:
                ccall(P[F_IPROBE], (np.int32(P[P_ANY]), np.int32(P[P_STATUS_TAG]), hv[H_CTRL],
                                    outc.ctypes.data, stat.ctypes.data))
                if outc[0] != 0:
                    return PEER

@njit(nogil=True, cache=True)
def _now(P, st):
    """CLOCK_MONOTONIC in seconds (time.monotonic's clock)."""
    ts = st[ST_TS:ST_TS + 2]
    ccall(P[F_CLOCK], (np.int32(CLOCK_MONOTONIC), ts.ctypes.data))
    return ts[0] + ts[1] * 1e-9


@njit(nogil=True, cache=True)
def sleep_us(usleep_address, us):
    """A nogil sleep (tests and benches: compute that holds no GIL and never polls)."""
    ccall(usleep_address, (np.uint32(us),))

