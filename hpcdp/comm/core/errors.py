"""Errors raised by hpcdp's collectives. Each names the ranks involved.

Every failure of a collective reaches the caller as a :class:`CommError`: a peer that
never arrives (:class:`CollectiveTimeout`), ranks that disagree (:class:`CollectiveMismatch`),
an MPI call that returned an error (:class:`MPIError`, with MPI's error class: hpcdp's
communicators return errors instead of aborting, hpcdp.comm.core.context), or a
communicator this rank gave up on (:class:`CommAborted`, hpcdp.comm.abort). After any of
them the communicator is marked failed: later collectives on it raise the same error at
once, until hpcdp.comm.forget drops it.
"""

from __future__ import annotations


class CommError(RuntimeError):
    """Base class of hpcdp.comm errors."""


class CollectiveTimeout(CommError):
    """A collective did not complete within its timeout.

    ``missing`` lists the ranks that never arrived: they did not answer the
    diagnosis that runs once the deadline passed (hpcdp.comm.core.diagnose), and every
    rank that took part names the same ones. ``waiting_on`` the ranks whose data
    messages this rank still waits for (local: a ring rank waits on its
    neighbour). The diagnosis also sets ``states`` (rank -> the fingerprint of the
    collective each answering rank waits in), ``arrived`` (the ranks that answered:
    the lowest of them reports the job's failure, hpcdp.failure.policy), ``joined``
    (another rank's deadline passed first) and ``waited`` (seconds since the
    request started). The job should end (``comm.Abort``): the other ranks are
    stuck in the same collective or elsewhere.
    """

    def __init__(self, message: str, *, seq: int, name: str, missing=(), waiting_on=()):
        super().__init__(message)
        self.seq, self.name = seq, name
        self.missing, self.waiting_on = list(missing), list(waiting_on)
        self.states: dict = {}
        self.waited: float | None = None


class CollectiveMismatch(CommError):
    """Ranks disagree on the collective they call (debug mode fingerprint check).

    Raised on every rank with the same message: ``groups`` maps each distinct
    fingerprint (as a readable string) to the ranks that presented it.
    """

    def __init__(self, message: str, *, seq: int, groups: dict, disagreeing=()):
        super().__init__(message)
        self.seq, self.groups, self.disagreeing = seq, groups, list(disagreeing)


# MPI error classes a caller may want to tell apart (ULFM's where this MPI has them)
_NAMED = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_COMM", "ERR_TRUNCATE",
          "ERR_OTHER", "ERR_INTERN", "ERR_BUFFER", "ERR_COUNT", "ERR_TYPE", "ERR_TAG", "ERR_RANK",
          "ERR_REQUEST", "ERR_OP", "ERR_ARG", "ERR_PENDING", "ERR_IN_STATUS", "ERR_NO_MEM")


def _mpi():
    import sys
    return sys.modules.get("mpi4py.MPI")


def error_class_name(error_class: int) -> str:
    """``"MPI_ERR_PROC_FAILED"`` & co for an MPI error class ("" if not one of the known)."""
    MPI = _mpi()
    if MPI is None:
        return ""
    for name in _NAMED:
        if getattr(MPI, name, None) == error_class:
            return "MPI_" + name
    return ""


class MPIError(CommError):
    """An MPI call inside a collective returned an error (never an abort: hpcdp's
    communicators use ``MPI.ERRORS_RETURN``). ``error_code`` as MPI returned it,
    ``error_class`` its class (``MPI_Error_class``), ``error_name`` the class's name
    where known (``"MPI_ERR_PROC_FAILED"``, ``"MPI_ERR_REVOKED"``, ...); ``proc_failed``
    and ``revoked`` answer ULFM's two questions (False where the MPI has no ULFM).
    ``collective``, ``seq``, ``rank``: the call it happened in, on this rank."""

    def __init__(self, message: str, *, error_code: int, error_class: int, collective: str = "",
                 seq: int = -1, rank: int = -1):
        super().__init__(message)
        self.error_code, self.error_class = int(error_code), int(error_class)
        self.error_name = error_class_name(self.error_class)
        self.collective, self.seq, self.rank = collective, seq, rank

    @property
    def proc_failed(self) -> bool:
        MPI = _mpi()
        return MPI is not None and self.error_class in {
            getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING") if hasattr(MPI, n)}

    @property
    def revoked(self) -> bool:
        MPI = _mpi()
        return MPI is not None and hasattr(MPI, "ERR_REVOKED") and self.error_class == MPI.ERR_REVOKED


def mpi_error(code_or_exc, *, collective: str = "", seq: int = -1, rank: int = -1) -> MPIError:
    """The :class:`MPIError` for an ``MPI.Exception`` (mpi4py) or an MPI error code (the
    compiled engine's calls return them)."""
    MPI = _mpi()
    code = code_or_exc.Get_error_code() if hasattr(code_or_exc, "Get_error_code") else int(code_or_exc)
    try:
        cls = MPI.Get_error_class(code) if MPI is not None else code
    except Exception:  # noqa: BLE001 - a code the library does not know: its own class
        cls = code
    try:
        text = MPI.Get_error_string(code) if MPI is not None else ""
    except Exception:  # noqa: BLE001
        text = ""
    err = MPIError("", error_code=code, error_class=cls, collective=collective, seq=seq, rank=rank)
    where = f"collective {collective!r} (sequence number {seq})" if collective else "an MPI call"
    name = f" {err.error_name}" if err.error_name else ""
    err.args = (f"{where} on rank {rank}: MPI returned error {code} (class {cls}{name}: "
                f"{text or 'no description'})",)
    return err


class CommAborted(CommError):
    """The communicator was aborted on this rank (hpcdp.comm.abort): every collective
    on it, in flight or later, raises this. ``reason``: what the caller said."""

    def __init__(self, reason: str, *, rank: int = -1):
        super().__init__(f"hpcdp.comm: the communicator was aborted on rank {rank}: {reason}")
        self.reason, self.rank = reason, rank


__all__ = ["CommError", "CollectiveTimeout", "CollectiveMismatch", "MPIError", "CommAborted",
           "mpi_error", "error_class_name"]
