"""Ranks agree on an outcome, so that nobody hangs: the one agreement of hpcdp.

Each step that may fail on one rank (a setup stage: config, data and model, strategy
setup, run directory; a phase of a checkpoint save or restore) ends with
:meth:`Agreement.agree`: every rank contributes one small row ``[failed, fingerprint
hash, shares]`` to a deadline-bounded hpcdp.comm all-gather. If a rank failed, or the
fingerprints differ (config skew), the texts behind them are gathered too, and every
rank raises the same error. Cost on success: one all-gather of 24 bytes per rank;
the texts move only when something is wrong (or a root shares a text).

One mechanism, two wordings (an :class:`Agreement` holds which):

- setup (:data:`SETUP`, the module-level :func:`agree`, :func:`on_root`,
  :class:`stage`): a :class:`JobError` naming every failing rank and its cause
  (ranks with the same cause grouped), on a private duplicate of the communicator
  (:func:`job_comm`), so agreement traffic never meets the strategies' collectives;
- checkpoints (hpcdp.io.errors.AGREEMENT): a ``CheckpointError`` with the lowest
  failing rank's message, "... (reported by rank r)", on the communicator given
  (the checkpoint's own).

A rank that never arrives is named by the all-gather's timeout
(:class:`hpcdp.comm.CollectiveTimeout`): that is not an agreement, and the caller
ends the job (:mod:`hpcdp.failure.policy`). In a thread other than the main one (the
asynchronous save's), the waits poll with short sleeps instead of spinning, so an
agreement running there leaves the GIL to training.
"""

from __future__ import annotations

import hashlib
import json
import traceback

import numpy as np

from hpcdp.config_error import ConfigError

from .ranks import fmt_ranks

# Exceptions whose message says everything (no traceback needed to act on them).
USER_ERRORS = (ValueError, OSError, MemoryError)


class JobError(ConfigError):
    """A failure before training that every rank agreed on: raised on EVERY rank with
    the same message. ``failed`` maps each failing rank to its cause. (A ConfigError,
    so code that catches config errors catches setup failures of any rank.)"""

    def __init__(self, message: str, *, failed: dict | None = None):
        super().__init__(message)
        self.failed = dict(failed or {})


def cause(e: BaseException) -> str:
    """One line for an exception: the message of a user error, else ``Type: message``."""
    text = str(e) or type(e).__name__
    if isinstance(e, MemoryError):
        return f"out of memory (MemoryError{': ' + str(e) if str(e) else ''})"
    if isinstance(e, USER_ERRORS):
        return text
    return f"{type(e).__name__}: {text}"


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


# -- the private communicator ----------------------------------------------------

_KEYVAL = None


def job_comm(comm, timeout: float):
    """A duplicate of ``comm`` for agreements, made once (deadline-bounded ``Idup``)
    and cached on ``comm`` as an MPI attribute, like hpcdp.comm's own state."""
    global _KEYVAL
    from mpi4py import MPI

    from .deadline import idup

    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    dup = comm.Get_attr(_KEYVAL)
    if dup is None:
        dup = idup(comm, timeout, "the other ranks to start (setting up the job's agreement channel)")
        comm.Set_attr(_KEYVAL, dup)
    return dup


# -- the exchanges (hpcdp.comm's all-gather) --------------------------------------

def wait_gently(req, timeout: float) -> None:
    """Wait for a request of hpcdp.comm, bounded by ``timeout``. In the main thread it
    polls like any collective (lowest latency: nothing else runs then); in another
    thread (the asynchronous save's) it sleeps between polls, so the GIL stays with
    training."""
    import threading
    import time

    if threading.current_thread() is threading.main_thread():
        req.wait(timeout=timeout)
        return
    # Each poll takes the GIL from training (hpcdp.comm progresses in Python): back off
    # from 0.2 ms to 5 ms between polls, so a long wait costs training ~200 wake-ups a
    # second, not 5000 (a background save does not need sub-millisecond latency).
    deadline = time.monotonic() + timeout
    pause = 2e-4
    while not req.test():
        if time.monotonic() > deadline:
            req.wait(timeout=1e-3)  # raises CollectiveTimeout naming the missing ranks
        time.sleep(pause)
        pause = min(5e-3, pause * 1.5)


