"""Agreement before training: every rank says ok or why not, and all stop together.

Each setup stage (config, data and model, strategy setup, run directory) ends with
:func:`agree`: every rank contributes one small row ``[failed, fingerprint hash]``
to a deadline-bounded hpcdp.comm all-gather on a private duplicate of the
communicator (so agreement traffic never meets the strategies' collectives). If a
rank failed, or the fingerprints differ (config skew), the texts behind them are
gathered too, and every rank raises the same :class:`JobError` naming the failing
ranks and their causes. Cost on success: one all-gather of 16 bytes per rank per
stage; the texts move only when something is wrong (or a root shares a path).

A rank that never arrives is named by the all-gather's timeout
(:class:`hpcdp.comm.CollectiveTimeout`): that is not an agreement, and the caller
ends the job (:mod:`hpcdp.failure.policy`).
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


def _allgather_rows(comm, row: np.ndarray, timeout: float) -> np.ndarray:
    from hpcdp.comm import all_gather

    n, k = comm.Get_size(), row.size
    full = np.zeros(n * k, dtype=row.dtype)
    full[comm.Get_rank() * k:(comm.Get_rank() + 1) * k] = row
    all_gather(full, comm=comm, timeout=timeout)  # in place: chunk r is rank r's row
    return full.reshape(n, k)


def allgather_text(comm, text: str, timeout: float) -> list[str]:
    """Every rank's ``text``, in rank order (lengths first, then padded UTF-8 bytes)."""
    data = np.frombuffer(text.encode(), dtype=np.uint8)
    lens = _allgather_rows(comm, np.array([data.size], dtype=np.int64), timeout)[:, 0]
    width = max(int(lens.max()), 1)
    row = np.zeros(width, dtype=np.uint8)
    row[:data.size] = data
    rows = _allgather_rows(comm, row, timeout)
    return [rows[r, :lens[r]].tobytes().decode() for r in range(comm.Get_size())]


# -- agreement -------------------------------------------------------------------

def _group(texts: dict) -> str:
    """{rank: text} -> "rank 1: text; ranks 2-3: other" (ranks of equal text together)."""
    by_text: dict[str, list[int]] = {}
    for r, t in sorted(texts.items()):
        by_text.setdefault(t, []).append(r)
    return "; ".join(f"{fmt_ranks(rs)}: {t}" for t, rs in by_text.items())


def agree(comm, error: BaseException | None, *, what: str, timeout: float,
          fingerprint: str | None = None, skew=None, share: str | None = None) -> list:
    """Collective: every rank reports ``error`` (None = ok). Raises the same
    :class:`JobError` on every rank if any rank failed or the ``fingerprint`` texts
    differ (``skew(texts) -> str`` words that case). Returns every rank's ``share``
    text (rank order; None where a rank shared nothing) when any rank shared one."""
    size = 1 if comm is None else comm.Get_size()
    fp = fingerprint or ""
    if size == 1:
        if error is not None:
            raise JobError(cause(error), failed={0: cause(error)}) from error
        return [share] if share is not None else []
    jc = job_comm(comm, timeout)
    row = np.array([int(error is not None), _digest(fp), int(share is not None)], dtype=np.int64)
    rows = _allgather_rows(jc, row, timeout)
    failed = [r for r in range(size) if rows[r, 0]]
    skewed = len(set(rows[:, 1].tolist())) > 1
    if not failed and not skewed and not rows[:, 2].any():
        return []
    mine = {"error": cause(error) if error is not None else "",
            "fingerprint": fp if skewed else "", "share": share}
    texts = [json.loads(t) for t in allgather_text(jc, json.dumps(mine), timeout)]
    if failed:
        causes = {r: texts[r]["error"] for r in failed}
        same = len(set(causes.values())) == 1 and len(failed) == size
        msg = next(iter(causes.values())) if same else _group(causes)
        raise JobError(msg, failed=causes) from error
    if skewed:
        prints = [t["fingerprint"] for t in texts]
        msg = skew(prints) if skew is not None else f"{what} differs across ranks: " + _group(dict(enumerate(prints)))
        raise JobError(msg, failed={r: "differs" for r in range(size)})
    return [t["share"] for t in texts]


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
    :class:`JobError` if it raised (no rank is left waiting for a root that failed)."""
    rank = 0 if comm is None else comm.Get_rank()
    text, err = None, None
    if rank == root:
        try:
            text = fn()
        except Exception as e:  # noqa: BLE001 - reported to every rank, then raised
            err = e
    shared = agree(comm, err, what=what, timeout=timeout, share=text)
    return shared[root]


__all__ = ["JobError", "agree", "stage", "on_root", "cause", "allgather_text", "job_comm", "USER_ERRORS"]
