"""Asynchronous PS training on the digits set converges (>= 93% test accuracy) for
k in {1, 4, none}: hpcdp's own training loop, the job file's settings, accuracy of
the final weights (after close: every update applied, all workers identical)."""

import numpy as np
import pytest
from mpi4py import MPI

from test_ps_support import same_on_all



@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("k", ["1", "4", "none"])
def test_async_digits_converges(k, tmp_path_factory):
    from hpcdp.autograd import Tensor, no_grad
    from hpcdp.config import load_config
    from hpcdp.data import load_dataset
    from hpcdp.nn import build_model
    from hpcdp.train import run_training
    from hpcdp.world import World

    comm = MPI.COMM_WORLD
    out = comm.bcast(str(tmp_path_factory.mktemp(f"ps_digits_{k}")) if comm.rank == 0 else None)
    cfg = load_config("jobs/digits_ps_async.toml",
                      [f"parallel.ps.staleness={k}", f"run.out_dir=\"{out}\"", "run.eval_every=0"])
    model = build_model(cfg.model, dtype=cfg.run.dtype, device="cpu")
    import io
    run_training(cfg, world=World.from_mpi(), model=model, out=io.StringIO())
    ds = load_dataset(cfg.data, "classification", cfg.run.dtype)
    with no_grad():
        acc = float((model(Tensor(ds.x_test)).numpy().argmax(axis=1) == ds.y_test).mean())
    assert same_on_all(comm, model.flat.data.astype(np.float64), list(range(comm.size)))
    if comm.rank == 0:
        print(f"k = {k}: test accuracy {acc:.4f}")
    assert acc >= 0.93, f"k = {k}: test accuracy {acc:.4f} < 0.93"
