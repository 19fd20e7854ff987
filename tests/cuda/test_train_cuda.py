"""One-rank training on the cuda backend follows the CPU backend's loss curve
(same seed, same data; float tolerance) for a tiny MLP and a tiny GPT."""

import numpy as np
import pytest

nn = pytest.importorskip("hpcdp.nn")
optim = pytest.importorskip("hpcdp.optim")
from hpcdp.autograd import Tensor  # noqa: E402
from hpcdp.backend import get_backend  # noqa: E402
from hpcdp.step import LocalBatch, train_step  # noqa: E402
from hpcdp.strategies.base import SingleRank  # noqa: E402
from hpcdp.world import World  # noqa: E402


def _curve(device, cfg, opt_kind, batches, dtype):
    model = nn.build_model(cfg, dtype=dtype, device=device)
    be = get_backend(device)
    flat = model.flat
    if opt_kind == "sgd":
        opt = optim.SGD(flat.numel, lr=0.1, momentum=0.9, dtype=dtype, device=device)
    else:
        opt = optim.AdamW(flat.numel, lr=0.01, betas=(0.9, 0.99), weight_decay=0.01,
                          dtype=dtype, device=device)
    single = SingleRank()
    single.setup(flat, opt, World(comm=None, rank=0, size=1))
    losses = []
    for x, y in batches:
        batch = LocalBatch([np.arange(len(x))], len(x), filler=np.arange(1))
        res = train_step(model, single, batch, lambda i: (Tensor(x[i], backend=be), Tensor(y[i], backend=be)))
        losses.append(res.loss)
    return np.array(losses), be.to_numpy(flat.data)


def test_gpt_cuda_matches_cpu():
    dtype, tol = "float32", 2e-5
    cfg = dict(kind="gpt", vocab_size=7, block_size=5, n_layer=1, n_head=2, n_embd=8,
               tied_head=True, dropout=0.0, seed=3)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))) for _ in range(2)]
    cpu_l, cpu_p = _curve("cpu", cfg, "adamw", batches, dtype)
    gpu_l, gpu_p = _curve("cuda", cfg, "adamw", batches, dtype)
    assert np.all(np.abs(gpu_l - cpu_l) <= tol * np.abs(cpu_l))
    assert np.max(np.abs(gpu_p - cpu_p)) <= tol * max(1.0, np.max(np.abs(cpu_p))) * 10


def test_mlp_cuda_matches_cpu():
    cfg = dict(kind="mlp", sizes=[6, 9, 4], activation="relu", seed=1)
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((5, 6)), rng.integers(0, 4, 5))] * 4  # one batch, 4 steps
    cpu_l, _ = _curve("cpu", cfg, "sgd", batches, "float64")
    gpu_l, _ = _curve("cuda", cfg, "sgd", batches, "float64")
    assert np.allclose(gpu_l, cpu_l, rtol=1e-10, atol=0)
    assert gpu_l[-1] < gpu_l[0]  # it trains