def allgather_slots(comm, table: np.ndarray, *, timeout: float = 300.0) -> np.ndarray:
    """In place: ``table`` (comm size, ...) holds this rank's row at its rank; afterwards
    every rank's. One all-gather (a contiguous table: rows of the same length)."""
    from hpcdp.comm import iall_gather

    if table.size and comm is not None and comm.Get_size() > 1:
        wait_gently(iall_gather(table.reshape(-1), comm=comm, timeout=timeout), timeout)
    return table


def allgather_rows(comm, rows, *, timeout: float = 300.0) -> list:
    """Every rank's ``rows`` (a (k, ...) array, k may differ by rank; the same dtype
    and trailing shape everywhere), as a list in rank order. Two all-gathers (counts,
    then the rows zero-padded to the longest): small tables only."""
    rows = np.asarray(rows)
    if comm is None or comm.Get_size() == 1:
        return [rows]
    size, rank = comm.Get_size(), comm.Get_rank()
    counts = np.zeros(size, dtype=np.int64)
    counts[rank] = rows.shape[0]
    allgather_slots(comm, counts, timeout=timeout)
    table = np.zeros((size, int(counts.max()), *rows.shape[1:]), dtype=rows.dtype)
    table[rank, :rows.shape[0]] = rows
    allgather_slots(comm, table, timeout=timeout)
    return [table[r, :counts[r]] for r in range(size)]


def allgather_text(comm, text: str, timeout: float) -> list[str]:
    """Every rank's ``text``, in rank order (lengths first, then padded UTF-8 bytes)."""
    rows = allgather_rows(comm, np.frombuffer(text.encode(), dtype=np.uint8), timeout=timeout)
    return [r.tobytes().decode(errors="replace") for r in rows]


# -- agreement -------------------------------------------------------------------

def grouped(causes: dict) -> str:
    """{rank: text} -> "rank 1: text; ranks 2-3: other" (ranks of equal text together);
    the text alone when every rank failed alike."""
    by_text: dict[str, list[int]] = {}
    for r, t in sorted(causes.items()):
        by_text.setdefault(t, []).append(r)
    return "; ".join(f"{fmt_ranks(rs)}: {t}" for t, rs in by_text.items())


