"""The training loop's side of ``failure.on_rank_loss = "continue"``: which errors are a
lost rank, the repair (hpcdp.failure.ulfm) and what the loop rebuilds, the log line and
the metrics record of each repair.

The loop keeps ``committed`` (the last step whose update this rank applied) and, on an
error that :meth:`Lasting.repairable` accepts, calls :meth:`Lasting.repair`: the
survivors revoke, shrink, agree on the last committed step and take one replica's
state; the strategy rejoins on the survivors' communicator (DDP.rejoin), hpcdp.comm
forgets the old communicators, and the loop re-splits the data and redoes the step
after the agreed one: with ``failure.batch = "keep"`` the same global batch over fewer
ranks, with ``"scale"`` each survivor's batch unchanged, so the global batch shrinks
with the world size (:meth:`Lasting.sampler_after`, hpcdp.data.rescale).
"""

from __future__ import annotations

import time


from hpcdp.comm import CommError

from .ranks import fmt_ranks


class RankLossEnds(CommError):
    """A lost rank that the repair cannot train around (the writer rank lost, fewer ranks
    than failure.min_world): raised on every survivor; the lowest of them reports it
    (``arrived``, hpcdp.failure.policy.reporter), the job ends as with "stop"."""

    def __init__(self, message: str, survivors):
        super().__init__(message)
        self.arrived = sorted(survivors)


class Lasting:
    """One run's repairs (``cfg.failure``), made on every rank at the start of training."""

    def __init__(self, cfg, world, comms=()):
        """``comms``: further communicators the loop uses (errors returned on them too).
        The MPI's ULFM was checked during setup (hpcdp.failure.ulfm.check_available)."""
        from mpi4py import MPI

        self.min_world = cfg.failure.min_world
        self.batch = cfg.failure.batch  # "keep" | "scale"
        self.timeout = cfg.comm.timeout
        self.world = world
        self.world_ranks = list(range(world.size))  # current rank -> rank at launch
        self.repairs = 0
        MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)  # an error reaches the loop, not an abort
        for c in (world.comm, *comms):
            c.Set_errhandler(MPI.ERRORS_RETURN)

    def repairable(self, e: BaseException) -> bool:
        """A lost rank, as MPI reports it: an MPI error (``MPI_ERR_PROC_FAILED``,
        ``MPI_ERR_REVOKED`` once a survivor revoked, ``MPI_ERR_IN_STATUS`` of a
        multi-request test...) from hpcdp's collectives (MPIError) or a plain MPI call.
        A deadline that passed (a stuck rank: alive, so the shrink would wait for it)
        and every other error end the job as with "stop"; a survivor that is stuck
        during the repair ends it too (the shrink's timer, hpcdp.failure.ulfm.repair)."""
        from mpi4py import MPI

        from hpcdp.comm import MPIError

        seen = set()
        while e is not None and id(e) not in seen:  # a save's failure carries the MPI error as its cause
            if isinstance(e, (MPIError, MPI.Exception)):
                return True
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return False

    def repair(self, e, world, metrics_comm, committed: int, step: int, flat, optimizer, strategy,
               step_started: float, extra=()):
        """Repair around the lost ranks; rebinds ``self.world``; returns the Repaired.
        ``step_started``: ``time.perf_counter()`` at the start of the failed step (its
        detection time is counted from there); ``extra``: further communicators in use
        (e.g. exact mode's), revoked and forgotten with the others (the caller rebuilds
        what used them)."""
        from hpcdp import comm as hcomm
        from hpcdp.world import World

        from .shutdown import finish_with
        from .ulfm import repair

        t_err = time.monotonic()
        detect_s = time.perf_counter() - step_started
        strategy.abandon()
        others = [] if metrics_comm is world.comm else [metrics_comm]
        others += [c for c in extra if c is not None and all(c is not o for o in [world.comm, *others])]
        state = [flat.data, *[a for _, a in sorted(optimizer.state_arrays().items())]]
        scalars = {"optimizer_steps": int(optimizer.steps)}
        rep = repair(world.comm, others, committed, state, scalars, timeout=self.timeout,
                     reason=f"a rank was lost at step {step}: repairing ({type(e).__name__})")
        optimizer.steps = scalars["optimizer_steps"]
        lost_launch = [self.world_ranks[r] for r in rep.lost]
        self.world_ranks = [r for i, r in enumerate(self.world_ranks) if i not in set(rep.lost)]
        for c in [world.comm, *others]:
            hcomm.forget(c, free=False)  # revoked: freeing could block
        new = rep.comm
        self.world = World(comm=new, rank=new.Get_rank(), size=new.Get_size(), device=world.device,
                           ledger=world.ledger)
        rep.lost_launch = lost_launch
        rep.detect_s = detect_s
        self.repairs += 1
        if 0 in lost_launch:
            raise RankLossEnds(f"rank 0 (the writer of metrics.jsonl and train.log) was lost at step "
                               f"{step}: failure.on_rank_loss = 'continue' needs it to live; the job ends",
                               self.world_ranks)
        if new.Get_size() < self.min_world:
            raise RankLossEnds(f"{fmt_ranks(lost_launch)} lost at step {step}: {new.Get_size()} rank(s) "
                               f"left, below failure.min_world = {self.min_world}; the job ends", self.world_ranks)
        strategy.rejoin(self.world)
        finish_with(new)
        return rep

    def batch_after(self, rep, before: int) -> int:
        """The global batch from the redone step on (``rep.step`` steps are committed),
        given the one ``before``; noted as ``rep.batch_before`` / ``rep.batch_after``.
        "keep": ``before``; "scale": the per-rank batch kept, ``before / size_before *
        size_after`` (a multiple of the launch world size was required at setup,
        hpcdp.train; the loop re-splits the rest of the epoch: hpcdp.data.rescale)."""
        after = before if self.batch == "keep" else before // rep.size_before * rep.comm.Get_size()
        rep.batch_before, rep.batch_after = before, after
        return after

    def record(self, rep, step: int) -> dict:
        """The metrics.jsonl record of a repair."""
        return {"step": step, "lost_ranks": rep.lost_launch, "world_before": rep.size_before,
                "world_after": rep.comm.Get_size(), "committed_step": rep.step, "redo_step": rep.step + 1,
                "global_batch_before": getattr(rep, "batch_before", None),
                "global_batch_after": getattr(rep, "batch_after", None),
                "detect_s": round(rep.detect_s, 4), "repair_s": round(rep.repair_s, 4),
                "weights_hash": rep.weights_hash, "source_rank": rep.source, "at": time.time()}

    @staticmethod
    def batch_words(rep) -> str:
        before, after = getattr(rep, "batch_before", None), getattr(rep, "batch_after", None)
        if before is None or before == after:
            return "with the same global batch"  # its size: the repair record's global_batch_after
        return f"with global batch {after} (was {before}; failure.batch = 'scale': the same per-rank batch)"

    def line(self, rep, step: int) -> str:
        return (f"repair: {fmt_ranks(rep.lost_launch)} lost at step {step}; {rep.size_before} -> "
                f"{rep.comm.Get_size()} ranks; last committed step {rep.step}, redoing step {rep.step + 1} "
                f"{self.batch_words(rep)}; detected in {rep.detect_s:.2f}s, repaired in "
                f"{rep.repair_s:.2f}s; replicas equal (hash {rep.weights_hash[:12]})")


__all__ = ["Lasting", "RankLossEnds"]

