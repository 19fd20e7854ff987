"""Read the next step's batch in a background thread while this step computes.

One worker thread, one batch ahead: after handing out step ``s`` the reader starts
on step ``s + 1``. Asking for the step that is being read waits for it (the wait
is what ``data_wait_s`` reports); asking for any other step first lets the read in
flight finish (the sampler is then used by one thread at a time) and reads
synchronously. An error in the background read is raised by the ``get`` that
asks for that step, as a synchronous read would. Memory: two batches at most.

Overlap needs reads that release the GIL: ``os.preadv`` does (the ``pread`` path
of :mod:`.arrays`); h5py's path holds h5py's lock, so it overlaps less.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


class Prefetcher:
    def __init__(self, read):
        self._read = read            # read(step) -> batch
        self._pool = None
        self._pending = None         # (step, future)

    def get(self, step: int, next_step: int | None = None):
        """The batch of ``step``; then start reading ``next_step`` (None: nothing)."""
        batch = None
        if self._pending is not None:
            pending_step, future = self._pending
            self._pending = None
            if pending_step == step:
                batch = future.result()  # re-raises a failed read
            else:
                future.exception()       # wait for it; its batch (or error) is not wanted
        if batch is None:
            batch = self._read(step)
        if next_step is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="hpcdp-prefetch")
            self._pending = (next_step, self._pool.submit(self._read, next_step))
        return batch

    def close(self) -> None:
        """Stop the thread (a read in flight finishes first); idempotent."""
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
