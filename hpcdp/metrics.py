"""Per-step metrics: every rank's figures gathered to one writer rank.

Each step, every worker packs a fixed-size float64 vector
``[weighted loss, local samples, step time, *step_stats values]`` and the writer
(rank 0 of the worker communicator) receives them all with one ``comm.Gather``:
plain numbers, no pickle. This is a sync point every step (a few microseconds on
one node): the price of seeing every rank's bytes and times per step.

The writer appends one JSON object per step to ``metrics.jsonl`` and prints one
log line every ``log_every`` steps (and on the last) with an ETA.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time

import numpy as np

_HEADER = ("loss", "samples", "step_time_s")


def _key_hash(keys) -> int:
    return int.from_bytes(hashlib.sha1("\0".join(keys).encode()).digest()[:7], "little")


class StepGather:
    """Gathers per-rank step figures to rank 0 of ``comm`` (an mpi4py communicator)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.keys: tuple[str, ...] | None = None
        self._recv = None

    def _check_keys(self, stats: dict):
        keys = tuple(sorted(stats))
        if self.keys is None:
            # Once: every rank must report the same keys, or Gather sizes would differ.
            mine = np.array([_key_hash(keys), len(keys)], dtype=np.int64)
            allk = np.empty((self.size, 2), dtype=np.int64)
            self.comm.Allgather(mine, allk)
            bad = [r for r in range(self.size) if tuple(allk[r]) != tuple(allk[0])]
            if bad:
                raise RuntimeError(f"step_stats() keys differ between ranks 0 and {bad}: "
                                   f"rank {self.rank} reports {list(keys)}")
            self.keys = keys
            if self.rank == 0:
                self._recv = np.empty((self.size, len(_HEADER) + len(keys)), dtype=np.float64)
        elif keys != self.keys:
            raise RuntimeError(f"step_stats() keys changed on rank {self.rank}: {list(keys)} "
                               f"instead of {list(self.keys)}")

    def gather(self, loss_part: float, samples: int, step_time: float, stats: dict):
        """Collective. Returns (global loss, {name: per-rank list}) on rank 0, else None."""
        self._check_keys(stats)
        vec = np.empty(len(_HEADER) + len(self.keys), dtype=np.float64)
        vec[:3] = (loss_part, samples, step_time)
        for i, k in enumerate(self.keys):
            v = stats[k]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"step_stats()[{k!r}] must be a number, got {type(v).__name__}")
            vec[3 + i] = v
        self.comm.Gather(vec, self._recv, root=0)
        if self.rank != 0:
            return None
        # Columnar: {"samples": [r0, r1, ...], "step_time_s": [...], <stat>: [...]}.
        names = ("samples", "step_time_s") + self.keys
        cols = {}
        for j, name in enumerate(names, start=1):
            vals = [float(x) for x in self._recv[:, j]]
            cols[name] = [int(x) if x.is_integer() and abs(x) < 2**53 else x for x in vals]
        return float(self._recv[:, 0].sum()), cols


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
            self.f.write(json.dumps(record, allow_nan=True) + "\n")
            self.f.flush()

    def log(self, text: str) -> None:
        print(text, file=self.out, flush=True)

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


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"
