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

Flushes also come at least every :data:`FLUSH_EVERY_S` seconds of steps
(:class:`FlushCadence`: the writer announces the next interval at each flush, so the
ranks agree without a collective per step) and before a block outgrows
:data:`MAX_BLOCK_BYTES` on the writer, so rows never pile up in memory and a job that
fails loses at most a few seconds of them; the writer's own failure writes its
unflushed steps (:meth:`MetricsWriter.unflushed`).

The writer appends one JSON object per step to ``metrics.jsonl`` (all of a block's
steps at its flush) and prints one log line every ``log_every`` steps (and on the
last) with the loss, throughput and step time averaged over the steps since the
previous line, and an ETA from them; the same lines, timestamped, go to the run's
``train.log`` (:class:`RunLog`). Above ``rank_lists_up_to`` ranks a step's record
keeps the per-rank lists only every ``rank_lists_every`` steps and the spread of each
figure (min / median / max and the rank of the max) on every step
(:func:`spread_of`). The file is strict JSON (RFC 8259): a non-finite number (a NaN
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
TAG_CADENCE = 7302  # the writer's announcement of the next flush interval
DEFAULT_TIMEOUT_S = 300.0
FLUSH_EVERY_S = 5.0  # metrics reach metrics.jsonl at least this often (run.metrics_flush_s)
MAX_BLOCK_BYTES = 64 << 20  # the writer's receive buffer of one flush, at most
MAX_BLOCK_ROWS = 1024  # steps held before a flush, at most (whatever log_every and metrics_flush_s say)


def _key_hash(keys) -> int:
    return int.from_bytes(hashlib.sha1("\0".join(keys).encode()).digest()[:7], "little")


class FlushCadence:
    """How many steps may pass between two flushes so that they are at most ``seconds``
    apart, agreed by every rank of ``comm`` without a collective per step.

    At each flush the writer (rank 0), which has just gathered every rank's step times,
    computes the count for the interval after the NEXT flush and sends it to every rank
    (one small message each, tag :data:`TAG_CADENCE`); each rank takes the count sent
    at the previous flush into force at this one (long since delivered: it waits for
    nothing in practice). Until the first count is in force, every step flushes."""

    def __init__(self, comm, seconds: float, timeout: float = DEFAULT_TIMEOUT_S):
        self.comm, self.seconds, self.timeout = comm, float(seconds), float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.every = 1                   # steps between flushes now in force
        self._next: int | None = None    # the writer: the count it announced last
        self._msgs: list = []            # requests of the last announcement
        self._buf = np.zeros(1, dtype=np.int64)

    def after_flush(self, step_times=None) -> None:
        """Every rank at every flush; the writer passes the gathered step times
        (array (ranks, steps)): the slowest rank's mean step time sets the next count."""
        from hpcdp.failure.deadline import wait

        peers = [0] if self.rank else list(range(1, self.size))
        wait(self._msgs, self.timeout, "the writer's next metrics flush interval", sources=peers[:len(self._msgs)])
        if self.rank != 0:
            if self._msgs:
                self.every = int(self._buf[0])
            self._msgs = [self.comm.Irecv(self._buf, source=0, tag=TAG_CADENCE)]
            return
        if self._next is not None:
            self.every = self._next
        t = float(np.mean(np.max(step_times, axis=0))) if step_times is not None and step_times.size else 0.0
        self._next = max(1, int(self.seconds / t)) if t > 0 else 1
        self._buf[0] = self._next
        self._msgs = [self.comm.Isend(self._buf, dest=r, tag=TAG_CADENCE) for r in range(1, self.size)]

    def finish(self) -> None:
        from hpcdp.failure.deadline import wait

        wait(self._msgs, self.timeout, "the writer's last metrics flush interval")
        self._msgs = []


class StepGather:
    """Buffers per-rank step figures and gathers them to rank 0 of ``comm`` in blocks.
    ``flush_every_s``: also flush at least this often (:class:`FlushCadence`; None:
    only when the caller flushes); :meth:`due` says when."""

    def __init__(self, comm, timeout: float = DEFAULT_TIMEOUT_S, flush_every_s: float | None = None):
        self.comm, self.timeout = comm, float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.keys: tuple[str, ...] | None = None
        self._rows: list = []        # this rank's rows since the last flush
        self._inflight = None        # non-writer ranks: (request, send buffer) of the last flush
        self.cadence = FlushCadence(comm, flush_every_s, timeout) if flush_every_s else None
        self.max_rows: int | None = None  # rows per flush that keep the writer's buffer small

    def due(self) -> bool:
        """Whether the steps added since the last flush should be flushed now (the same
        answer on every rank): the cadence's count is reached, or the block is full."""
        n = len(self._rows)
        if not n:
            return False
        if self.max_rows is not None and n >= self.max_rows:
            return True
        return self.cadence is not None and n >= self.cadence.every

    def own_rows(self) -> list[dict]:
        """This rank's unflushed rows as ``{"loss", "samples", "step_time_s", <stat>: ...}``."""
        names = _HEADER + (self.keys or ())
        return [{k: float(v) for k, v in zip(names, row)} for row in self._rows]

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
            self.max_rows = max(1, min(MAX_BLOCK_ROWS,
                                       MAX_BLOCK_BYTES // (self.size * (len(_HEADER) + len(keys)) * 8)))
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
            if self.cadence is not None:
                self.cadence.after_flush()
            return []
        recv = np.empty((self.size,) + block.shape, dtype=np.float64)
        recv[0] = block
        if self.size > 1:                 # the writer needs every row now
            from hpcdp.failure.deadline import wait
            peers = range(1, self.size)
            wait([self.comm.Irecv(recv[r], source=r, tag=TAG_ROWS) for r in peers], self.timeout,
                 "the metrics of steps up to this flush from every worker", sources=list(peers))
        if self.cadence is not None:
            self.cadence.after_flush(recv[:, :, 2])
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

    def close(self) -> None:
        """The end of a run: :meth:`finish`, and the cadence's last announcement."""
        self.finish()
        if self.cadence is not None:
            self.cadence.finish()


RANK_LISTS_UP_TO = 64   # ranks up to which every step's record lists every rank's figures
RANK_LISTS_EVERY = 100  # above that: the lists every this many steps, the spread on every step


def spread_of(cols: dict) -> dict:
    """``{name: {"min", "median", "max", "argmax"}}`` of per-rank lists (the rank of
    the largest value: the slowest rank for times), plus ``slowest_rank`` (that of
    ``step_time_s``). Its size does not grow with the rank count."""
    out = {}
    for name, vals in cols.items():
        a = np.asarray(vals, dtype=np.float64)
        if not a.size:
            continue
        top = int(np.nanargmax(a)) if np.isfinite(a).any() else 0
        ok = np.isfinite(a).any()
        out[name] = {"min": _num(np.nanmin(a)) if ok else None, "median": _num(np.nanmedian(a)) if ok else None,
                     "mean": _num(np.nanmean(a)) if ok else None, "max": _num(a[top]), "argmax": top}
    if "step_time_s" in out:
        out["slowest_rank"] = out["step_time_s"]["argmax"]
    return out


def rank_values(record: dict, name: str, how: str | None = None):
    """Figure ``name`` of one step record of metrics.jsonl, for its readers: the
    per-rank list (``how`` None; None when the record keeps only the spread, above
    ``run.rank_lists_up_to`` ranks), or its ``"min"`` / ``"median"`` / ``"mean"`` /
    ``"max"`` from the list or else the spread (None when the run has no such figure)."""
    vals = (record.get("ranks") or {}).get(name)
    if how is None:
        return vals
    if vals:
        a = np.asarray([np.nan if v is None else v for v in vals], dtype=np.float64)
        if not np.isfinite(a).any():
            return None
        return float({"min": np.nanmin, "median": np.nanmedian, "mean": np.nanmean, "max": np.nanmax}[how](a))
    sp = (record.get("spread") or {}).get(name)
    return sp.get(how) if isinstance(sp, dict) else None


def _num(x):
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


class RunLog:
    """Rank 0's log lines: on ``out`` (stdout) as they are, and in ``path`` (the run's
    ``train.log``) with a timestamp in front of each. ``note`` writes the file only."""

    def __init__(self, out=None, path=None):
        self.out = out or sys.stdout
        self.f = open(path, "a", encoding="utf-8") if path is not None else None

    def __call__(self, text: str) -> None:
        # one write per line (print() writes the newline separately): a signal or
        # another rank's line cannot land in the middle of it
        self.out.write(text + "\n")
        self.out.flush()
        self.note(text)

    def note(self, text: str) -> None:
        if self.f is not None:
            self.f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class Interval:
    """Sums over the steps since the last log line (and over the whole run, step 1 of
    a run apart: it pays for compilation and first touches), for the interval means
    and the ETA. Constant memory, whatever ``run.log_every``."""

    def __init__(self):
        self.steps = self.loss_steps = 0
        self.loss = self.time = self.samples = 0.0
        self.run_steps, self.run_time, self.run_samples = 0, 0.0, 0.0

    def add(self, loss: float, step_time: float, samples: float, first: bool) -> None:
        self.steps += 1
        self.time += step_time
        self.samples += samples
        if math.isfinite(loss):
            self.loss += loss
            self.loss_steps += 1
        if not first:
            self.run_steps += 1
            self.run_time += step_time
            self.run_samples += samples

    def take(self) -> tuple[int, float, float, float]:
        """(steps, mean loss, samples/s, mean step time) of the interval; resets it."""
        out = (self.steps, self.loss / self.loss_steps if self.loss_steps else float("nan"),
               self.samples / self.time if self.time > 0 else float("nan"),
               self.time / self.steps if self.steps else float("nan"))
        self.steps = self.loss_steps = 0
        self.loss = self.time = self.samples = 0.0
        return out

    def seconds_per_step(self) -> float | None:
        return self.run_time / self.run_steps if self.run_steps else None


class MetricsWriter:
    """metrics.jsonl (one object per line, flushed) + the rank-0 log lines (stdout and
    ``log_path``, the run's train.log). ``tokens_per_sample``: a sequence model's
    context (the log and summary count tokens too); ``rank_lists``: (up to how many
    ranks every step lists every rank, every how many steps above that);
    ``first_step``: the step a run starts at (1, or the one after a resume)."""

    def __init__(self, path, total_steps: int, log_every: int, out=None, *, log_path=None,
                 tokens_per_sample: int | None = None, rank_lists=(RANK_LISTS_UP_TO, RANK_LISTS_EVERY),
                 first_step: int = 1, events=None):
        self.f = open(path, "a", encoding="utf-8") if path is not None else None
        self.total, self.log_every = total_steps, log_every
        self.runlog = RunLog(out, log_path)
        self.out = self.runlog.out
        self.t0 = time.perf_counter()
        self.first_step = first_step
        self.tokens_per_sample = tokens_per_sample
        self.rank_lists_up_to, self.rank_lists_every = rank_lists
        self.events = events  # TensorBoard events (hpcdp.tb_events), or None
        self.interval = Interval()
        self.steps_done, self.samples_done, self.step_time = 0, 0.0, 0.0
        self.bytes_sent = 0.0          # summed over steps: the mean over ranks of bytes_sent
        self.last_step = None
        self.evals: list[dict] = []

    def write(self, record: dict) -> None:
        if "eval" in record:
            self.evals.append(record["eval"])
            if self.events is not None:
                self.events.eval(record["eval"])
        if self.f is not None:
            self.f.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
            self.f.flush()

    def log(self, text: str) -> None:
        self.runlog(text)

    def note(self, text: str) -> None:
        """A line for train.log only (e.g. the error the failure policy prints itself)."""
        self.runlog.note(text)

    def step(self, record: dict) -> None:
        s, dt = record["step"], record["step_time_s"]
        cols = record.get("ranks")
        if isinstance(cols, dict) and cols:
            if "bytes_sent" in cols and cols["bytes_sent"]:
                self.bytes_sent += float(np.mean(cols["bytes_sent"]))
            record = self.at_scale(record, cols)
        if self.events is not None:
            self.events.step(record, cols)
        self.write(record)
        self.steps_done += 1
        self.samples_done += record.get("global_batch", 0)
        self.step_time += dt
        self.last_step = s
        self.interval.add(record["loss"], dt, record.get("global_batch", 0), first=s == self.first_step)
        if s % self.log_every == 0 or s == self.total or s == self.first_step:
            n, loss, rate, mean_dt = self.interval.take()
            per = self.interval.seconds_per_step()
            eta = "?" if per is None else format_duration(per * (self.total - s))
            over = f" (means of the {n} steps since the last line)" if n > 1 else ""
            tok = (f" ({rate * self.tokens_per_sample:,.0f} tokens/s)"
                   if self.tokens_per_sample and math.isfinite(rate) else "")
            self.log(f"step {s:>{len(str(self.total))}}/{self.total}  loss {loss:.4f}  "
                     f"lr {record['lr']:.3g}  {rate:,.0f} samples/s{tok}  "
                     f"{1e3 * mean_dt:.2f} ms/step  elapsed {format_duration(time.perf_counter() - self.t0)}  "
                     f"ETA {eta}{over}")

    def at_scale(self, record: dict, cols: dict) -> dict:
        """Above ``rank_lists_up_to`` ranks: the spread of every figure on every step, the
        per-rank lists only every ``rank_lists_every`` steps (and on the first and last)."""
        n = max((len(v) for v in cols.values() if isinstance(v, list)), default=0)
        if n <= self.rank_lists_up_to:
            return record
        record = {**record, "spread": spread_of(cols)}
        s = record["step"]
        if not (s % self.rank_lists_every == 0 or s in (self.first_step, self.total)):
            record.pop("ranks", None)
        return record

    def unflushed(self, pending: list, rows: list, why: str) -> int:
        """The writer is failing: write the steps it ran whose other ranks' figures were
        not gathered yet, as ``{"unflushed_step": s, ..., "rank0": {this rank's figures}}``
        (readers of ``"step"`` records skip them); returns how many."""
        for rec, row in zip(pending, rows):
            # "loss_part": this rank's share of the step's mean loss (local x local / global samples)
            mine = {("loss_part" if k == "loss" else k): v for k, v in row.items()}
            self.write({"unflushed_step": rec["step"], **{k: rec[k] for k in rec if k != "step"},
                        "why": why, "rank0": mine})
        return min(len(pending), len(rows))

    def summary(self, *, run_dir=None, checkpoint=None, extra=()) -> None:
        """The end of a run: what ran, how fast, what moved, the best evaluation, where things are."""
        wall = time.perf_counter() - self.t0
        if self.steps_done:
            first, last = self.first_step, self.last_step
            per = self.interval.seconds_per_step()
            rate = self.interval.run_samples / self.interval.run_time if self.interval.run_time > 0 else float("nan")
            tok = self.tokens_per_sample
            what = f"{self.samples_done:,.0f} samples" + (f" ({self.samples_done * tok:,.0f} tokens)" if tok else "")
            speed = (f"{rate:,.0f} samples/s" + (f" ({rate * tok:,.0f} tokens/s)" if tok else "")
                     if math.isfinite(rate) else "n/a")
            line = (f"summary: steps {first}-{last} of {self.total} in {format_duration(wall)} "
                    f"({format_duration(self.step_time)} in steps), {what}; {speed}"
                    + (f", {1e3 * per:.2f} ms/step" if per else "") + " after the first step")
            if self.bytes_sent:
                line += f"; {self.bytes_sent / 2**20:,.1f} MiB sent per rank"
            self.log(line)
        evals = [e for e in self.evals if e.get("loss") is not None and math.isfinite(e["loss"])]
        if evals:
            best = min(evals, key=lambda e: e["loss"])
            last = evals[-1]
            self.log(f"summary: eval loss {last['loss']:.4f} at step {last['step']} (accuracy "
                     f"{last['accuracy']:.4f}); best {best['loss']:.4f} at step {best['step']}")
        if run_dir is not None:
            where = [f"{run_dir}/" + name for name in ("train.log", "metrics.jsonl", "config.toml")]
            where += [str(x) for x in extra if x]
            if checkpoint:
                where.append(f"checkpoint {checkpoint}")
            self.log("summary: files " + ", ".join(where))

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        if self.events is not None:
            self.events.close()
            self.events = None
        self.runlog.close()


class FirstStepNotice:
    """A log line when the first step of a run is still running after ``after_s``
    seconds: it is compiling the kernels (numba, cached on disk for later runs)."""

    def __init__(self, log, after_s: float = 3.0):
        import threading

        self._t0 = time.perf_counter()
        self._timer = threading.Timer(after_s, self._say, args=(log,))
        self._timer.daemon = True
        self._timer.start()

    def _say(self, log) -> None:
        log(f"step 1 is still running after {time.perf_counter() - self._t0:.0f} s: the first step "
            "compiles the kernels (numba; cached on disk, so later runs start faster)")

    def cancel(self) -> None:
        self._timer.cancel()


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
