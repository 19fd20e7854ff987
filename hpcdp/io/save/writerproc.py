"""The asynchronous save's writer process: a rank file written off the training GIL.

With ``checkpoint.writer = "process"`` (layout "split"), each rank starts one helper
process at its first asynchronous save (``python -m hpcdp.io.save.writerproc``; no MPI
in it) and keeps it for the run. A save then goes:

1. training thread: copy the pieces into the shared host buffers (hostbuf.py: a
   memfd both processes map; the stall);
2. the background thread of the rank runs the usual save (save.py: agreements,
   index, commit), but the rank file itself is written by the helper: it gets one
   message (the file's path, attributes, and each piece's tensor, offset, dtype and
   place in the buffers), builds the HDF5 structure, hashes, writes (O_DIRECT from
   the shared pages) and fsyncs, and answers how the bytes went. The thread only
   waits on the pipe meanwhile: it holds no GIL, so training runs at full speed;
3. the commit protocol is unchanged: the checkpoint is listed only when complete.

If the helper dies (killed, out of memory), the pipe closes: the save fails on
this rank with a line that says so, every rank agrees (agree.py), the temporary
directory is never committed, and the previous checkpoint stays the latest.

Messages are pickled ``dict``\\ s, each preceded by its length (8 bytes), on the
helper's stdin/stdout.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import threading

import numpy as np

from ..errors import CheckpointError

_LEN = struct.Struct("<Q")


def _send(f, obj) -> None:
    raw = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_LEN.pack(len(raw)) + raw)
    f.flush()


def _recv(f):
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    n = _LEN.unpack(head)[0]
    raw = f.read(n)
    return pickle.loads(raw) if len(raw) == n else None


class WriterProcess:
    """Trainer side: the helper and the buffers it shares with this rank."""

    def __init__(self, buffers):
        self.buffers = buffers          # a HostBuffers (memfd) the helper maps
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the helper now (its imports take a moment: better before training)."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcdp.io.save.writerproc", str(self.buffers.fd)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(self.buffers.fd,),
                                     env=env, start_new_session=True)

    def write_rank_file(self, path, snap, attrs: dict, *, step: int, rank: int, threads: int = 1) -> dict:
        """What shardfile.write_rank_file does, done by the helper; ``snap``'s pieces
        must view ``self.buffers``."""
        base = self.buffers.array.ctypes.data
        pieces = [(p.tensor, int(p.offset), int(p.size), p.data.dtype.str, int(p.data.ctypes.data - base))
                  for p in snap.pieces]
        job = {"path": str(path), "pieces": pieces, "scalars": dict(snap.scalars), "attrs": attrs, "step": step,
               "rank": rank, "threads": threads, "size": self.buffers.size}
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                _send(self.proc.stdin, job)
                reply = _recv(self.proc.stdout)
            except (BrokenPipeError, OSError):
                reply = None
            if reply is None:
                code = self.proc.wait()
                self.proc = None
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                raise CheckpointError(f"save of step {step}: the checkpoint writer process of rank {rank} died "
                                      f"({how}) while writing {path.name if hasattr(path, 'name') else path}; "
                                      "this checkpoint is not committed, the previous one stays the latest")
        if "error" in reply:
            raise CheckpointError(reply["error"])
        return reply["stats"]

    def close(self, abandon: bool = False) -> None:
        """Let the helper finish and exit (``abandon``: kill it; the run failed)."""
        proc = self.proc
        if abandon and proc is not None:
            proc.kill()  # no lock: a save in flight holds it, and nobody will commit it
            proc.wait()
            return
        with self._lock:
            if self.proc is not None:
                try:
                    self.proc.stdin.close()
                    self.proc.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    self.proc.kill()
                    self.proc.wait()
                self.proc = None


NICE = 10          # the helper yields the CPU to training (HPCDP_CKPT_WRITER_NICE=0: as training)
IOPRIO_CLASS_BE, IOPRIO_WHO_PROCESS = 2, 1


def lower_priority() -> None:
    """The helper runs behind the training process: CPU nice ``HPCDP_CKPT_WRITER_NICE``
    (default 10) and, for a value > 0, the lowest best-effort I/O priority
    (``ioprio_set``; Linux, silently skipped elsewhere). Training's own steps then win
    each core they share with the helper's hashing (CFS weight 110 against 1024): the
    helper still gets about a tenth of a busy core, enough to finish between saves."""
    nice = int(os.environ.get("HPCDP_CKPT_WRITER_NICE", NICE))
    if nice <= 0:
        return
    try:
        os.nice(nice)
    except OSError:
        pass
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        nr = {"x86_64": 251, "aarch64": 30, "ppc64le": 273}.get(os.uname().machine)
        if nr is not None:
            libc.syscall(nr, IOPRIO_WHO_PROCESS, 0, (IOPRIO_CLASS_BE << 13) | 7)
    except (OSError, AttributeError):
        pass


def serve(fd: int) -> int:
    """Helper side: answer write jobs from stdin until it closes."""
    import mmap

    lower_priority()

    from ..format.shardfile import write_rank_file
    from .snapshot import Snapshot, TensorPiece

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply stream
    mapping, size = None, 0
    while True:
        job = _recv(inp)
        if job is None:
            return 0
        try:
            if job["size"] != size:
                mapping, size = mmap.mmap(fd, job["size"]), job["size"]
            arr = np.frombuffer(mapping, dtype=np.uint8)
            pieces = [TensorPiece(t, off, arr[pos:pos + n * np.dtype(dt).itemsize].view(dt))
                      for t, off, n, dt, pos in job["pieces"]]
            stats = write_rank_file(job["path"], Snapshot(pieces, job["scalars"]), job["attrs"], step=job["step"],
                                    rank=job["rank"], threads=job["threads"])
            del pieces, arr
            _send(out, {"stats": stats})
        except Exception as e:  # told to the rank, which tells every rank
            _send(out, {"error": f"save of step {job.get('step')}: the checkpoint writer process: "
                                 f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
