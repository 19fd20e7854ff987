"""Errors raised by hpcdp's collectives. Each names the ranks involved."""

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
