"""The progress thread: non-blocking compiled collectives advance while the
training thread computes, without anyone polling them.

One daemon thread per process (started on the first non-blocking compiled
collective). It takes requests oldest first (every rank issues collectives in the
same order, so neighbours work on the same one) and advances each inside compiled
code that holds no GIL (hpcdp.comm.engines.compiled.kernels, mode BACKGROUND): when a pass
finds nothing to do it sleeps (``usleep``, doubling from 1 us to
hpcdp.comm.engines.compiled.request.BACKOFF_US), so on a machine without a spare core it
takes a few percent of one, never a busy-polled core. The thread's timer slack is
set to 1 us (``prctl(PR_SET_TIMERSLACK)``, Linux) so those short sleeps are short.

The launching thread hands a request over without waking anyone: it appends it to
the queue and bumps a counter in a numpy array (``submit``); the idle thread waits
for that counter in compiled code without the GIL (:func:`idle_wait`, sleeping 1 us
doubling to IDLE_MAX_US), and only after IDLE_LIMIT_US with nothing queued blocks on
a condition variable, which ``submit`` then notifies. (Notifying a sleeping thread
from every launch cost the training thread its core on a machine without a spare
one: the woken thread preempts the waker; docs/results.md.) A warm plan's first
pass (its first posts) is the thread's too, so a launch makes no MPI call and no
GIL-releasing call on the training thread (hpcdp.comm.engines.compiled.request).

The thread never raises: a request whose deadline passes (or that a waiting thread
takes over, see CompiledRingRequest.wait) is left to the thread that waits on it,
which runs the timeout diagnosis or completes it. MPI is initialised with
MPI_THREAD_MULTIPLE (mpi4py's default); with a lower thread level the engine keeps
requests on the calling thread (hpcdp.comm.engines.compiled.engine), and so does
``HPCDP_COMM_PROGRESS=calls`` (:func:`progress_mode`): then the caller's ``test()``
calls progress them. The default, ``auto``, runs the thread only where this rank
has a core to spare for it (:func:`choose_progress`: its affinity mask against the
job's ranks on its node), else ``calls``; the choice is logged once.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
import time

import numpy as np
from numba import njit

from hpcdp.comm.engines.compiled import kernels as K
from hpcdp.comm.engines.compiled.ccall import ccall

PR_SET_TIMERSLACK = 29
IDLE_MAX_US = 1000      # the idle thread's longest sleep between looks at the queue
IDLE_LIMIT_US = 200_000  # idle this long: block on the condition (submit then wakes it)


def _short_timer_slack() -> None:
    try:
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the default slack, longer sleeps
        pass


@njit(nogil=True, cache=True)
def idle_wait(posted, seen, usleep, max_us, limit_us):
    """Sleep (``usleep``, doubling from 1 us to ``max_us``) until ``posted[0]`` is no
    longer ``seen`` (a request was queued: the new count) or ``limit_us`` passed (-1).
    No GIL: the launching thread only writes the counter, it wakes nobody."""
    slept, us = 0, 1
    while posted[0] == seen:
        if slept >= limit_us:
            return -1
        ccall(usleep, (np.uint32(us),))
        slept += us
        us = min(2 * us, max_us)
    return posted[0]


PROGRESS_MODES = ("auto", "thread", "calls")
# launchers' variables for the number of this job's ranks on this node: MPICH's Hydra,
# Open MPI, PMIx, Slurm (srun: "2" or "2(x3),1" per node)
LOCAL_RANKS_ENV = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE",
                   "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE")
log = logging.getLogger("hpcdp.comm")


def progress_mode() -> str:
    """``HPCDP_COMM_PROGRESS``: ``auto`` (default: :func:`choose_progress`), ``thread``
    (the progress thread advances non-blocking compiled collectives) or ``calls`` (no
    thread: they advance only in the caller's ``test()`` calls, one compiled pass each,
    at the points where the training loop polls: the grad-ready hooks between backward
    ops and ZeRO-3's unit hooks; the comparison of the two is in docs/results.md)."""
    from hpcdp.comm.core.settings import settings
    return settings().progress


def local_ranks(env=None, world_size: int = 1) -> tuple[int, str]:
    """(ranks of this job on this node, where that came from): the launcher's variable
    (LOCAL_RANKS_ENV), else every rank of the job (``world_size``: the cautious guess)."""
    env = os.environ if env is None else env
    for name in LOCAL_RANKS_ENV:
        raw = env.get(name, "").strip()
        head = raw.split(",")[0].split("(")[0]
        if head.isdigit() and int(head) >= 1:
            return int(head), name
    return max(1, int(world_size)), "the job's size (no launcher variable)"


def choose_progress(mask_cpus: int, node_cpus: int, ranks_on_node: int) -> str:
    """``auto``'s rule: ``thread`` when this rank has a core to spare for it, else
    ``calls``. The ranks whose CPUs overlap this rank's ``mask_cpus`` (its affinity
    mask) are ``ranks_on_node`` when the mask is the whole node (``node_cpus``), fewer
    when ranks are bound to their own CPUs (an even split assumed); a core is spare
    when the mask holds at least two CPUs for each of them (one computes, one
    progresses). A progress thread without a spare core takes its time slices from
    compute (docs/results.md, "Overlap: the progress thread against progress at the
    hooks")."""
    mask_cpus, node_cpus = max(1, mask_cpus), max(1, node_cpus, mask_cpus)
    sharing = max(1, -(-max(1, ranks_on_node) * mask_cpus // node_cpus))
    return "thread" if mask_cpus >= 2 * sharing else "calls"


def resolved_mode() -> tuple[str, str]:
    """(``thread`` or ``calls``, why): ``HPCDP_COMM_PROGRESS`` as set, ``auto`` decided
    by :func:`choose_progress` on this process's affinity mask and node."""
    mode = progress_mode()
    if mode != "auto":
        return mode, f"[comm] progress = {mode!r}"
    try:
        mask = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: all CPUs
        mask = os.cpu_count() or 1
    node = os.cpu_count() or mask
    try:
        from mpi4py import MPI
        size = MPI.COMM_WORLD.Get_size()
    except Exception:  # noqa: BLE001 - no MPI: one rank
        size = 1
    ranks, source = local_ranks(world_size=size)
    mode = choose_progress(mask, node, ranks)
    return mode, (f"auto: {mask} CPUs in this rank's affinity mask of {node} on the node, "
                  f"{ranks} ranks on the node ({source})")


class ProgressThread:
    """The per-process progress thread (module docstring). ``enabled`` is False
    when :func:`resolved_mode` says ``calls`` (logged once, at the engine's start)."""

    def __init__(self, usleep: int = 0):
        mode, why = resolved_mode()
        log.info("hpcdp.comm: compiled collectives progress by %s (%s)",
                 "the progress thread" if mode == "thread" else "the caller's test() calls", why)
        self.mode = mode
        self.enabled = mode == "thread"
        self.usleep = usleep  # libc's usleep (hpcdp.comm.engines.compiled.binding)
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._thread = None
        self._posted = np.zeros(1, dtype=np.int64)  # requests queued so far (idle_wait reads it)
        self._waiting = False  # blocked on the condition (only then does submit notify)
        self.passes = 0  # background calls made (benchmarks report it)
        if self.enabled:  # compiled (or loaded from the cache) now, not inside a deadline
            idle_wait(self._posted, -1, self.usleep, 1, 0)

    def submit(self, req) -> None:
        with self._cond:
            self._queue.append(req)
            self._posted[0] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hpcdp-progress",
                                                daemon=True)
                self._thread.start()
            if self._waiting:  # only a thread blocked on the condition needs a wake-up
                self._cond.notify()

    def _idle(self, seen: int) -> None:
        """Nothing queued: wait in compiled code for the counter to move, then (idle
        for IDLE_LIMIT_US) on the condition."""
        if idle_wait(self._posted, seen, self.usleep, IDLE_MAX_US, IDLE_LIMIT_US) >= 0:
            return
        with self._cond:
            while not self._queue:
                self._waiting = True
                self._cond.wait()
                self._waiting = False

    def _run(self) -> None:
        _short_timer_slack()
        while True:
            with self._cond:
                req = self._queue[0] if self._queue else None
                seen = int(self._posted[0])
            if req is None:
                self._idle(seen)
                continue
            wanted = not req.done and int(req.st[K.ST_STOP]) == 0
            if wanted and not req.lock.acquire(False):
                time.sleep(20e-6)  # the training thread is in its test(): retry shortly
                continue
            if wanted:
                try:
                    if not req.done:
                        self.passes += 1
                        req.background_pass(req.started + req.timeout)
                except Exception:  # noqa: BLE001 - the waiting thread raises it again
                    pass
                finally:
                    req.lock.release()
            with self._cond:
                if self._queue and self._queue[0] is req:
                    self._queue.popleft()
            req = None  # hold no finished request (its buffers) while waiting for the next
