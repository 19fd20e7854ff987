"""Per-communicator state of hpcdp.comm: duplicated communicators, sequence
numbers, tags, reusable buffers and settings.

The state is cached on the user's communicator as an MPI attribute (the MPI way to
hang library state on a communicator, no module-level communicator). It holds two
``Idup`` copies of the user's communicator: ``data`` carries payload, ``ctrl``
carries debug fingerprints and, once a deadline has passed, the missing-rank
diagnosis (hpcdp.comm.core.diagnose), so neither ever matches the other or the user's
own messages.

Every collective call takes the next sequence number; all ranks call collectives
on a communicator in the same order (MPI's rule), so sequence numbers agree and
give each in-flight request its own tag range (several non-blocking requests may
be in flight at once without their messages mixing).

Setup is itself guarded: before the ``Idup``s each rank sends a small token to
every peer on the user's communicator with the reserved tag ``TAG_UB`` (so a user
receive with ``MPI.ANY_TAG`` on that communicator could steal it: do not post one
while hpcdp sets up). If setup times out, the missing tokens name the ranks that
never entered their first collective.

Failure (hpcdp.comm's hooks for a job that survives a rank): the two duplicates use
``MPI.ERRORS_RETURN`` (an MPI error comes back as hpcdp.comm.core.errors.MPIError, never
an abort); :func:`abort` marks a context failed (every wait loop, the compiled
engine's included, reads ``abort_flag``) and :func:`forget` drops a context and all it
derived (sub-communicators of the topology, the two-level requests' channels).
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core import settings as _settings
from hpcdp.comm.core.errors import CollectiveTimeout, CommAborted

DEFAULT_TIMEOUT_S = 300.0
_KEYVAL = None
_LAST: dict = {}  # id(comm object) -> (comm object, context): skips Get_attr per call
# the same dict, read (never written) by the ready calls (hpcdp.comm.engines.compiled.lean): known_context inline
KNOWN = _LAST


def default_timeout() -> float:
    """``[comm] timeout`` (``HPCDP_COMM_TIMEOUT`` overrides it), else 300 seconds."""
    return _settings.settings().timeout


def as_comm(comm):
    """Accept an mpi4py communicator or anything with a ``.comm`` (a World)."""
    if comm is None:
        raise TypeError("hpcdp.comm: pass the communicator as comm= (an mpi4py Comm or a World)")
    if isinstance(comm, MPI.Comm):
        return comm
    inner = getattr(comm, "comm", None)
    if isinstance(inner, MPI.Comm):
        return inner
    raise TypeError(f"hpcdp.comm: comm= must be an mpi4py Comm or a World, got {type(comm).__name__}")


class BufferPool:
    """Reusable scratch buffers (bytes), so repeated collectives do not map fresh
    memory each call (page faults cost as much as the copy itself)."""

    def __init__(self, keep: int = 8):
        self._free: list[np.ndarray] = []
        self._keep = keep

    def get(self, nbytes: int) -> np.ndarray:
        best = None
        for i, buf in enumerate(self._free):
            if buf.nbytes >= nbytes and (best is None or buf.nbytes < self._free[best].nbytes):
                best = i
        if best is not None:
            return self._free.pop(best)
        return np.empty(max(nbytes, 1), dtype=np.uint8)

    def put(self, buf: np.ndarray) -> None:
        self._free.append(buf)
        if len(self._free) > self._keep:  # drop the smallest
            self._free.sort(key=lambda b: b.nbytes)
            self._free.pop(0)


class CommContext:
    """hpcdp's state for one user communicator (see module docstring)."""

    def __init__(self, parent, data, ctrl):
        self.parent, self.data, self.ctrl = parent, data, ctrl
        self.rank, self.size = parent.Get_rank(), parent.Get_size()
        self.seq = 0
        tag_ub = tag_upper_bound(data)
        # tag = (seq mod seq_mod) * step_space + step; step < step_space
        self.step_space = 1 << max(4, (4 * self.size).bit_length())
        self.seq_mod = max(1, (tag_ub - 1) // self.step_space)
        # ctrl tags: debug fingerprints use 0 .. tag_ub-3, the diagnosis the top two
        self.ctrl_tag_mod = tag_ub - 2
        self.status_tag, self.view_tag = tag_ub, tag_ub - 1
        self.failed = None  # the CollectiveTimeout a diagnosis ended with: the comm is unusable
        self.pool = BufferPool()
        self.shard_cache: dict = {}  # n -> counts/displacements for MPI's v-collectives
        self.ctrl_reqs: list = []    # control requests in flight (their buffers stay alive)
        # hpcdp.comm.select: the chooser's decisions (call signature -> Plan, ("lean",
        # collective, algorithm) -> the small-message bound, ("sig", ...) -> hpcdp.comm.select.lean_signature's
        # MPI datatype and op), valid while hpcdp.comm.core.settings.generation() == plans_gen
        self.plans: dict = {}
        self.plans_gen = -1
        # hpcdp.comm.engines.ready: a repeated blocking call's ready calls, (allreduce,
        # reduce-scatter, all-gather), each algorithm named -> length -> its entry (the last
        # signature seen there)
        self.ready_calls: tuple = ({}, {}, {})
        # set_lean_path's "compiled" or "mpi4py" (None: [comm] lean when the chooser needs it,
        # hpcdp.comm.select.lean_tier)
        self.lean_path: str | None = None
        conf = _settings.settings()
        self.debug = conf.debug
        self.timeout = conf.timeout
        self.cuda_aware = None  # decided lazily by hpcdp.comm.core.device
        # hpcdp.comm.engines.compiled: the engine asked for (None: HPCDP_COMM_ENGINE when first
        # needed) and the compiled ring's plans (shape key -> Plan, with reusable states)
        self.engine: str | None = None
        self.compiled_plans: dict = {}
        # abort(): nonzero once this communicator is aborted (the compiled engine's loops
        # read it through its address); the contexts of communicators derived from this
        # one (topology, two-level channels), aborted and forgotten with it
        self.abort_flag = np.zeros(1, dtype=np.int64)
        self.derived: list = []
        self.topology = None  # hpcdp.comm.nodes: built on first use
        self.extra: dict = {}  # per-communicator state of upper layers (two-level requests)

    def forget_ready(self) -> None:
        """Drop the ready calls (hpcdp.comm.engines.ready): the engine or the
        small-message tier they were made for changed."""
        self.ready_calls = ({}, {}, {})

    def arrive(self, name, dtype, n, root, algorithm, op, timeout):
        """Take the next sequence number; return the call tuple (the fingerprint, sent
        only by a diagnosis or the debug check). Nothing goes on the wire here unless
        debug mode is on. A failed communicator raises its error."""
        if self.failed is not None:
            raise self.failed
        call = (self.next_seq(), name, dtype, n, root, algorithm, op)
        if self.debug:
            from hpcdp.comm.core.debug import debug_check
            debug_check(self, call, self.timeout if timeout is None else timeout)
        return call

    def derive(self, sub) -> "CommContext":
        """The context of a communicator hpcdp made from this one (set up now, collective
        on ``sub``), kept so :func:`abort` and :func:`forget` reach it."""
        ctx = get_context(sub)
        if ctx not in self.derived:
            self.derived.append(ctx)
        return ctx

    def keep(self, reqs) -> None:
        """Hold control requests (and so their buffers) until they complete."""
        if self.ctrl_reqs:
            self.ctrl_reqs = [q for q in self.ctrl_reqs if not q.Test()]
        self.ctrl_reqs.extend(reqs)

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def tag(self, seq: int, step: int) -> int:
        if not 0 <= step < self.step_space:
            raise ValueError(f"internal: step {step} outside tag space {self.step_space}")
        return (seq % self.seq_mod) * self.step_space + step

    def ctrl_tag(self, seq: int) -> int:
        return seq % self.ctrl_tag_mod


def tag_upper_bound(comm) -> int:
    """MPI_TAG_UB. Open MPI attaches it to COMM_WORLD and its duplicates but not to
    communicators made by ``Split`` (mpi4py then returns None): the bound is the
    same for every communicator, so take COMM_WORLD's."""
    value = comm.Get_attr(MPI.TAG_UB)
    if value is None:
        value = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return int(value)


def _setup(comm, timeout: float) -> CommContext:
    rank, size = comm.Get_rank(), comm.Get_size()
    tag = tag_upper_bound(comm)
    peers = [p for p in range(size) if p != rank]
    token_out = np.zeros(1, dtype=np.uint8)
    tokens_in = np.zeros(max(len(peers), 1), dtype=np.uint8)
    reqs = [comm.Isend([token_out, MPI.BYTE], p, tag) for p in peers]
    recvs = [comm.Irecv([tokens_in[i:i + 1], MPI.BYTE], p, tag) for i, p in enumerate(peers)]
    data, r1 = comm.Idup()
    ctrl, r2 = comm.Idup()
    for c in (data, ctrl):  # errors come back (hpcdp.comm.core.errors.MPIError), never abort
        c.Set_errhandler(MPI.ERRORS_RETURN)
    pending = reqs + recvs + [r1, r2]
    deadline = time.monotonic() + timeout
    idle = 0
    while not MPI.Request.Testall(pending):
        if time.monotonic() > deadline:
            missing = [p for p, r in zip(peers, recvs) if not r.Test()]
            raise CollectiveTimeout(
                f"hpcdp.comm setup on rank {rank}: ranks {missing} never entered their first "
                f"hpcdp collective on this communicator (waited {timeout:g}s); "
                "every rank must call the same collectives in the same order",
                seq=-1, name="setup", missing=missing)
        idle += 1
        if idle % 64 == 0:
            os.sched_yield()
    return CommContext(comm, data, ctrl)


def known_context(comm) -> CommContext | None:
    """``comm``'s context if a collective already set it up (the fast fronts' look-up,
    hpcdp.comm.fast and hpcdp.comm.engines.compiled.blocking), else None: no MPI call."""
    hit = _LAST.get(id(comm))
    return hit[1] if hit is not None and hit[0] is comm else None


def get_context(comm, timeout: float | None = None) -> CommContext:
    """hpcdp's state for ``comm``, created (collectively) on first use.

    Call it once right after creating a communicator to take the setup out of
    the first timed collective; otherwise the first collective does it.
    """
    hit = _LAST.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]  # the hot path: about 0.1 us instead of 1.8 us for the attribute
    global _KEYVAL
    given = comm
    comm = as_comm(comm)
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = _setup(comm, default_timeout() if timeout is None else timeout)
        comm.Set_attr(_KEYVAL, ctx)
    if len(_LAST) > 64:
        _LAST.clear()
    _LAST[id(given)] = (given, ctx)  # holds the object: its id cannot be reused meanwhile
    return ctx


