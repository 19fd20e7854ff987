"""Device buffers (``__cuda_array_interface__``) through the collectives, on the
numba CUDA simulator in a separately launched 2-rank job: the staged path (MPI
not CUDA-aware) and the direct path with device-side reductions (forced on; the
simulator's device memory is host memory, so MPI can read it)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _job(mode):
    import numpy as np
    from mpi4py import MPI
    from numba import cuda

    from hpcdp.comm import all_gather, allreduce, reduce_scatter, set_cuda_aware
    from hpcdp.shard import shard_range

    comm = MPI.COMM_WORLD
    N, r = comm.Get_size(), comm.Get_rank()
    set_cuda_aware(comm, mode == "aware")
    n = 1001
    host = (np.arange(n) % 7 + r + 1).astype(np.float32)
    want = (N * (np.arange(n) % 7) + N * (N + 1) // 2).astype(np.float32)
    for algorithm in ("ring", "recursive", "native"):
        d = cuda.to_device(host)
        got = allreduce(d, comm=comm, algorithm=algorithm, segment_bytes=512)
        assert got is d
        np.testing.assert_array_equal(d.copy_to_host(), want)
        out = cuda.device_array(n, np.float32)
        allreduce(cuda.to_device(host), out, comm=comm, algorithm=algorithm, op="mean")
        np.testing.assert_allclose(out.copy_to_host(), want / N)
    off, size = shard_range(n, N, r)
    d = cuda.to_device(host)
    chunk = reduce_scatter(d, comm=comm)
    np.testing.assert_array_equal(chunk.copy_to_host(), want[off:off + size])
    full = cuda.device_array(n, np.float32)
    all_gather(cuda.to_device(want[off:off + size]), full, comm=comm)
    np.testing.assert_array_equal(full.copy_to_host(), want)
    # a 16-bit wire converts on the host: staged, the same bits as a host call; with
    # CUDA-aware MPI refused with one line (small integers: exact in 16 bits either way)
    for wire in ("bfloat16", "float16"):
        d = cuda.to_device(host)
        if mode == "staged":
            got = allreduce(d, comm=comm, wire=wire, segment_bytes=512)
            np.testing.assert_array_equal(got.copy_to_host(), allreduce(host.copy(), comm=comm, wire=wire))
            chunk = reduce_scatter(cuda.to_device(host), comm=comm, wire=wire)
            np.testing.assert_array_equal(chunk.copy_to_host(), want[off:off + size])
        else:
            try:
                allreduce(d, comm=comm, wire=wire)
            except ValueError as e:
                assert "converts on the host" in str(e), e
            else:
                raise AssertionError("a 16-bit wire with CUDA-aware MPI was not refused")
    print(f"rank {r} device {mode} ok", flush=True)


@pytest.mark.parametrize("mode", ["staged", "aware"])
def test_device_buffers_on_simulator(mode):
    pytest.importorskip("numba.cuda")
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")  # this Python's MPI first
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="1",
               NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, mode],
                          capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count(f"device {mode} ok") == 2, out


if __name__ == "__main__":
    _job(sys.argv[1])