class Agreement:
    """How one family of agreements raises: ``error`` (the exception type every rank
    raises), ``lowest`` (True: the lowest failing rank's message, "... (reported by
    rank r)"; False: every failing rank's cause, grouped), ``private`` (True: on a
    duplicate of the communicator, :func:`job_comm`; False: on the one given)."""

    def __init__(self, error: type = None, *, lowest: bool = False, private: bool = True):
        self.error = JobError if error is None else error
        self.lowest, self.private = lowest, private

    def _raise(self, message: str, failed: dict, cause_of):
        e = self.error(message)
        e.failed = dict(failed)
        raise e from cause_of if isinstance(cause_of, BaseException) else None

    def agree(self, comm, error, *, timeout: float, what: str = "", fingerprint: str | None = None,
              skew=None, share: str | None = None) -> list:
        """Collective: every rank reports ``error`` (None = ok; an exception or its
        text). Raises the same error on every rank if any rank failed or the
        ``fingerprint`` texts differ (``skew(texts) -> str`` words that case; else
        "``what`` differs across ranks: ..."). Returns every rank's ``share`` text (rank
        order; None where a rank shared nothing) when any rank shared one, else []."""
        size = 1 if comm is None else comm.Get_size()
        text = None if error is None else (error if isinstance(error, str) else cause(error))
        fp = fingerprint or ""
        if size == 1:
            if text is not None:
                self._raise(text, {0: text}, error)
            return [share] if share is not None else []
        ch = job_comm(comm, timeout) if self.private else comm
        rows = np.zeros((size, 3), dtype=np.int64)  # one row per rank: one all-gather
        rows[comm.Get_rank()] = [int(text is not None), _digest(fp), int(share is not None)]
        allgather_slots(ch, rows, timeout=timeout)
        failed = [r for r in range(size) if rows[r, 0]]
        skewed = len(set(rows[:, 1].tolist())) > 1
        if not failed and not skewed and not rows[:, 2].any():
            return []
        mine = {"error": text or "", "fingerprint": fp if skewed else "", "share": share}
        texts = [json.loads(t) for t in allgather_text(ch, json.dumps(mine), timeout)]
        if failed:
            causes = {r: texts[r]["error"] for r in failed}
            if self.lowest:
                msg = f"{causes[failed[0]]} (reported by rank {failed[0]})"
            elif len(set(causes.values())) == 1 and len(failed) == size:
                msg = next(iter(causes.values()))
            else:
                msg = grouped(causes)
            self._raise(msg, causes, error)
        if skewed:
            prints = [t["fingerprint"] for t in texts]
            msg = skew(prints) if skew is not None else f"{what} differs across ranks: " + grouped(dict(enumerate(prints)))
            self._raise(msg, {r: "differs" for r in range(size)}, None)
        return [t["share"] for t in texts]

    def on_root(self, comm, fn, *, timeout: float, what: str = "", root: int = 0, share: bool = True):
        """Run ``fn()`` on ``root`` only; an error raised there is raised on every rank
        (no rank is left waiting for a root that failed). With ``share`` every rank gets
        its result (a short text, e.g. a path); without, only the outcome is shared and
        the value stays on ``root``."""
        rank = 0 if comm is None else comm.Get_rank()
        value, err = None, None
        if rank == root:
            try:
                value = fn()
            except Exception as e:  # noqa: BLE001 - reported to every rank, then raised
                err = e
        shared = self.agree(comm, err, what=what, timeout=timeout,
                            share=(value if rank == root else None) if share else None)
        if not share:
            return value
        return shared[root] if shared else value

    def all_ok(self, comm, fn, *, timeout: float, what: str = ""):
        """Run ``fn()`` on every rank, then agree: returns its result where every rank
        succeeded, raises the agreed error everywhere otherwise (chained, on the rank
        that failed, to its exception)."""
        result, err = None, None
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - reported to every rank, then raised
            err = e
        self.agree(comm, err, what=what, timeout=timeout)
        return result


SETUP = Agreement(JobError)


def agree(comm, error: BaseException | None, *, what: str, timeout: float,
          fingerprint: str | None = None, skew=None, share: str | None = None) -> list:
    """The setup agreement (:meth:`Agreement.agree` of :data:`SETUP`): a :class:`JobError`
    naming every failing rank, on the job's private agreement channel."""
    return SETUP.agree(comm, error, what=what, timeout=timeout, fingerprint=fingerprint, skew=skew,
                       share=share)


class stage:
    """``with stage(comm, "data", timeout=...) as st:`` runs local work (no
    collectives), then every rank agrees (:func:`agree`): an exception on any rank
    becomes the same :class:`JobError` on every rank. Set ``st.fingerprint`` inside
    the block to check that every rank got the same (config, data shape...).

    A :class:`JobError` raised inside (an agreement already made) passes through;
    KeyboardInterrupt and other non-``Exception`` exits are not agreed on (the
    caller ends the job)."""

    def __init__(self, comm, what: str, *, timeout: float, fingerprint: str | None = None, skew=None):
        self.comm, self.what, self.timeout = comm, what, timeout
        self.fingerprint, self.skew = fingerprint, skew

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if e is not None and (isinstance(e, JobError) or not isinstance(e, Exception)):
            return False
        if e is not None and not isinstance(e, USER_ERRORS):
            traceback.print_exception(e)  # a bug, not bad input: its traceback, on its rank, once
        agree(self.comm, e, what=self.what, timeout=self.timeout,
              fingerprint=self.fingerprint if e is None else None, skew=self.skew)
        return False


def on_root(comm, fn, *, what: str, timeout: float, root: int = 0) -> str:
    """Run ``fn() -> str`` on ``root`` only; every rank gets its result, or the same
    :class:`JobError` if it raised (:meth:`Agreement.on_root` of :data:`SETUP`)."""
    return SETUP.on_root(comm, fn, what=what, timeout=timeout, root=root)


__all__ = ["JobError", "Agreement", "SETUP", "agree", "stage", "on_root", "cause", "grouped",
           "allgather_slots", "allgather_rows", "allgather_text", "wait_gently", "job_comm", "USER_ERRORS"]