def abort(comm, reason: str, *, revoke: bool = False) -> None:
    """Give up on ``comm`` on this rank: every collective on it (and on the communicators
    hpcdp derived from it), in flight or later, raises :class:`CommAborted` promptly.
    Local (sends nothing); callable from any thread. ``revoke``: also ``MPI_Comm_revoke``
    hpcdp's duplicates where this MPI has ULFM, so peers blocked in hpcdp collectives on
    them fail too. On a communicator hpcdp never set up there is nothing to abort."""
    ctx = get_context_if_any(comm)
    if ctx is None:
        return
    err = CommAborted(reason, rank=ctx.rank)
    for c in _family(ctx):
        if c.failed is None or not isinstance(c.failed, CommAborted):
            c.failed = err
        c.abort_flag[0] = 1
        if revoke:
            for dup in (c.data, c.ctrl):
                fn = getattr(dup, "Revoke", None)
                if fn is not None:
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - no ULFM here: the local abort stands
                        pass


def forget(comm, *, free: bool = True) -> None:
    """Drop everything hpcdp derived from ``comm``: its context (sequence numbers, pools,
    cached decisions, compiled plans and ready calls), its topology and the communicators
    derived from it. ``free``: also ``MPI_Comm_free`` hpcdp's duplicates and derived
    communicators (pass False after a failure where freeing might block). The next
    collective on ``comm`` sets up afresh (collectively)."""
    ctx = get_context_if_any(comm)
    if ctx is None:
        return
    base = as_comm(comm)
    if _KEYVAL is not None:
        try:
            base.Delete_attr(_KEYVAL)
        except Exception:  # noqa: BLE001 - a freed or broken communicator: nothing to delete
            pass
    family = _family(ctx)
    for key, (obj, c) in list(_LAST.items()):
        if c in family:
            del _LAST[key]
    for c in family:
        c.abort_flag[0] = 1  # anything still running on a dropped plan stops
        if c.failed is None:
            c.failed = CommAborted("hpcdp.comm.forget dropped this communicator's state",
                                   rank=c.rank)
        if free:
            subs = [c.data, c.ctrl] + ([c.parent] if c is not ctx else [])
            for sub in subs:
                try:
                    sub.Free()
                except Exception:  # noqa: BLE001 - already freed or unusable: dropped anyway
                    pass
        c.derived, c.topology, c.extra = [], None, {}
        c.compiled_plans, c.plans = {}, {}
        c.forget_ready()


def _family(ctx) -> list:
    """``ctx`` and every context derived from it, depth first."""
    out, todo = [], [ctx]
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.derived)
    return out


def get_context_if_any(comm) -> CommContext | None:
    """``comm``'s context if hpcdp set one up (no MPI call, nothing created)."""
    hit = _LAST.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]
    if _KEYVAL is None:
        return None
    try:
        return as_comm(comm).Get_attr(_KEYVAL)
    except Exception:  # noqa: BLE001 - a freed communicator
        return None


def set_debug(comm, enabled: bool = True) -> None:
    """Turn the fingerprint check on or off for ``comm`` (default: ``HPCDP_DEBUG``)."""
    get_context(comm).debug = bool(enabled)


def set_timeout(comm, seconds: float) -> None:
    """Default timeout of collectives on ``comm`` (default: ``HPCDP_COMM_TIMEOUT``)."""
    if seconds <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {seconds}")
    get_context(comm).timeout = float(seconds)
