"""The byte ledger: what every collective sent and received, per rank, by name.

Scaling studies and tests check the analytic communication model against it, so
it counts exactly the payload bytes handed to MPI send/receive calls by hpcdp's
collectives (data traffic). Control traffic (debug fingerprints, the timeout diagnosis)
is not payload and is not counted. For ``algorithm="native"`` (MPI's own
collectives) the ledger records the bytes handed to the MPI call, one message
each way: what MPI moves internally is not visible from here.

A training step reports its own bytes with ``snap = ledger.snapshot()`` before
and ``ledger.delta(snap)`` after (or ``reset()``).

Thread-safe: the compiled engine's progress thread (hpcdp.comm.engines.compiled.progress)
records the collectives it completes while the training thread records its own and
reads totals, so every update and every read holds the ledger's lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class Entry:
    """Totals for one collective name on this rank."""

    calls: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    sent_msgs: int = 0
    recv_msgs: int = 0

    def as_dict(self) -> dict:
        return {"calls": self.calls, "sent_bytes": self.sent_bytes,
                "recv_bytes": self.recv_bytes, "sent_msgs": self.sent_msgs,
                "recv_msgs": self.recv_msgs}


class Ledger:
    """Per-rank counters of messages and bytes, keyed by collective name."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()

    def record(self, name: str, sent_bytes: int = 0, recv_bytes: int = 0,
               sent_msgs: int = 0, recv_msgs: int = 0, calls: int = 0) -> None:
        """Add to the totals of ``name``; ``calls`` counts completed collectives."""
        if min(sent_bytes, recv_bytes, sent_msgs, recv_msgs, calls) < 0:
            raise ValueError(f"Ledger.record({name!r}): counts must be >= 0")
        self._add(name, calls, int(sent_bytes), int(recv_bytes), int(sent_msgs),
                  int(recv_msgs))

    def count_call(self, name: str, sent_bytes: int, recv_bytes: int, sent_msgs: int,
                   recv_msgs: int) -> None:
        """One completed collective's figures (Python ints >= 0, from hpcdp's own code):
        :meth:`record` without its argument checks, for the per-call fast fronts."""
        self._add(name, 1, sent_bytes, recv_bytes, sent_msgs, recv_msgs)

    def _add(self, name, calls, sent_bytes, recv_bytes, sent_msgs, recv_msgs) -> None:
        with self._lock:
            e = self._entries.get(name)
            if e is None:
                e = self._entries[name] = Entry()
            e.calls += calls
            e.sent_bytes += sent_bytes
            e.recv_bytes += recv_bytes
            e.sent_msgs += sent_msgs
            e.recv_msgs += recv_msgs

    def totals(self) -> dict[str, dict]:
        """``{name: {calls, sent_bytes, recv_bytes, sent_msgs, recv_msgs}}``."""
        with self._lock:
            return {k: e.as_dict() for k, e in self._entries.items()}

    def total_bytes(self) -> tuple[int, int]:
        """``(sent, received)`` over all names."""
        with self._lock:
            s = sum(e.sent_bytes for e in self._entries.values())
            r = sum(e.recv_bytes for e in self._entries.values())
        return s, r

    def snapshot(self) -> dict[str, dict]:
        """A copy of the totals, to pass to :meth:`delta` later."""
        return self.totals()

    def delta(self, snapshot: dict[str, dict]) -> dict[str, dict]:
        """Totals accumulated since ``snapshot`` (names with no change omitted)."""
        out = {}
        for name, now in self.totals().items():
            before = snapshot.get(name, {})
            d = {k: v - before.get(k, 0) for k, v in now.items()}
            if any(d.values()):
                out[name] = d
        return out

    def reset(self) -> None:
        with self._lock:
            self._entries.clear()

    def __repr__(self) -> str:
        return f"Ledger({self.totals()})"
