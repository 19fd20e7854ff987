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
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.errors import CollectiveTimeout

DEFAULT_TIMEOUT_S = 300.0
_KEYVAL = None
_LAST: dict = {}  # id(comm object) -> (comm object, context): skips Get_attr per call
# the same dict, read (never written) by hpcdp.comm.fast's ready calls: known_context inline
KNOWN = _LAST


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def default_timeout() -> float:
    """``HPCDP_COMM_TIMEOUT`` seconds, else 300."""
    raw = os.environ.get("HPCDP_COMM_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"HPCDP_COMM_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"HPCDP_COMM_TIMEOUT must be > 0 seconds, got {raw!r}")
    return value


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
        self.lean_bounds: dict = {}  # (collective, algorithm) -> bytes bound of hpcdp.comm.fast
        # hpcdp.comm.fast.signature: (collective, op, algorithm, dtype) -> the lean decision,
        # valid for hpcdp.comm.auto.generation() == lean_gen
        self.lean_sigs: dict = {}
        self.lean_gen = -1
        # hpcdp.comm.fast's ready compiled calls: (allreduce, reduce-scatter, all-gather),
        # each length -> its LeanCall (the last signature seen at that length)
        self.lean_calls: tuple = ({}, {}, {})
        # hpcdp.comm.engines.compiled.lean: "compiled" or "mpi4py" (None: HPCDP_COMM_LEAN when needed)
        self.lean_path: str | None = None
        self.debug = _truthy(os.environ.get("HPCDP_DEBUG"))
        self.timeout = default_timeout()
        self.cuda_aware = None  # decided lazily by hpcdp.comm.engines.device
        # hpcdp.comm.engines.compiled: the engine asked for (None: HPCDP_COMM_ENGINE when first
        # needed) and the compiled ring's plans (shape key -> Plan, with reusable states)
        self.engine: str | None = None
        self.compiled_plans: dict = {}
        # hpcdp.comm.engines.compiled.blocking: a blocking ring call's signature -> its ready plan
        self.blocking_plans: dict = {}

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


def set_debug(comm, enabled: bool = True) -> None:
    """Turn the fingerprint check on or off for ``comm`` (default: ``HPCDP_DEBUG``)."""
    get_context(comm).debug = bool(enabled)


def set_timeout(comm, seconds: float) -> None:
    """Default timeout of collectives on ``comm`` (default: ``HPCDP_COMM_TIMEOUT``)."""
    if seconds <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {seconds}")
    get_context(comm).timeout = float(seconds)
