"""Checkpoints inside a training run: what ``train.py`` calls, and nothing more.

    ckpt = Checkpointer(cfg, world=..., strategy=..., model=..., optimizer=...,
                        sampler=..., total=..., run_dir=..., resume=...)
    start = ckpt.restore(log)            # 0, or the step the checkpoint was taken at
    for step in range(start + 1, total + 1):
        ... one training step ...
        if ckpt.after_step(step):        # saves every K steps, after the last step,
            break                        # and on SIGTERM/SIGUSR1 (then returns True)
    ckpt.close()                         # waits for an asynchronous save

Every rank calls every method at the same steps. The checkpoint's traffic runs on
communicators of its own (duplicates of the world's), so it never matches a
strategy's messages, and the asynchronous save's thread never shares one with
the training thread (its rank file is written by a helper process: writerproc.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .errors import AGREEMENT, CheckpointError, SaveFailed
from .stop import GracefulStop, signal_name


class Checkpointer:
    def __init__(self, cfg, *, world, strategy, model, optimizer, sampler, total: int, run_dir,
                 resume: str | None = None):
        self.cfg, self.c = cfg, cfg.checkpoint
        self.world, self.strategy, self.model = world, strategy, model
        self.flat, self.optimizer, self.sampler = model.flat, optimizer, sampler
        self.total, self.run_dir, self.resume_target = total, Path(run_dir), resume
        self.enabled = self.c.enabled
        self.root = Path(self.c.dir) if self.c.dir else self.run_dir / "checkpoints"
        self.timeout = float(cfg.comm.timeout)
        from .format.checksum import hash_threads
        self.threads = hash_threads(getattr(world, "local_size", 1))  # this rank's share of the node
        self.last_saved = -1
        self.saving = None  # the step of a save started and not yet complete (continue mode's repair)
        # who writes: this job (a fresh id) and its training run's lineage (the id of the
        # job that started it; a --resume carries it on). A save never replaces, and a
        # job never writes beside, a complete checkpoint of another lineage (format.commit).
        import uuid
        self.job_id = self.lineage = uuid.uuid4().hex[:16]
        self.stopped_by = 0
        self.saved_path: Path | None = None
        self.log = lambda _msg: None
        self.comm = self.stop = self.background = self.buffers = self.writer = None
        if not (self.enabled or resume):
            return
        if not hasattr(strategy, "checkpoint_pieces"):
            raise CheckpointError(f"parallel.strategy = {cfg.parallel.strategy!r} does not support "
                                  "checkpoints yet")
        check = getattr(strategy, "checkpoint_check", None)
        if check is not None:
            check()  # a configuration the strategy cannot checkpoint: refused on every rank
        from .format.layouts import get_layout
        get_layout(self.c.layout).check_available()  # e.g. "shared" without parallel HDF5
        from hpcdp.failure.deadline import idup
        what = "the other ranks to set up checkpointing"
        self.comm = idup(world.comm, self.timeout, what)  # the checkpoint's own traffic
        if self.enabled and self.c.on_signal:
            self.stop = self._graceful_stop(idup(world.comm, self.timeout, what))
        if self.c.asynchronous:
            from .save.background import BackgroundSaver
            from .save.hostbuf import HostBuffers
            self.background = BackgroundSaver()
            self.buffers = HostBuffers()  # the snapshot's home, reused by every save
            separate = getattr(get_layout(self.c.layout), "separate_writer", False)  # needs no MPI
            if self.c.writer == "process" and separate and self.buffers.fd is not None:
                from .save.writerproc import WriterProcess
                self.writer = WriterProcess(self.buffers)
                if self.enabled:
                    self.writer.start()

    def _graceful_stop(self, comm) -> GracefulStop:
        """The stop decision is made every step by the ranks that run steps: with
        dedicated parameter servers (``strategy.is_worker`` False there), on a
        communicator of the workers only. A server keeps the signal handlers (so a
        signal does not kill it), tells the workers of a signal that reached it
        (``comm`` stays as the notices' communicator: :meth:`serve_poll`), and learns
        of the stop from the workers' save request and their done."""
        import numpy as np
        from mpi4py import MPI

        from hpcdp.comm import allreduce, forget

        workers = np.zeros(comm.Get_size(), dtype=np.int64)
        workers[comm.Get_rank()] = int(self.strategy.is_worker)
        allreduce(workers, comm=comm, op="sum", timeout=self.timeout)  # deadline, failure policy
        if workers.all():
            return GracefulStop(comm, timeout=self.timeout)
        from hpcdp.failure.deadline import watchdog
        with watchdog(self.timeout, "splitting off the workers' stop communicator"):
            sub = comm.Split(0 if self.strategy.is_worker else MPI.UNDEFINED, comm.Get_rank())
        forget(comm)  # hpcdp's duplicates of it; it carries only notices from here on
        deciders = [int(r) for r in np.flatnonzero(workers)]
        return GracefulStop(sub if self.strategy.is_worker else None, timeout=self.timeout,
                            notices=comm, deciders=deciders)

    def serve_poll(self) -> None:
        """A dedicated server's serve loop, now and then: pass a stop signal that
        reached this rank on to the workers, which decide."""
        if self.stop is not None:
            self.stop.forward()

    # -- what a checkpoint of this run holds -------------------------------------
    def expected(self) -> dict:
        from .format.runstate import expected_tensors
        extra = getattr(self.strategy, "checkpoint_buffers", None)  # e.g. DiLoCo's replicas
        return expected_tensors(self.flat, self.optimizer, extra() if extra is not None else ())

    def _state(self, step: int, rank_arrays: dict) -> tuple[dict, dict, dict]:
        from hpcdp.config import dump_toml
        from hpcdp.optim import lr_at

        from hpcdp.data.rescale import schedule_text

        from .format.runstate import hpcdp_version

        next_epoch, next_batch = self.sampler.position(step)
        s = self.sampler
        state = {
            "step": step, "next_epoch": next_epoch, "next_batch": next_batch,
            "global_batch": s.global_batch, "n_train": s.n, "batches_per_epoch": s.batches_per_epoch,
            "batch_schedule": schedule_text(s),  # the global batch from each step on (data.rescale)
            "data_seed": s.seed, "last_batch": getattr(s, "last_batch", "drop"),
            "total_steps": self.total, "lr": lr_at(self.cfg.optim, max(step, 1), self.total),
            "lr_schedule": self.cfg.optim.schedule, "warmup_steps": self.cfg.optim.warmup_steps,
            "optimizer_kind": self.optimizer.kind,
            "optimizer_steps": int(rank_arrays["optimizer_steps"].max()),
            "strategy": self.cfg.parallel.strategy, "world_size": self.world.size,
            "dp_size": self.strategy.dp_size, "dtype": self.cfg.run.dtype,
        }
        arrays = {f"rank_{k}": v for k, v in rank_arrays.items()}
        attrs = {"hpcdp_version": hpcdp_version(), "strategy": self.cfg.parallel.strategy,
                 "world_size": self.world.size, "config": dump_toml(self.cfg.to_dict()),
                 "job_id": self.job_id, "lineage": self.lineage, "run_dir": str(self.run_dir)}
        return attrs, state, arrays

    # -- restore -----------------------------------------------------------------
    def restore(self, log=None) -> int:
        """Load ``resume`` (if given) into model, optimizer, strategy and run state;
        returns the step to continue after (0 without resume)."""
        if log is not None:
            self.log = log
        if not self.resume_target:
            self._check_folder()
            return 0
        from .format.commit import resolve
        from .restore.load import load

        latest_root = Path(self.c.dir) if self.c.dir else None
        path = Path(AGREEMENT.on_root(self.comm, lambda: str(resolve(self.resume_target, latest_root)),
                                      timeout=self.timeout))
        t0 = time.perf_counter()
        saved = getattr(self.strategy, "checkpoint_saved", None)
        if saved is not None:  # a strategy whose targets depend on what was saved (DiLoCo)
            import json
            from .format.runstate import saved_summary
            saved(json.loads(AGREEMENT.on_root(self.comm, lambda: saved_summary(path), timeout=self.timeout)))
        targets = self.strategy.checkpoint_targets()
        index, nbytes = load(path, targets, self.flat.layout, self.expected(), self.optimizer.kind,
                             self.comm, backend=self.flat.backend, timeout=self.timeout, threads=self.threads)
        self._check_run_state(index, path)
        self.strategy.checkpoint_restored()
        note = getattr(self.strategy, "restore_note", None)
        if note is not None:
            self.log(note())
        self.optimizer.steps = int(index.state.get("optimizer_steps", 0))
        step = index.step
        self.lineage = str(index.attrs.get("lineage") or self.lineage)  # this run goes on
        self._check_folder()
        self.last_saved = step
        saved_total = int(index.state.get("total_steps", self.total))
        self.log(f"resumed from {path}: step {step} (epoch {index.state.get('next_epoch')}, written by "
                 f"{index.attrs.get('world_size')} rank(s) under {index.attrs.get('strategy')!r}, layout "
                 f"{index.attrs.get('layout')}); read {nbytes / 2**20:.1f} MiB on rank 0 in "
                 f"{time.perf_counter() - t0:.2f} s"
                 + (f"; note: train.steps is now {self.total} (was {saved_total}): the learning-rate "
                    "schedule follows the new length" if saved_total != self.total else ""))
        if step >= self.total:
            self.log(f"the checkpoint is at step {step} and train.steps/epochs give {self.total}: "
                     "nothing left to train")
        return step

    def _check_folder(self) -> None:
        """Rank 0, before the first step: the checkpoint folder holds no complete
        checkpoint of another training run (this job's saves would replace or mix with
        it). Newest first, the first found is named."""
        if not self.enabled or self.comm is None:
            return

        AGREEMENT.on_root(self.comm, lambda: check_folder(self.root, self.lineage), timeout=self.timeout,
                          share=False)

    def _check_run_state(self, index, path) -> None:
        check_run_state(index, path, self.sampler, scale=self.cfg.failure.batch == "scale")

    # -- save ----------------------------------------------------------------------
    def after_step(self, step: int) -> bool:
        """Save if due; True when the run must stop now (a signal; saved first)."""
        if self.comm is None:
            return False
        self._collect_background(at=step)
        signum = self.stop.poll() if self.stop is not None else 0
        if not self.enabled:
            return False
        due = self._due(step)
        if signum or due:
            if step != self.last_saved:
                try:
                    self.save(step, wait=bool(signum))
                except SaveFailed as e:  # a periodic save: on_save_error says; others always end the run
                    if signum or step == self.total:
                        raise
                    self._save_failed(e, step)
            elif signum and self.background is not None:
                self._collect_background(wait=True, at=step)
        if signum:
            self.stopped_by = signum
            where = self.saved_path or self.root
            by = self.stop.decided_by
            reached = f" (received by rank {by})" if by is not None else ""
            self.log(f"stopped by {signal_name(signum)}{reached} after step {step}: checkpoint saved in {where}; "
                     f"resume with --resume {where}")
            if self.world.rank == 0:
                (self.run_dir / "stopped").write_text(f"{signal_name(signum)} {step} {where}\n")
            return True
        return False

    def _due(self, step: int) -> bool:
        """A checkpoint is due after ``step`` (every K steps, the last step)."""
        return bool((self.c.every and step % self.c.every == 0) or (step == self.total and self.c.final))

    def _save_failed(self, e: SaveFailed, step: int) -> None:
        """A periodic save failed on every rank (its agreement says so): with
        ``checkpoint.on_save_error = "continue"`` say so and train on; else stop now."""
        latest = self.saved_path or "none yet"
        if self.c.on_save_error != "continue":
            raise SaveFailed(f"{e}; the run stops after step {step} (checkpoint.on_save_error = \"stop\"; "
                             f"\"continue\" trains on and tries again at the next save); the latest complete "
                             f"checkpoint: {latest}") from e
        nxt = (step // self.c.every + 1) * self.c.every if self.c.every else self.total
        self.log(f"warning: {e}; training goes on (checkpoint.on_save_error = \"continue\"): the next save is "
                 f"at step {min(nxt, self.total)}; the latest complete checkpoint: {latest}")

    def save(self, step: int, *, wait: bool = False) -> None:
        from .save.save import SaveJob, rank_scalar_arrays, save
        from .save.snapshot import take_snapshot

        if self.background is not None:
            self._collect_background(wait=True, at=step)
        t0 = time.perf_counter()
        asynchronous = self.background is not None and not wait
        begin = getattr(self.strategy, "checkpoint_begin", None)
        if begin is not None:  # e.g. PS workers ask the dedicated servers to save too
            begin(step, wait)
        pieces = self.strategy.checkpoint_pieces()
        snap = take_snapshot(pieces, self.flat.layout, self.flat.backend, copy=False)
        if asynchronous:  # the one copy: into the reusable, page-aligned buffers
            snap, _ = self.buffers.copy(snap)
        scalars = self.strategy.checkpoint_scalars()
        writer = self.writer.write_rank_file if asynchronous and self.writer else None

        def job():
            # the one small agreement of the run state: in the background for an
            # asynchronous save (it would wait here for the slowest rank)
            rank_arrays = rank_scalar_arrays(self.comm, scalars, timeout=self.timeout)
            attrs, state, arrays = self._state(step, rank_arrays)
            # a background save hashes on the cores training leaves free (one is training's)
            threads = max(1, self.threads - 1) if asynchronous else self.threads
            return SaveJob(self.root, step, snap, self.expected(), attrs, state, arrays, layout=self.c.layout,
                           keep=self.c.keep, threads=threads, writer=writer, guard=self._guard)
        self.last_saved = self.saving = step
        if asynchronous:
            self._async_step, self._async_bytes = step, snap.nbytes
            self.background.submit(lambda: self._failed_as_save(step, lambda: save(job(), self.comm,
                                                                                  timeout=self.timeout)))
            self.last_stall_s = time.perf_counter() - t0
            self.log(f"checkpoint step {step}: {snap.nbytes / 2**20:.1f} MiB copied on rank 0 in "
                     f"{self.last_stall_s:.3f} s, writing in the background")
            return
        self.saved_path = self._failed_as_save(step, lambda: save(job(), self.comm, timeout=self.timeout))
        self.saving = None
        self.last_stall_s = time.perf_counter() - t0
        self.log(f"checkpoint step {step}: saved {self.saved_path} ({snap.nbytes / 2**20:.1f} MiB from "
                 f"rank 0) in {self.last_stall_s:.3f} s")

    def _guard(self) -> None:
        from .lock import check_held
        check_held(self.root)  # still this job's folder (its lock not taken over)

    def _failed_as_save(self, step: int, fn):
        """Run a save; its failure (agreed by every rank) becomes one :class:`SaveFailed`
        that says which save failed and why (exit status 1: the run failed, the input
        was fine)."""
        try:
            return fn()
        except SaveFailed:
            raise
        except (CheckpointError, OSError) as e:
            from .errors import os_error_text
            why = os_error_text(e) if isinstance(e, OSError) else str(e)
            raise SaveFailed(f"the checkpoint of step {step} could not be saved in {self.root}: {why}") from e

    def _collect_background(self, wait: bool = False, at: int | None = None) -> None:
        """Log a finished background save; one that failed is said at once (the step
        after it failed): ``on_save_error`` then stops the run or trains on."""
        b = self.background
        if b is None or not b.pending() or (b.busy() and not wait):
            return
        try:
            path = b.wait()
        except SaveFailed as e:
            if at is None or self._async_step == self.total:
                raise
            self._save_failed(SaveFailed(f"{e} (written in the background)"), at)
            return
        self.saved_path, self.saving = path, None
        self.log(f"checkpoint step {self._async_step}: saved {self.saved_path} in the background "
                 f"({b.finished_at - b.started_at:.3f} s after the copy)")

    # -- failure.on_rank_loss = "continue" (hpcdp.failure.lasting) ------------------
    def comms(self) -> list:
        """The communicators this checkpointer uses (a repair revokes them)."""
        out = [self.comm] + ([self.stop.comm, self.stop.notices] if self.stop is not None else [])
        return list({id(c): c for c in out if c is not None}.values())

    def follow(self, sampler, total: int) -> None:
        """After a repair: the data sampler in effect (its global batch may have changed:
        failure.batch = "scale"; the checkpoints record its schedule) and the run's step count."""
        self.sampler, self.total = sampler, total

    def rejoin(self, world, committed: int | None = None) -> int | None:
        """After a repair: the survivors' ``world`` replaces the old one (its
        communicators were revoked and are forgotten, not freed). A save that was in
        flight failed with the lost rank (its temporary folder is never listed: no
        marker); returns its step, or None, so that the caller saves the agreed step
        again on the survivors. ``committed`` (the agreed step): when its save was due
        and the loss came before any survivor started it (e.g. in the step's replica
        check), that step is returned too. Collective over the survivors."""
        from hpcdp.comm import forget
        from hpcdp.failure.deadline import idup

        unfinished = self.saving
        if self.background is not None and self.background.pending():
            try:
                self.saved_path, unfinished = self.background.wait(), None  # it completed before the loss
            except Exception:  # noqa: BLE001 - it failed with the lost rank: saved again by the caller
                pass
        for c in self.comms():
            forget(c, free=False)
        if self.stop is not None:
            try:
                self.stop.close(wait=False)
            except Exception:  # noqa: BLE001 - its requests were on the revoked communicator
                pass
            self.stop = None
        self.world, self.saving = world, None
        if self.comm is None:
            return None
        what = "the other survivors to set up checkpointing again"
        self.comm = idup(world.comm, self.timeout, what)
        if self.enabled and self.c.on_signal:
            self.stop = self._graceful_stop(idup(world.comm, self.timeout, what))
        import numpy as np

        from hpcdp.comm import allreduce
        seen = np.array([-1 if unfinished is None else unfinished], dtype=np.int64)
        allreduce(seen, comm=self.comm, op="max", timeout=self.timeout)  # one rank's failed save is everyone's
        if seen[0] >= 0:
            return int(seen[0])
        if committed is None or committed < 1 or not self.enabled or not self._due(committed):
            return None
        low = np.array([self.last_saved], dtype=np.int64)
        allreduce(low, comm=self.comm, op="min", timeout=self.timeout)
        return committed if low[0] < committed else None

    def close(self, abandon: bool = False) -> None:
        """Wait for a background save, stop listening to signals, free communicators.
        Idempotent. ``abandon=True`` (training failed): wait for nothing, since the
        other ranks may be gone; only the signal handlers are given back."""
        try:
            if self.background is not None and not abandon:
                self._collect_background(wait=True)
        finally:
            if self.writer is not None:
                self.writer.close(abandon=abandon)
                self.writer = None
            if self.buffers is not None and not (self.background and self.background.busy()):
                self.buffers.close()
                self.buffers = None
            if self.stop is not None:
                self.stop.close(wait=not abandon)
                if not abandon:
                    for c in {id(c): c for c in (self.stop.comm, self.stop.notices) if c is not None}.values():
                        c.Free()
                self.stop = None
            if self.comm is not None and not abandon:
                self.comm.Free()
            self.comm = None


__all__ = ["Checkpointer"]


def check_folder(root, lineage: str | None) -> None:
    """Checkpoint folder ``root`` holds no complete checkpoint of a training run other
    than ``lineage`` (a job's saves would replace or mix with it: ``latest`` and
    ``keep`` would choose among both runs'). Newest first; the first found is named."""
    from .format.commit import foreign_problem, list_checkpoints
    for _, path, ok in reversed(list_checkpoints(root)):
        problem = ok and foreign_problem(path, lineage, "would save beside it (or replace it)")
        if problem:
            raise CheckpointError(problem)


def check_run_state(index, path, sampler, scale: bool = False) -> None:
    """The data position of checkpoint ``index`` must carry over to this run's sampler.
    ``scale`` (failure.batch = "scale"): the global batch follows the checkpoint's per-rank
    batch (:func:`resumed_batches`), so it is not compared."""
    s, st = sampler, index.state
    keys = [("n_train", s.n, "the training set size"), ("data_seed", s.seed, "data.seed")]
    if not scale:
        keys.insert(0, ("global_batch", s.global_batch, "train.global_batch"))
    if not scale and "batch_schedule" in st and len(json.loads(st["batch_schedule"])) > 1:
        raise CheckpointError(f"checkpoint {path}: its job changed the global batch after a lost rank "
                              f"(batch schedule {st['batch_schedule']}): resume it with failure.on_rank_loss = "
                              "'continue' and failure.batch = 'scale', which carry that schedule over")
    for key, mine, name in keys:
        if key in st and int(st[key]) != int(mine):
            raise CheckpointError(f"checkpoint {path}: {name} is {mine} in this run, {st[key]} in the "
                                  "checkpoint: the data position would not carry over; use the "
                                  "checkpoint's value (its config is in `hpcdp ckpt info`)")


def resumed_batches(resume, cfg, base, dp_size: int):
    """``failure.batch = "scale"`` and ``--resume``: the sampler that goes on from the
    checkpoint, on every rank before the run starts. The checkpoint's batch schedule
    (``batch_schedule``: its global batch changed at a repair) carries over, and each rank
    keeps the checkpoint's per-rank batch: on ``dp_size`` ranks the global batch is the
    checkpoint's ``global_batch / dp_size_ckpt * dp_size``, changed at the checkpoint's
    step when that differs (the rest of the epoch re-split: hpcdp.data.rescale).
    Returns ``(sampler, line)``: ``line`` says the change, or is None."""
    from hpcdp.data.rescale import from_schedule, parse_schedule, rescaled

    from .format.commit import resolve
    from .format.index import read_index

    path = resolve(resume, cfg.checkpoint.dir or None)
    st = read_index(path).state
    g_ckpt = int(st.get("global_batch", base.global_batch))
    try:
        rows = parse_schedule(st.get("batch_schedule", json.dumps([[0, g_ckpt]])))
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: {e}: the index is damaged or was edited") from None
    ranks = int(st.get("dp_size", st.get("world_size", dp_size)))
    per_rank, rest = divmod(g_ckpt, ranks)
    if rest:
        raise CheckpointError(f"checkpoint {path}: failure.batch = 'scale' keeps each rank's batch, but the "
                              f"checkpoint's global batch of {g_ckpt} samples over its {ranks} ranks is not a "
                              "whole number per rank: set failure.batch = 'keep' (and train.global_batch = "
                              f"{g_ckpt}) to resume it")
    sampler = from_schedule(base, rows)
    step = int(st.get("step", 0))
    want = per_rank * dp_size
    if want == sampler.global_batch:
        return sampler, None
    line = (f"failure.batch = 'scale': the checkpoint's {per_rank} samples per rank on {dp_size} ranks: "
            f"global batch {want} from step {step + 1} (was {g_ckpt} on {ranks} ranks); the rest of the "
            "epoch is re-split at it")
    return rescaled(sampler, step, want), line


def check_resume_target(resume, cfg, flat, optimizer, sampler) -> None:
    """Before the run directory is made (world rank 0, inside the setup agreement, so
    every rank stops with the same one line and status 2): the ``--resume`` checkpoint
    holds this model's tensors and optimizer state and its data position carries over.
    Reads the index only; :meth:`Checkpointer.restore` checks again as it loads."""
    from .format.commit import resolve
    from .format.index import read_index
    from .format.runstate import compatibility_problem, expected_tensors

    path = resolve(resume, cfg.checkpoint.dir or None)
    index = read_index(path)
    problem = compatibility_problem(index, expected_tensors(flat, optimizer), optimizer.kind)
    if problem:
        raise CheckpointError(f"checkpoint {path}: {problem}")
    check_run_state(index, path, sampler, scale=cfg.failure.batch == "scale")
