"""Ranks agree on the outcome of a checkpoint step, so that nobody hangs.

After each phase of a save or load every rank calls :func:`agree` with its own
error (or None). If any rank failed, every rank raises the same
:class:`CheckpointError` carrying the message of the lowest failing rank: a rank
that could not read its file tells the others, who would otherwise wait for it in
the next collective. The agreement is two small allreduces of
:mod:`hpcdp.comm`, each bounded by the comm timeout: a rank that died (or never
arrives) turns into ``CollectiveTimeout`` naming it, not a hang.

In the background writer's thread the waits poll with short sleeps instead of
spinning, so an agreement running there leaves the GIL to training.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from .errors import CheckpointError

MESSAGE_BYTES = 2048  # longer messages are cut (they name the file first)


def allreduce_gently(buf: np.ndarray, comm, op: str, timeout: float) -> np.ndarray:
    """In-place allreduce of hpcdp.comm, bounded by ``timeout``. In the training
    thread it polls like any collective (lowest latency: nothing else runs then); in
    the background writer's thread it sleeps between polls, so the GIL stays with
    training."""
    from hpcdp.comm import iallreduce

    req = iallreduce(buf, comm=comm, op=op, timeout=timeout)
    if threading.current_thread() is threading.main_thread():
        req.wait(timeout=timeout)
        return buf
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
    return buf


def allgather_rows(comm, rows: np.ndarray, *, timeout: float = 300.0) -> list:
    """Every rank's ``rows`` (a (k, w) array, k may differ by rank; same dtype and w
    everywhere), as a list in rank order. Two allreduces (counts, then the rows
    zero-padded to the longest, each rank in its own slot): small tables only."""
    rows = np.asarray(rows)
    if comm is None or comm.Get_size() == 1:
        return [rows]
    size, rank = comm.Get_size(), comm.Get_rank()
    counts = np.zeros(size, dtype=np.int64)
    counts[rank] = rows.shape[0]
    allreduce_gently(counts, comm, "sum", timeout)
    table = np.zeros((size, int(counts.max()), *rows.shape[1:]), dtype=rows.dtype)
    table[rank, :rows.shape[0]] = rows
    allreduce_gently(table.reshape(-1), comm, "sum", timeout)  # one rank per slot: no carries
    return [table[r, :counts[r]] for r in range(size)]


def agree(comm, error: str | None, *, timeout: float = 300.0) -> None:
    """Raise on every rank if any rank passed an error; return quietly otherwise."""
    if comm is None or comm.Get_size() == 1:
        if error:
            raise CheckpointError(error)
        return
    rank, size = comm.Get_rank(), comm.Get_size()
    first = allreduce_gently(np.array([rank if error else size], dtype=np.int64), comm, "min", timeout)
    first = int(first[0])
    if first == size:
        return
    text = _share_text(comm, error if rank == first else "", first, timeout)
    raise CheckpointError(f"{text} (reported by rank {first})")


def _share_text(comm, text: str, root: int, timeout: float) -> str:
    buf = np.zeros(MESSAGE_BYTES, dtype=np.uint8)
    if comm.Get_rank() == root:
        raw = text.encode()[:MESSAGE_BYTES]
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    allreduce_gently(buf, comm, "max", timeout)  # only the root's bytes are non-zero
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def on_root(comm, fn, *, timeout: float = 300.0, root: int = 0, share: bool = True):
    """Run ``fn()`` on ``root``; an error raised there is raised on every rank. With
    ``share`` every rank gets its result (a short string, e.g. a path); without, only
    the outcome is shared (one allreduce less) and the value stays on ``root``."""
    value, error = "", None
    if comm is None or comm.Get_rank() == root:
        try:
            value = fn()
        except (CheckpointError, OSError) as e:
            error = str(e)
        except Exception as e:  # a bug: still tell the others
            error = f"{type(e).__name__}: {e}"
    if comm is None or comm.Get_size() == 1:
        if error:
            raise CheckpointError(error)
        return value
    agree(comm, error, timeout=timeout)
    return _share_text(comm, value, root, timeout) if share else value


def all_ok(comm, fn, *, timeout: float = 300.0):
    """Run ``fn()`` on every rank, then agree: returns its result where every rank
    succeeded, raises the first failing rank's message everywhere otherwise."""
    result, error, cause = None, None, None
    try:
        result = fn()
    except (CheckpointError, OSError) as e:
        error, cause = str(e), e
    except Exception as e:  # a bug: still tell the others, keep the traceback here
        error, cause = f"{type(e).__name__}: {e}", e
    try:
        agree(comm, error, timeout=timeout)
    except CheckpointError as e:
        raise e from cause
    return result


__all__ = ["agree", "on_root", "all_ok", "allgather_rows", "allreduce_gently", "MESSAGE_BYTES"]
