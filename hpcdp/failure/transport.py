"""The transport's own detection of a lost peer stays off, so hpcdp's deadline is the one
that fires.

MPICH over UCX (the ``mpich`` wheel; TCP between nodes) crashes the rank when UCX has
declared a peer's connection failed and the rank then sends to that peer: a SIGSEGV in
``MPI_Isend``, no hpcdp line, no ``MPI_Abort``. UCX declares a connection failed on its
own after a node's link goes down: TCP keepalive (``UCX_TCP_KEEPIDLE`` 10 s + 3 probes
2 s apart, about 16 s of silence on an idle connection) and UCP's keepalive
(``UCX_KEEPALIVE_INTERVAL``). hpcdp's deadline (``comm.timeout``) then fires, and its
diagnosis sends a status message to every peer, the lost ones too: with a
``comm.timeout`` above ~16 s most link cuts ended in that SIGSEGV (5 of 6 tries at 20 s,
docs/cluster.md, "Faults across nodes").

So before MPI starts, :func:`leave_peer_loss_to_hpcdp` turns both keepalives off
(``inf``) wherever the user has not set them: a peer that went silent is then found by
hpcdp's deadline only, and every reachable rank ends with hpcdp's line. Nothing is lost:
a silent peer blocks training either way, and the deadline names it. A user's own
setting wins (it is then theirs to keep above ``comm.timeout``).
"""

from __future__ import annotations

import os

# variable -> value: UCX's detectors of a silent peer, off
TRANSPORT_DEFAULTS = {
    "UCX_TCP_KEEPIDLE": "inf",        # TCP keepalive on UCX's TCP connections
    "UCX_KEEPALIVE_INTERVAL": "inf",  # UCP's endpoint keepalive (error-handling endpoints)
}


def leave_peer_loss_to_hpcdp(environ=None) -> list[str]:
    """Set each of :data:`TRANSPORT_DEFAULTS` the environment leaves unset (before MPI is
    initialized: UCX reads them once); returns the names set."""
    env = os.environ if environ is None else environ
    unset = [k for k in TRANSPORT_DEFAULTS if not env.get(k)]
    for k in unset:
        env[k] = TRANSPORT_DEFAULTS[k]
    return unset


__all__ = ["TRANSPORT_DEFAULTS", "leave_peer_loss_to_hpcdp"]
