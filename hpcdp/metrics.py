"""Per-step metrics: every rank's figures, gathered to one writer rank in blocks.

Each step, every worker packs a fixed-size float64 row
``[weighted loss, local samples, step time, *step_stats values]`` and keeps it
(:meth:`StepGather.add`). Every ``log_every`` steps (and at the first, the last and
evaluation steps) :meth:`StepGather.flush` moves the buffered rows of all ranks to
the writer (rank 0 of the worker communicator): each other rank sends its block in
one message (``Isend``, tag :data:`TAG_ROWS`), plain numbers, no pickle. The writer
waits for every block (it needs the rows to log), polling with a deadline
(``timeout``, comm.timeout in ``hpcdp train``): a rank whose block never comes is
named. Every other rank leaves its send in flight and completes it at its next
flush (or :meth:`finish`), so a fast worker is not held back by the slowest, and
asynchronous strategies keep their asynchrony in ``hpcdp train``. Cost: one small
message per rank per flush instead of a collective per step; rows wait in memory
until the next flush.

The writer appends one JSON object per step to ``metrics.jsonl`` (all of a block's
steps at its flush) and prints one log line every ``log_every`` steps (and on the
last) with an ETA. The file is strict JSON (RFC 8259): a non-finite number (a NaN
loss) is written as ``null``.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time

import numpy as np

_HEADER = ("loss", "samples", "step_time_s")
TAG_ROWS = 7301  # point-to-point tag of the row blocks (the communicator's only p2p traffic)
DEFAULT_TIMEOUT_S = 300.0


def _key_hash(keys) -> int:
    return int.from_bytes(hashlib.sha1("\0".join(keys).encode()).digest()[:7], "little")


class StepGather:
    """Buffers per-rank step figures and gathers them to rank 0 of ``comm`` in blocks."""

    def __init__(self, comm, timeout: float = DEFAULT_TIMEOUT_S):
        self.comm, self.timeout = comm, float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.keys: tuple[str, ...] | None = None
        self._rows: list = []        # this rank's rows since the last flush
        self._inflight = None        # non-writer ranks: (request, send buffer) of the last flush

    def _check_keys(self, stats: dict):
        keys = tuple(sorted(stats))
        if self.keys is None:
            # Once: every rank must report the same keys, or the row sizes would differ.
            allk = np.zeros((self.size, 2), dtype=np.int64)
            allk[self.rank] = (_key_hash(keys), len(keys))
            if self.size > 1:
                from hpcdp.comm import all_gather
                all_gather(allk.reshape(-1), comm=self.comm, timeout=self.timeout)
            bad = [r for r in range(self.size) if tuple(allk[r]) != tuple(allk[0])]
            if bad:
                raise RuntimeError(f"step_stats() keys differ between ranks 0 and {bad}: "
                                   f"rank {self.rank} reports {list(keys)}")
            self.keys = keys
        elif keys != self.keys:
            raise RuntimeError(f"step_stats() keys changed on rank {self.rank}: {list(keys)} "
                               f"instead of {list(self.keys)}")

    def add(self, loss_part: float, samples: int, step_time: float, stats: dict) -> None:
        """Keep this rank's figures of one step (local; the first call is collective)."""
        self._check_keys(stats)
        row = np.empty(len(_HEADER) + len(self.keys), dtype=np.float64)
        row[:3] = (loss_part, samples, step_time)
        for i, k in enumerate(self.keys):
            v = stats[k]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"step_stats()[{k!r}] must be a number, got {type(v).__name__}")
            row[3 + i] = v
        self._rows.append(row)

    def flush(self) -> list:
        """Collective (every rank calls it after the same steps). Returns on rank 0 one
        ``(global loss, {name: per-rank list})`` per buffered step, in step order;
        ``[]`` on the other ranks, which do not wait for the gather to complete."""
        if not self._rows:
            return []
        block = np.stack(self._rows)
        self._rows = []
        if self.rank != 0:
            self.finish()                 # the previous flush's send: long done, normally
            self._inflight = (self.comm.Isend(block, dest=0, tag=TAG_ROWS), block)
            return []
        recv = np.empty((self.size,) + block.shape, dtype=np.float64)
        recv[0] = block
        if self.size > 1:                 # the writer needs every row now
            from hpcdp.failure.deadline import wait
            peers = range(1, self.size)
            wait([self.comm.Irecv(recv[r], source=r, tag=TAG_ROWS) for r in peers], self.timeout,
                 "the metrics of steps up to this flush from every worker", sources=list(peers))
        # Columnar: {"samples": [r0, r1, ...], "step_time_s": [...], <stat>: [...]}.
        names = ("samples", "step_time_s") + self.keys
        out = []
        for i in range(block.shape[0]):
            cols = {}
            for j, name in enumerate(names, start=1):
                vals = [float(x) for x in recv[:, i, j]]
                cols[name] = [int(x) if x.is_integer() and abs(x) < 2**53 else x for x in vals]
            out.append((float(recv[:, i, 0].sum()), cols))
        return out

    def gather(self, loss_part: float, samples: int, step_time: float, stats: dict):
        """One step, gathered now (``add`` + ``flush`` + ``finish``: complete on every
        rank when it returns). Rank 0: (global loss, cols); else None."""
        self.add(loss_part, samples, step_time, stats)
        got = self.flush()
        self.finish()
        return got[0] if got else None

    def finish(self) -> None:
        """Complete this rank's last gather (before the communicator is freed)."""
        if self._inflight is not None:
            from hpcdp.failure.deadline import wait
            wait([self._inflight[0]], self.timeout, "the writer (rank 0) to take this rank's metrics",
                 sources=[0])
            self._inflight = None


class MetricsWriter:
    """metrics.jsonl (one object per line, flushed) + the rank-0 log lines."""

    def __init__(self, path, total_steps: int, log_every: int, out=None):
        self.f = open(path, "a", encoding="utf-8") if path is not None else None
        self.total, self.log_every = total_steps, log_every
        self.out = out or sys.stdout
        self.t0 = time.perf_counter()
        self._ema = None  # smoothed step time for the ETA

    def write(self, record: dict) -> None:
        if self.f is not None:
            self.f.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
            self.f.flush()

    def log(self, text: str) -> None:
        # one write per line (print() writes the newline separately): a signal or
        # another rank's line cannot land in the middle of it
        self.out.write(text + "\n")
        self.out.flush()

    def step(self, record: dict) -> None:
        self.write(record)
        dt, s = record["step_time_s"], record["step"]
        if s > 1:  # step 1 pays for compilation and first touches: not in the ETA
            self._ema = dt if self._ema is None else 0.9 * self._ema + 0.1 * dt
        if s % self.log_every == 0 or s == self.total or s == 1:
            eta = "?" if self._ema is None else format_duration(self._ema * (self.total - s))
            self.log(f"step {s:>{len(str(self.total))}}/{self.total}  loss {record['loss']:.4f}  "
                     f"lr {record['lr']:.3g}  {record['samples_per_s']:,.0f} samples/s  "
                     f"{1e3 * dt:.2f} ms/step  elapsed {format_duration(time.perf_counter() - self.t0)}  "
                     f"ETA {eta}")

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def strict_json(value):
    """``value`` with every non-finite float replaced by None (JSON ``null``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"
