"""The asynchronous save's background: one save at a time in a background thread.

The training thread copies this rank's pieces to host memory (the stall) and hands
the save to :class:`BackgroundSaver`; the thread takes part in the save's
agreements on the checkpoint's own communicator and commits, while training goes
on. The rank file is written by the writer process (writerproc.py, the default:
the thread only waits on its pipe) or, with ``checkpoint.writer = "thread"``, by the
thread itself, which then hashes, writes and fsyncs. The next save, and the end of training, wait for it first. Hashing
(hashlib), ``pwrite`` and ``fsync`` release the GIL and the agreements poll with
sleeps, so the thread costs training little CPU time beyond the copy; HDF5's own
calls (the small file structure) hold the GIL briefly.

An error in the thread is kept and raised in the training thread by the next
``wait()``: every rank raises the same one, because the save's agreement already
shared it.
"""

from __future__ import annotations

import threading
import time


class BackgroundSaver:
    def __init__(self):
        self._thread: threading.Thread | None = None
        self._result = None
        self._error: BaseException | None = None
        self.started_at = self.finished_at = 0.0

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pending(self) -> bool:
        """A save was submitted and its outcome not collected yet."""
        return self._thread is not None

    def submit(self, fn) -> None:
        """Run ``fn()`` in the background, after the previous save finished."""
        self.wait()

        def run():
            try:
                self._result = fn()
            except BaseException as e:  # kept for wait(): the thread must not die silently
                self._error = e
            finally:
                self.finished_at = time.perf_counter()

        self._result, self._error = None, None
        self.started_at = time.perf_counter()
        self._thread = threading.Thread(target=run, name="hpcdp-ckpt-writer", daemon=True)
        self._thread.start()

    def wait(self):
        """Block until the running save is done; return its result or raise its error."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._result


__all__ = ["BackgroundSaver"]
