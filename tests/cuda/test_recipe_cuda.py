"""The GPT-recipe additions on the cuda backend, against the CPU backend (float64):
exact GELU, cross-entropy with ignore_index (counted on the device, no sync), token
ids checked, and AdamW/SGD with weight-decay runs on device arrays."""

import numpy as np
import pytest

from hpcdp.autograd import Tensor, functional as F
from hpcdp.backend import get_backend
from hpcdp.nn import GPT
from hpcdp.optim import SGD, AdamW

CPU = get_backend("cpu")


def test_exact_gelu_matches_cpu(be, rng):
    x = rng.standard_normal(300) * 3
    gy = rng.standard_normal(300)
    np.testing.assert_allclose(be.to_numpy(be.gelu(be.asarray(x), "exact")), CPU.gelu(x, "exact"), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(be.to_numpy(be.gelu_backward(be.asarray(x), be.asarray(gy), "exact")),
                               CPU.gelu_backward(x, gy, "exact"), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(be.to_numpy(be.gelu(be.asarray(x))), CPU.gelu(x), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("ignore", [None, -100, 2])
def test_cross_entropy_ignore_index_matches_cpu(be, rng, ignore):
    x = rng.standard_normal((9, 5))
    t = rng.integers(0, 5, size=9)
    if ignore is not None:
        t[[0, 4, 5]] = ignore
    loss, probs = be.cross_entropy(be.asarray(x), be.asarray(t), ignore)
    loss_c, probs_c = CPU.cross_entropy(x, t, ignore)
    assert float(be.to_numpy(loss)) == pytest.approx(float(loss_c), rel=1e-13)
    g = be.to_numpy(be.cross_entropy_backward(probs, be.asarray(t), 0.7, ignore))
    np.testing.assert_allclose(g, CPU.cross_entropy_backward(probs_c, t, 0.7, ignore), rtol=1e-12, atol=1e-16)
    if ignore is not None:
        assert not g[t == ignore].any()


def test_all_ignored_batch_on_device(be):
    x, t = np.ones((3, 4)), np.full(3, -100)
    loss, probs = be.cross_entropy(be.asarray(x), be.asarray(t), -100)
    assert float(be.to_numpy(loss)) == 0.0
    g = be.to_numpy(be.cross_entropy_backward(probs, be.asarray(t), 1.0, -100))
    assert not g.any() and np.isfinite(g).all()


@pytest.mark.parametrize("bad", [-1, 12])
def test_token_ids_checked_on_cuda(bad):
    model = GPT(12, 4, 1, 2, 8, dtype="float64", device="cuda")
    ids = np.zeros((1, 3), dtype=np.int64)
    ids[0, 1] = bad
    with pytest.raises(ValueError, match=rf"token id {bad} is out of range for vocabulary size 12"):
        model(ids)
    with pytest.raises(ValueError, match=rf"token id {bad} is out of range"):  # ids already on the device
        model(Tensor(ids, backend=model.backend))


@pytest.mark.parametrize("make", [
    lambda d: AdamW(lr=0.1, weight_decay=0.3, dtype="float64", device=d),
    lambda d: SGD(lr=0.1, momentum=0.9, weight_decay=0.3, dtype="float64", device=d)])
def test_weight_decay_runs_on_device_arrays(be, rng, make):
    p, g = rng.standard_normal(50), rng.standard_normal(50)
    ranges, pieces = [(5, 10), (30, 12)], [(20, 25), (0, 10)]
    local = lambda a: np.concatenate([a[o:o + s] for o, s in pieces])  # noqa: E731
    cpu, gpu = make("cpu"), make("cuda")
    for opt in (cpu, gpu):
        opt.set_decay_ranges(ranges)
        opt.set_slice(pieces)
    pc, pg = local(p), be.asarray(local(p))
    for _ in range(2):
        cpu.step(pc, local(g))
        gpu.step(pg, be.asarray(local(g)))
    np.testing.assert_allclose(be.to_numpy(pg), pc, rtol=1e-13, atol=1e-15)


def test_gpt_loss_with_ignore_index_on_cuda_matches_cpu(rng):
    ids = rng.integers(0, 12, size=(2, 4))
    y = rng.integers(0, 12, size=(2, 4))
    y[0, 2:] = -100
    losses = []
    for device in ("cpu", "cuda"):
        m = GPT(12, 4, 1, 2, 8, ignore_index=-100, gelu="exact", dtype="float64", device=device)
        loss = m.loss(ids, y)
        loss.backward()
        losses.append((loss.item(), m.backend.to_numpy(m.flat.grad).copy()))
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-12)
    np.testing.assert_allclose(losses[1][1], losses[0][1], rtol=1e-9, atol=1e-13)
