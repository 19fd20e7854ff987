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
with the world size (:meth:`Lasting.batch_after`, hpcdp.data.rescale).

Hybrid ZeRO (``parallel.zero.shard = "node"``): the failure domain is a node
(``Strategy.failure_domain``): the surviving ranks of a node that lost a rank leave
(one line each, status :data:`LEFT_STATUS`), the other nodes repair as above with each
shard taken from one of its replicas (``Strategy.replica_arrays``) and the strategy
rebuilds its node and cross-node channels on the survivors (ZeroStrategy.rejoin).
"""

from __future__ import annotations

import time

from hpcdp.comm import CommError

from .policy import note_step
from .ranks import fmt_ranks


LEFT_STATUS = 0  # a rank that leaves with its lost node (hybrid ZeRO): the job goes on without it


class RankLossEnds(CommError):
    """A lost rank that the repair cannot train around (the writer rank lost, fewer ranks
    than failure.min_world): raised on every survivor, which all end the job together
    (hpcdp.failure.policy.report_failure: under ULFM the launcher does not end a job on
    MPI_Abort). ``comm``: the shrunk communicator of exactly the ranks that raise it; its
    rank 0 (the lowest surviving rank) reports. ``step``: the step at which the loss was
    seen, agreed by the survivors (named by every rank alike)."""

    def __init__(self, message: str, survivors, comm=None, step=None):
        super().__init__(message)
        self.arrived = sorted(survivors)
        self.ending_comm = comm
        if step is not None:
            note_step(self, step)


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
        and every other error end the job as with "stop", every rank together
        (:meth:`end`); a survivor that is stuck during the repair ends it too (the
        shrink's timer, hpcdp.failure.ulfm.repair)."""
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
        from .ulfm import NoReplica, repair

        detect_s = time.perf_counter() - step_started
        strategy.abandon()
        others = self._others(world, metrics_comm, strategy, extra)
        state = [*strategy.replica_arrays(), *[a for _, a in sorted(optimizer.state_arrays().items())]]
        scalars = {"optimizer_steps": int(optimizer.steps)}
        domain = strategy.failure_domain()
        try:
            rep = repair(world.comm, others, committed, state, scalars, timeout=self.timeout, domain=domain,
                         reason=f"a rank was lost at step {step}: repairing ({type(e).__name__})", step=step)
        except NoReplica as err:
            raise RankLossEnds(f"a node was lost at step {err.at_step} and {err}: failure.on_rank_loss = "
                               "'continue' cannot redo the step; the job ends",
                               [r for i, r in enumerate(self.world_ranks) if i not in set(err.lost)],
                               err.comm, err.at_step) from None
        step = rep.at_step  # the step every survivor names (a rank may have seen the loss a step later)
        lost_launch = [self.world_ranks[r] for r in rep.lost]
        rep.dead_launch = [self.world_ranks[r] for r in rep.dead]
        alive = [r for i, r in enumerate(self.world_ranks) if i not in set(rep.dead)]  # the leaving too
        kept = len(self.world_ranks) - len(rep.lost)
        if 0 in lost_launch and 0 not in rep.dead_launch:  # hybrid ZeRO: rank 0's node is lost
            raise RankLossEnds(f"{fmt_ranks(rep.dead_launch)} of node 0 lost at step {step}: rank 0 (the writer "
                               "of metrics.jsonl and train.log) is on that node, which failure.on_rank_loss = "
                               "'continue' drops as a whole; the job ends", alive, rep.alive, step)
        if rep.leaving and kept < self.min_world:  # the kept ranks end the job: the leaving ones too
            raise RankLossEnds(f"{fmt_ranks(lost_launch)} lost at step {step}: {kept} rank(s) left, below "
                               f"failure.min_world = {self.min_world}; the job ends", alive, rep.alive, step)
        if rep.leaving:
            self.leave(rep, step, domain)
        optimizer.steps = scalars["optimizer_steps"]
        rep.domain = domain
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
                               self.world_ranks, new, step)
        if new.Get_size() < self.min_world:
            raise RankLossEnds(f"{fmt_ranks(lost_launch)} lost at step {step}: {new.Get_size()} rank(s) "
                               f"left, below failure.min_world = {self.min_world}; the job ends", self.world_ranks,
                               new, step)
        strategy.rejoin(self.world)
        finish_with(new)
        return rep

    @staticmethod
    def _others(world, metrics_comm, strategy, extra) -> list:
        """The communicators in use besides the world's, each once."""
        others = [] if metrics_comm is world.comm else [metrics_comm]
        return others + [c for c in [*extra, *strategy.comms()]
                         if c is not None and all(c is not o for o in [world.comm, *others])]

    def end(self, e, world, metrics_comm, step: int, strategy, extra=()) -> None:
        """This rank failed at ``step`` with ``e``, which is not a lost rank (a bug, a
        non-finite loss, a deadline that passed): end the job together (under ULFM an
        MPI_Abort would end this rank alone and the others would repair around it). This
        rank prints its traceback if ``e`` is a bug, then starts the repair with its line:
        every live rank raises hpcdp.failure.ulfm.Ending and they exit together with one
        line, this rank's (hpcdp.failure.policy.report_failure). Does not return."""
        from .policy import describe, failure_line, print_cause
        from .ulfm import repair

        note_step(e, step)
        print_cause(e)
        line, status = failure_line(e)
        why = describe(e)
        strategy.abandon()
        repair(world.comm, self._others(world, metrics_comm, strategy, extra), step - 1, [], {},
               timeout=self.timeout, domain=strategy.failure_domain(), step=step, ending=(why, line, status),
               reason=f"rank {self.world_ranks[world.rank]} failed at step {step}: ending the job "
                      f"({type(e).__name__})")
        raise AssertionError("unreachable: the repair raises Ending")  # pragma: no cover

    def batch_after(self, rep, before: int) -> int:
        """The global batch from the redone step on (``rep.step`` steps are committed),
        given the one ``before``; noted as ``rep.batch_before`` / ``rep.batch_after``.
        "keep": ``before``; "scale": the per-rank batch kept, ``before / size_before *
        size_after`` (a multiple of the launch world size was required at setup,
        hpcdp.train; the loop re-splits the rest of the epoch: hpcdp.data.rescale)."""
        after = before if self.batch == "keep" else before // rep.size_before * rep.comm.Get_size()
        rep.batch_before, rep.batch_after = before, after
        return after

    def leave(self, rep, step: int, domain) -> None:
        """This rank's node lost a rank (hybrid ZeRO): the other nodes hold every shard and
        go on without this node; this rank says so in one line and ends itself with
        :data:`LEFT_STATUS` (``os._exit``: nothing collective is left to run)."""
        import os

        from .ranks import drain_output, say

        rank = self.world_ranks[self.world.rank]
        dead = [self.world_ranks[r] for r in rep.dead]
        say(f"hpcdp: rank {rank} leaves at step {step}: {fmt_ranks(dead)} of its node (node {domain[0]}) "
            "lost; the other nodes hold the same shards and go on without this node "
            f'(failure.on_rank_loss = "continue"); ending this rank with status {LEFT_STATUS}')
        drain_output()
        os._exit(LEFT_STATUS)

    def record(self, rep, step: int) -> dict:
        """The metrics.jsonl record of a repair (``left_ranks``, ``lost_nodes``: hybrid ZeRO's
        ranks that left with their node, and those nodes' indices before the repair)."""
        extra = {"left_ranks": [r for r in rep.lost_launch if r not in set(rep.dead_launch)],
                 "lost_nodes": rep.domains_lost} if rep.domain is not None else {}
        return {"step": step, "lost_ranks": rep.lost_launch, **extra, "world_before": rep.size_before,
                "world_after": rep.comm.Get_size(), "committed_step": rep.step, "redo_step": rep.step + 1,
                "global_batch_before": getattr(rep, "batch_before", None),
                "global_batch_after": getattr(rep, "batch_after", None),
                "detect_s": round(rep.detect_s, 4), "repair_s": round(rep.repair_s, 4),
                "weights_hash": rep.weights_hash, "source_rank": rep.source, "rounds": rep.rounds,
                "at": time.time()}

    @staticmethod
    def batch_words(rep) -> str:
        before, after = getattr(rep, "batch_before", None), getattr(rep, "batch_after", None)
        if before is None or before == after:
            return "with the same global batch"  # its size: the repair record's global_batch_after
        return f"with global batch {after} (was {before}; failure.batch = 'scale': the same per-rank batch)"

    def line(self, rep, step: int) -> str:
        left = sorted(set(rep.lost_launch) - set(rep.dead_launch))
        who = (f"{fmt_ranks(rep.dead_launch)} lost at step {step}"
               + (f" (node{'s' if len(rep.domains_lost) > 1 else ''} {', '.join(map(str, rep.domains_lost))} "
                  f"left, with {fmt_ranks(left)})" if left else ""))
        return (f"repair: {who}; {rep.size_before} -> "
                f"{rep.comm.Get_size()} ranks; last committed step {rep.step}, redoing step {rep.step + 1} "
                f"{self.batch_words(rep)}; detected in {rep.detect_s:.2f}s, repaired in "
                f"{rep.repair_s:.2f}s; replicas equal (hash {rep.weights_hash[:12]})")


__all__ = ["Lasting", "RankLossEnds", "LEFT_STATUS"]

