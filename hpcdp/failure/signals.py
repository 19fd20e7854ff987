"""Signals during ``hpcdp train``: the one place they are handled.

SIGINT (Ctrl-C), SIGTERM (the launcher or the scheduler ending the job) and SIGUSR1
(a scheduler's early warning, e.g. ``sbatch --signal=USR1@60``) raise
:class:`Interrupted` in the main thread, wherever the rank is: every wait in hpcdp
polls, so the handler runs within milliseconds. :mod:`hpcdp.failure.policy` then
prints one line naming the rank and the signal and ends the job.

A **graceful stop** changes that: code that can stop cleanly (checkpointing:
finish the step, save, exit 0) registers a handler with :func:`on_stop_signal`.
When a signal arrives, the registered handlers are called newest first with the
signal number; the first that returns True takes the signal and nothing is raised.
Handlers run inside the signal handler: they should only set a flag that the
training loop reads at the end of its step.

The handlers are installed only by the ``hpcdp train`` command
(:func:`handling_signals`), never by importing hpcdp: a library must not take a
program's signals.
"""

from __future__ import annotations

import contextlib
import signal

STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGUSR1"))
                     if s is not None)
# Exit status of a job ended by a signal: 128 + signal number, the shell convention.
EXIT_BASE = 128

# Signals are per process, so is this list (newest last).
_graceful: list = []


class Interrupted(KeyboardInterrupt):
    """A stop signal reached this rank (and no graceful-stop handler took it)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        return EXIT_BASE + self.signum


def on_stop_signal(handler):
    """Register ``handler(signum) -> bool``; returns a function that unregisters it.

    Called (newest first) when SIGINT, SIGTERM or SIGUSR1 arrives during
    ``hpcdp train``; returning True means "handled: I will stop the run cleanly", and
    the signal then does not end the job. Use it only when the run can actually stop
    cleanly (e.g. checkpointing is configured)."""
    _graceful.append(handler)

    def unregister():
        if handler in _graceful:
            _graceful.remove(handler)
    return unregister


_stopping: list = []  # the stop signal already raised as Interrupted (the run is ending)


def _handle(signum, _frame):
    for h in reversed(list(_graceful)):
        if h(signum):
            return
    if _stopping:  # the same stop delivered twice (to the process group and by the rank's watcher,
        return     # hpcdp.failure.watch): the run is already ending; a second raise would cut its report
    _stopping.append(signum)
    raise Interrupted(signum)


@contextlib.contextmanager
def handling_signals():
    """Install the stop-signal handlers for the duration of the block (main thread only)."""
    previous = {}
    _stopping.clear()
    try:
        for s in STOP_SIGNALS:
            previous[s] = signal.signal(s, _handle)
    except ValueError:  # not the main thread: leave the program's handlers alone
        for s, h in previous.items():
            signal.signal(s, h)
        previous = {}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


__all__ = ["Interrupted", "on_stop_signal", "handling_signals", "STOP_SIGNALS"]
