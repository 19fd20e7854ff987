"""ZeRO stages 1-3 with device = "cuda" (the simulator in CI): two ranks share one GPU,
the gathers and reduce-scatters run on device buffers, and every stage follows the
CPU run of the same steps (weights to float tolerance, the same ledger bytes).

One ``mpiexec -n 2`` job (this file run as a script) trains cpu and cuda for each
stage in the same processes, so the simulator starts once.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GPT = {"kind": "gpt", "vocab_size": 7, "block_size": 4, "n_layer": 1, "n_head": 2, "n_embd": 4,
       "tied_head": True, "dropout": 0.0, "seed": 3}


def _train(device, stage, world):
    from hpcdp.autograd import Tensor
    from hpcdp.backend import get_backend
    from hpcdp.config_parallel import ZeroConfig
    from hpcdp.nn import build_model
    from hpcdp.optim import AdamW
    from hpcdp.shard import shard_range
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies.zero import make_zero

    be = get_backend(device)
    strat = make_zero(ZeroConfig(stage=stage, bucket_mb=1e-4, prefetch=1), timeout=120.0)
    model = build_model(GPT, dtype="float64", device=device, storage=())
    model.flat.materialize(strat.full_storage)
    strat.setup(model.flat, AdamW(lr=0.01, dtype="float64", device=device), world)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 7, (8, 4)), rng.integers(0, 7, (8, 4))
    sent = []
    for step in range(2):
        off, size = shard_range(4, world.size, world.rank)
        idx = np.arange(off, off + size) + 4 * step
        train_step(model, strat, LocalBatch([idx], 4, idx[:1]),
                   lambda i: (Tensor(x[i], backend=be), Tensor(y[i], backend=be)))
        sent.append(strat.step_stats()["bytes_sent"])
    params = strat.gather_full_params()
    strat.close()
    return params, sent


def job() -> int:
    from hpcdp.world import World

    world = World.from_mpi()
    for stage in (1, 2, 3):
        cpu, cpu_sent = _train("cpu", stage, world)
        gpu, gpu_sent = _train("cuda", stage, world)
        err = np.max(np.abs(gpu - cpu)) / np.max(np.abs(cpu))
        assert err < 1e-10, f"stage {stage}: cuda differs from cpu by {err:.3g}"
        assert gpu_sent == cpu_sent and all(s > 0 for s in gpu_sent), (stage, gpu_sent, cpu_sent)
        print(f"rank {world.rank} stage {stage}: cuda == cpu (rel err {err:.2e}), "
              f"{gpu_sent[0]:.0f} bytes sent per step", flush=True)
    return 0


@pytest.mark.timeout(900)  # the simulator runs every kernel in Python: minutes, not seconds
def test_zero_stages_on_cuda_follow_the_cpu_run():
    pytest.importorskip("numba.cuda")
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found next to the Python or on PATH"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(["timeout", "840", mpiexec, "-n", "2", sys.executable, __file__, "job"],
                          env=env, capture_output=True, text=True, timeout=870)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # mpiexec forwards each rank's output on its own, so two ranks' lines can share one
    # line of proc.stdout: look for every (rank, stage) pair, not for whole lines.
    seen = set(re.findall(r"rank (\d) stage (\d): cuda == cpu", proc.stdout))
    assert seen == {(str(r), str(s)) for r in (0, 1) for s in (1, 2, 3)}, out


if __name__ == "__main__" and sys.argv[1:] == ["job"]:
    sys.exit(job())
