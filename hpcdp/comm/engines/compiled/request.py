"""CompiledRingRequest: hpcdp.comm.ring's RingRequest with its loop in compiled code.

Same constructor, same results, same ledger, same timeouts: ``wait()`` runs the
compiled passes in a nogil loop until done or the deadline (then the missing-rank
diagnosis, hpcdp.comm.core.diagnose, as for every request). A non-blocking request is
handed to the rank's progress thread (hpcdp.comm.engines.compiled.progress), which makes
its passes (from the first, for a warm plan) while the training thread computes;
``test()`` is then a read of the counters those passes write (no lock, no compiled
call, no GIL hand-off), and it finishes the request (the ledger) itself if
the thread has completed it but not yet got the GIL back. Without the thread
(``HPCDP_COMM_PROGRESS=calls``, or no MPI_THREAD_MULTIPLE) ``test()`` runs the
compiled passes once. A per-request lock makes exactly one thread advance it at a
time; ``wait()`` asks the progress thread to hand over (``ST_STOP``) and then
drives the request itself at full speed.

Plans (the chunk/segment layout and the dependency rules of hpcdp.comm.ring, the op
and the dtype) are built once per (length, segment, phases, in-place, dtype, op) and
cached on the communicator's context (``CommContext.compiled_plans``). A call takes a
reusable :class:`State` of its plan (its arrays, scratch and lock) and sets two
scalars; compiled code resets the state from the plan's template at the first pass,
and the state goes back to the plan when the request completes. A blocking call
makes no pass before ``wait()``, which then runs the whole collective in one
compiled call.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.engines.compiled import kernels as K
from hpcdp.comm.core.diagnose import peer_failed
from hpcdp.comm.core.errors import CommError, mpi_error
from hpcdp.comm.core.requests import Request
from hpcdp.comm.schedules.ring import ring_schedule

BACKOFF_US = 256  # the progress thread's longest sleep between fruitless passes
_MAX_PLANS = 256
_KEEP_STATES = 4  # states kept per plan (requests of one shape in flight at once)


class Plan:
    """The per-shape part of a compiled ring (see module docstring): the layout, the
    dependency rules, the op and the dtype, written once into a template; and a free
    list of :class:`State` objects that calls reuse."""

    def __init__(self, ctx, n, seg, phases, same, dtype, op, own_work, engine):
        N, r = ctx.size, ctx.rank
        itemsize = dtype.itemsize
        sch = ring_schedule(n, N, r, seg, tuple(phases), not same)  # the ring's one schedule
        off = np.array([o for o, _ in sch.bounds], dtype=np.int64)
        size = np.array([s for _, s in sch.bounds], dtype=np.int64)
        nseg = np.array(sch.nseg, dtype=np.int64)
        steps = list(sch.steps)
        T = len(steps)
        S = max(1, int(nseg.max()) if N else 1)
        self.T, self.S = T, S
        self.mc = sch.mc
        self.has_rs = "rs" in phases and N > 1 and self.mc > 0
        self.n, self.dtype, self.own_work = n, dtype, own_work
        self.N = N
        self.step_space, self.seq_mod = ctx.step_space, ctx.seq_mod
        sec = {}
        pos = K.P_LEN
        for name, length in (("st", K.ST_LEN), ("steps", 4 * T), ("off", N), ("size", N),
                             ("nseg", N), ("rst", T * S), ("sst", T * S), ("copy", T * S),
                             ("rmeta", T * S), ("smeta", T * S), ("rnext", T), ("snext", T)):
            sec[name] = (pos, pos + length)
            pos += length
        I = np.zeros(pos, dtype=np.int64)
        P = I[:K.P_LEN]
        b = engine.binding
        P[[K.P_N, K.P_T, K.P_S, K.P_SEG, K.P_ITEM, K.P_LEFT, K.P_RIGHT, K.P_MC]] = \
            (N, T, S, seg, itemsize, (r - 1) % N, (r + 1) % N, self.mc)
        P[K.P_LAST_RS] = sch.last_rs
        P[[K.F_ISEND, K.F_IRECV, K.F_TESTSOME, K.F_IPROBE, K.F_CLOCK, K.F_USLEEP, K.F_YIELD]] = (
            b.isend, b.irecv, b.testsome, b.iprobe, b.clock_gettime, b.usleep, b.sched_yield)
        self.handle_values = [b.handle(ctx.data), b.handle(ctx.ctrl), b.handle(MPI.BYTE)]
        P[K.P_STATUS_TAG], P[K.P_HSIZE], P[K.P_ANY] = ctx.status_tag, b.handle_size, b.any_source
        P[K.P_BACKOFF] = BACKOFF_US
        P[K.P_NULL] = b.request_null
        P[K.P_RES_OFF] = int(off[r]) if own_work and self.has_rs else -1
        P[K.P_ABORT] = ctx.abort_flag.ctypes.data  # (the array lives as long as the context)
        if op is not None:
            P[K.P_OP] = engine.op_code(op)
            P[K.P_MEAN] = int(op.is_mean)
        P[K.P_INT] = int(dtype.kind in "iu")
        P[K.P_HALF] = int(dtype == np.float16)
        for key, slot in (("st", K.O_ST), ("steps", K.O_STEPS), ("off", K.O_OFF),
                          ("size", K.O_SIZE), ("nseg", K.O_NSEG), ("rst", K.O_RST),
                          ("sst", K.O_SST), ("copy", K.O_COPY), ("rmeta", K.O_RMETA),
                          ("smeta", K.O_SMETA), ("rnext", K.O_RNEXT), ("snext", K.O_SNEXT)):
            P[slot] = sec[key][0]
        P[K.O_END] = pos

        def view(key):
            a, z = sec[key]
            return I[a:z]

        st = view("st")
        if T:
            sa = view("steps").reshape(T, 4)
            sa[:, :3] = steps
        view("off")[:], view("size")[:], view("nseg")[:] = off, size, nseg
        rst, sst, copy = view("rst"), view("sst"), view("copy")
        copy[:] = -1
        if T:
            sst[:nseg[steps[0][0]]] = 1
        for t, k in sch.open_recvs:
            rst[t * S + k] = 1
        for (ts, k), t in sch.copy_after:
            copy[ts * S + k] = t
        st[K.ST_LEFT_RECV], st[K.ST_LEFT_SEND] = sch.left_recv, sch.left_send
        self.template = I
        self.st_slice = slice(sec["st"][0], sec["st"][1])
        self.handles = 2 * T * S
        self.handle_dtype = b.handle_dtype
        self.status_bytes = K.TEST_WINDOW * b.status_size
        self.warm = False  # a call ran: compiled code exists for this dtype (request.__init__)
        self.free: list = []  # States between calls (taken by callers, given back on completion)

    def take(self) -> State:
        """A state for one call: a reused one (reset by compiled code at its first
        pass, kernels.P_FRESH) or a new one."""
        try:
            state = self.free.pop()
        except IndexError:
            state = State(self)
        return state

    def give(self, state: State) -> None:
        if len(self.free) < _KEEP_STATES:
            self.free.append(state)


class State:
    """One call's live arrays, kept for the next call with the same plan: ``I`` (live
    part + the plan's template, kernels.P_FRESH), the request handles ``H``, the
    Testsome/Iprobe outputs ``X`` and ``stat``, the reduce scratch ``tmp`` (two chunk
    slots), the mean's divisor ``div``, the out-of-place reduce-scatter's working
    buffer and the lock that lets one thread at a time advance it."""

    __slots__ = ("I", "H", "X", "stat", "tmp", "div", "work", "st", "lock", "P")

    def __init__(self, plan: Plan):
        L = plan.template.size
        self.I = np.concatenate([plan.template, plan.template])
        self.P = self.I[:K.P_LEN]
        self.H = np.empty(plan.handles + 3, dtype=plan.handle_dtype)
        self.H[plan.handles:] = plan.handle_values  # K.H_COMM, K.H_CTRL, K.H_BYTE
        self.X = np.zeros(K.TEST_WINDOW + 1, dtype=np.int32)
        self.stat = np.zeros(plan.status_bytes, dtype=np.uint8)
        dt = plan.dtype
        self.tmp = np.empty(2 * plan.mc if plan.has_rs else 0, dtype=dt)
        self.div = np.full(1, plan.N, dtype=dt)
        self.work = np.empty(plan.n, dtype=dt) if plan.own_work else None
        if dt == np.float16:  # computed on the bits (hpcdp.comm.engines.compiled.kernels)
            self.tmp, self.div = self.tmp.view(np.uint16), self.div.view(np.uint16)
        self.st = self.I[plan.st_slice]
        self.lock = threading.Lock()
        assert self.I.size == 2 * L


def plan_for(ctx, engine, n, seg, phases, same, dtype, op, own_work) -> Plan:
    """The cached plan of one (communicator, size, segment, phases, dtype, op) shape."""
    cache = ctx.compiled_plans
    key = (n, seg, phases, same, dtype.char, None if op is None else op.name, own_work)
    plan = cache.get(key)
    if plan is None:
        if len(cache) >= _MAX_PLANS:
            cache.clear()
        plan = cache[key] = Plan(ctx, n, seg, phases, same, dtype, op, own_work, engine)
    return plan


class CompiledRingRequest(Request):
    """A ring collective advanced by compiled code (module docstring). Takes
    hpcdp.comm.ring.RingRequest's arguments plus the engine."""

    def __init__(self, ctx, name, call, ledger, timeout, *, work, src, op, phases, engine,
                 segment_bytes, max_message_bytes=None, result=None, final_out=None,
                 background=True, defer=False):
        super().__init__(ctx, name, call, ledger, timeout, max_message_bytes)
        self.engine = engine
        dtype = src.dtype
        seg_bytes = self.max_bytes if segment_bytes is None else min(int(segment_bytes),
                                                                    self.max_bytes)
        if seg_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1 (or None for whole chunks), got "
                             f"{segment_bytes}")
        seg = max(1, seg_bytes // dtype.itemsize)
        own_work = work is None  # out-of-place reduce-scatter: chunks pass through the state's buffer
        plan = plan_for(ctx, engine, src.size, seg, phases, src is work, dtype, op, own_work)
        self.plan = plan
        self.state = state = plan.take()
        if own_work:
            work = state.work
        self.work, self.src, self.result = work, src, result
        res = work if final_out is None else final_out[0]  # kernels.P_RES_OFF
        if dtype == np.float16:
            self.views = (work.view(np.uint16), src.view(np.uint16), res.view(np.uint16))
        else:
            self.views = (work, src, res)
        # the tag base + 1: the next pass resets the state (kernels.P_FRESH)
        state.P[K.P_FRESH] = (self.seq % plan.seq_mod) * plan.step_space + 1
        self.st = state.st
        self.st[K.ST_STOP] = 0  # a wait() on the state's previous call left it set
        self.lock = state.lock
        self.left = (ctx.rank - 1) % ctx.size
        if defer and plan.warm:  # a blocking call: wait() makes the first pass (one compiled call)
            return
        background = background and engine.progress.enabled
        if background and plan.warm:
            # The progress thread makes the first pass too (its posts included): the
            # launching thread makes no MPI call and no GIL-releasing call, so it
            # hands nothing over. Until that pass resets the state, its counters
            # are the previous call's (zero): mark it not done for test()'s read.
            self.st[K.ST_LEFT_RECV] = 1
            self.progresses_alone = True
            engine.progress.submit(self)
            return
        code = self._advance(K.ONCE, 0.0)  # the plan's first call compiles (outside any deadline)
        plan.warm = True
        if code == K.DONE:
            self._finish()
        elif background:
            self.progresses_alone = True
            engine.progress.submit(self)

    # -- the compiled calls ----------------------------------------------------
    def _advance(self, mode, deadline):
        s = self.state
        work, src, res = self.views
        code = self.engine.advance(mode, deadline, s.I, s.H, work, src, res, s.tmp, s.div, s.X,
                                   s.stat)
        if code == K.FAILED:
            self._failed()
        if code == K.ABORTED:
            raise self.ctx.failed
        return code

    def _failed(self):
        raise failure(self.ctx, self.name, self.seq, self.st)

    def _finish(self):
        """Complete once: the counts and the ledger (hpcdp.comm.core.requests.Request)."""
        if self.done:
            return
        st = self.st
        self.sent_bytes, self.recv_bytes = int(st[K.ST_SENT_B]), int(st[K.ST_RECV_B])
        self.sent_msgs, self.recv_msgs = int(st[K.ST_SENT_M]), int(st[K.ST_RECV_M])
        self._complete()
        self.plan.give(self.state)

    def background_pass(self, deadline) -> int:
        """The progress thread's turn (holding the lock): advance until done, the
        deadline, or a waiting thread asks for the request."""
        code = self._advance(K.BACKGROUND, deadline)
        if code == K.DONE:
            self._finish()
        return code

    # -- the request interface -------------------------------------------------
    def test(self) -> bool:
        if self.done:
            return True
        if self.ctx.failed is not None:
            raise self.ctx.failed
        drive = not self.progresses_alone
        if not drive:
            # The progress thread advances it: a test is a read of the counters its
            # compiled passes write (aligned int64 stores), no lock and no compiled
            # call (each would release and retake the GIL, a hand-off to the progress
            # thread on a machine without a spare core). Completed but not finished
            # yet (the progress thread waits for the GIL to run _finish): finish here
            # if it has let go of the lock. Past the deadline the thread has given the
            # request up: then test() makes the passes itself, as without the thread.
            st = self.st
            if st[K.ST_LEFT_RECV] == 0 and st[K.ST_LEFT_SEND] == 0 and \
                    self.lock.acquire(False):
                try:
                    self._finish()
                finally:
                    self.lock.release()
                return True
            drive = time.monotonic() > self.started + self.timeout
        if drive and self.lock.acquire(False):
            try:
                if not self.done and self._advance(K.ONCE, 0.0) == K.DONE:
                    self._finish()
            finally:
                self.lock.release()
            if self.done:
                return True
        self._polls += 1
        if self._polls & 1023 == 0 and peer_failed(self.ctx):
            raise self._timeout(self.timeout, joined=True)
        return False

    def wait(self, timeout: float | None = None):
        if self.done:
            return self.result
        if self.ctx.failed is not None:
            raise self.ctx.failed
        limit = self.timeout if timeout is None else float(timeout)
        self.st[K.ST_STOP] = 1  # the progress thread hands over within one sleep
        with self.lock:
            if not self.done:
                code = self._advance(K.BLOCK, time.monotonic() + limit)
                if code == K.DONE:
                    self._finish()
                elif code == K.PEER:
                    raise self._timeout(limit, joined=True)
                else:
                    raise self._timeout(limit)
        return self.result

    def _timeout(self, limit, joined=False):
        return timed_out(self.ctx, self.call, self.started, limit, self.st, joined)


def failure(ctx, name, seq, st) -> CommError:
    """The error of an MPI call that failed inside compiled code (``st[ST_ERR]``): an
    MPIError with MPI's error class; the communicator is marked failed with it."""
    err = mpi_error(int(st[K.ST_ERR]), collective=name, seq=seq, rank=ctx.rank)
    if ctx.failed is None:
        ctx.failed = err
    return err


def timed_out(ctx, call, started, limit, st, joined=False):
    """The missing-rank diagnosis' error for a compiled ring past its deadline (or
    joining a peer's diagnosis): this rank still waits on its left neighbour when a
    receive is open or owed."""
    from hpcdp.comm.core.diagnose import diagnose

    waiting = {(ctx.rank - 1) % ctx.size} if int(st[K.ST_OPEN_R]) > 0 \
        or int(st[K.ST_LEFT_RECV]) else set()
    return diagnose(ctx, call, time.monotonic() - started, limit, waiting, joined=joined)
