"""What hpcdp does when something goes wrong: a failure on any rank ends the job on
every rank, within seconds, with its cause (docs/user-guide.md, "When things go wrong").

- :mod:`.agreement`: every rank reports ok or its error through a deadline-bounded
  exchange and all raise the same error together: before training a
  :class:`~.agreement.JobError`, after each phase of a checkpoint save or restore a
  CheckpointError (the one agreement helper; hpcdp.io uses it).
- :mod:`.skew`: ranks that resolved different configs (or data) are named.
- :mod:`.policy`: what ``hpcdp train`` does with a failure: status 2 on every rank
  for an agreed one, else the failing rank prints its cause and calls MPI_Abort.
- :mod:`.deadline`: a deadline on every MPI call hpcdp makes outside hpcdp.comm.
- :mod:`.signals`: SIGINT / SIGTERM / SIGUSR1, and the graceful-stop hook.
- :mod:`.nonfinite`: ``train.on_nonfinite`` ("stop" | "skip").
- :mod:`.inject`: the ``HPCDP_FAULT`` test hook.
- :mod:`.watch`: a watcher process per rank names a rank killed by a signal (SIGKILL).
- :mod:`.steps`: the few calls the training loop makes into all of the above.

Submodules are imported on use: importing this package starts nothing (no MPI).
"""
