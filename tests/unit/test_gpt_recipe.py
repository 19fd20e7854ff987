"""What a GPT recipe expects: exact GELU as an option, token ids checked, cross-entropy
with ignore_index (padding), and the config keys for them. CPU backend, float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcdp.autograd import Tensor, functional as F, ops
from hpcdp.autograd.gradcheck import gradcheck
from hpcdp.backend import get_backend
from hpcdp.config_error import ConfigError
from hpcdp.config import config_from_dict, dump_toml, load_config
from hpcdp.nn import GPT, MLP, build_model
from hpcdp.nn.padding import counted_targets, slice_weight

TOL = 1e-7
GPT_SIZES = dict(vocab_size=16, block_size=6, n_layer=1, n_head=2, n_embd=8)


def leaf(*shape, seed=0):
    return Tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


# -- GELU -------------------------------------------------------------------------

def _erf_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exact_gelu_is_the_erf_form(dtype):
    be = get_backend("cpu")
    x = np.linspace(-8, 8, 1001).astype(dtype)
    tol = 1e-6 if dtype == "float32" else 1e-15
    np.testing.assert_allclose(be.gelu(x, "exact"), _erf_gelu(x.astype(np.float64)), rtol=tol, atol=tol)
    d = 1e-6
    x64 = np.linspace(-5, 5, 101)
    num = (_erf_gelu(x64 + d) - _erf_gelu(x64 - d)) / (2 * d)
    np.testing.assert_allclose(be.gelu_backward(x64, np.ones_like(x64), "exact"), num, rtol=1e-7, atol=1e-9)
    # and the two forms really differ (by up to ~1e-3 near |x| = 2)
    assert 1e-4 < np.abs(be.gelu(x64, "tanh") - be.gelu(x64, "exact")).max() < 1e-2


def test_exact_gelu_through_linear_and_ops_gradcheck():
    x, w, b = leaf(2, 3, 4, seed=1), leaf(4, 5, seed=2), leaf(5, seed=3)
    assert gradcheck(lambda: F.linear(x, w, b, "gelu", gelu="exact"), [x, w, b]) < TOL
    assert gradcheck(lambda: ops.gelu(x, "exact"), [x]) < TOL
    with pytest.raises(ValueError, match="gelu must be one of"):
        F.linear(x, w, b, "gelu", gelu="erf")


def test_model_gelu_key_reaches_gpt_and_mlp():
    ids = np.random.default_rng(0).integers(0, 16, size=(2, 6))
    out = {mode: build_model({"kind": "gpt", **GPT_SIZES, "gelu": mode}, dtype="float64")(ids).numpy()
           for mode in ("tanh", "exact")}
    assert np.abs(out["tanh"] - out["exact"]).max() > 1e-12  # the key changes the model (small init: small diff)
    assert np.abs(out["tanh"] - out["exact"]).max() < 1e-3  # same weights, nearly the same function
    mlp = build_model({"kind": "mlp", "sizes": [4, 6, 3], "activation": "gelu", "gelu": "exact"}, dtype="float64")
    assert all(layer.gelu == "exact" for layer in mlp.layers)
    cfg = load_config(None, ["model.activation=gelu", "model.gelu=\"exact\""])  # read by a gelu MLP (and a GPT)
    assert cfg.model.gelu == "exact"
    with pytest.raises(ConfigError, match=r"model.gelu: 'erf' is not allowed; choose one of 'tanh', 'exact'"):
        load_config(None, ["model.gelu=\"erf\""])
    with pytest.raises(ValueError, match="MLP gelu must be one of"):
        MLP([4, 3], "gelu", gelu="none")


# -- token ids ---------------------------------------------------------------------

@pytest.mark.parametrize("bad", [-1, 16, 1000])
def test_out_of_range_token_ids_name_the_id_and_the_vocabulary(bad):
    model = GPT(**GPT_SIZES, dtype="float64")
    ids = np.zeros((2, 5), dtype=np.int64)
    ids[1, 3] = bad
    with pytest.raises(ValueError, match=rf"token id {bad} is out of range for vocabulary size 16"):
        model(ids)
    with pytest.raises(ValueError, match=rf"token id {bad} is out of range"):
        model.loss(Tensor(ids), np.zeros((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=rf"Embedding wte: token id {bad}"):
        model.wte(ids.tolist())


def test_valid_ids_at_both_ends_still_work():
    model = GPT(**GPT_SIZES, dtype="float64")
    ids = np.array([[0, 15, 3]])
    np.testing.assert_array_equal(model.wte(ids).numpy()[0, 1], model.wte.weight.numpy()[15])
    assert model(ids).shape == (1, 3, 16)


# -- cross-entropy ignore_index -----------------------------------------------------

def _ce_reference(logits, targets, ignore):
    x = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    keep = t != ignore
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    nll = lse - x[np.arange(len(t)), np.where(keep, t, 0)]
    n = keep.sum()
    loss = nll[keep].sum() / n if n else 0.0
    p = np.exp(x - lse[:, None])
    p[np.arange(len(t)), np.where(keep, t, 0)] -= 1.0
    grad = np.where(keep[:, None], p / max(n, 1), 0.0)
    return loss, grad.reshape(logits.shape)


@pytest.mark.parametrize("ignore", [-100, 0, 3])
def test_ignore_index_mean_over_counted_positions_and_zero_gradient(ignore):
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((3, 5, 7))
    targets = rng.integers(0, 7, size=(3, 5))
    targets[0, :2] = ignore
    targets[2, 4] = ignore
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, targets, ignore_index=ignore)
    loss.backward()
    ref_loss, ref_grad = _ce_reference(logits, targets, ignore)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-13)
    np.testing.assert_allclose(x.grad, ref_grad, rtol=1e-12, atol=1e-15)
    assert not x.grad[targets == ignore].any()  # exactly zero at ignored positions
    assert gradcheck(lambda: F.cross_entropy(x, targets, ignore_index=ignore), [x]) < TOL


def test_without_ignore_index_nothing_changes():
    rng = np.random.default_rng(5)
    logits, targets = rng.standard_normal((6, 4)), rng.integers(0, 4, size=6)
    a = F.cross_entropy(Tensor(logits), targets).item()
    assert a == pytest.approx(_ce_reference(logits, targets, ignore=-1)[0], rel=1e-13)
    with pytest.raises(ValueError, match=r"target -100 is out of range: targets must be in \[0, 4\)$"):
        F.cross_entropy(Tensor(logits), np.full(6, -100))


def test_an_all_ignored_batch_has_loss_zero_and_zero_gradient():
    x = Tensor(np.random.default_rng(6).standard_normal((4, 5)), requires_grad=True)
    loss = F.cross_entropy(x, np.full(4, -100), ignore_index=-100)
    loss.backward()
    assert loss.item() == 0.0 and not x.grad.any()
    assert np.isfinite(x.grad).all()


def test_other_out_of_range_targets_are_still_errors_with_ignore_index():
    with pytest.raises(ValueError, match=r"target 9 is out of range: .* or equal ignore_index -100"):
        F.cross_entropy(Tensor(np.zeros((2, 5))), np.array([9, -100]), ignore_index=-100)


def test_gpt_loss_uses_model_ignore_index():
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 16, size=(2, 6))
    y = rng.integers(0, 16, size=(2, 6))
    y[1, 3:] = -100  # right padding
    model = build_model({"kind": "gpt", **GPT_SIZES, "ignore_index": -100}, dtype="float64")
    logits = model(ids).numpy()
    assert model.loss(ids, y).item() == pytest.approx(_ce_reference(logits, y, -100)[0], rel=1e-12)
    # causal attention: the padding after position 2 changes nothing before it
    ids2 = ids.copy()
    ids2[1, 3:] = 0
    np.testing.assert_allclose(model(ids2).numpy()[1, :3], logits[1, :3], rtol=1e-12)


def test_model_ignore_index_key():
    assert load_config(None).model.ignore is None
    gpt = ["model.kind=gpt", "data.kind=synthetic_sequence"]  # a GPT's key (config_applies)
    cfg = load_config(None, [*gpt, "model.ignore_index=-100"])
    assert cfg.model.ignore == -100 and "ignore_index = -100" in dump_toml(cfg.to_dict())
    assert config_from_dict(cfg.to_dict()).model.ignore == -100
    with pytest.raises(ConfigError, match=r"model.ignore_index: 'pad' is not allowed"):
        load_config(None, ["model.ignore_index=\"pad\""])


def test_slice_weights_add_up_to_the_global_token_mean():
    rng = np.random.default_rng(8)
    y = rng.integers(0, 5, size=(8, 6))
    y[rng.random((8, 6)) < 0.4] = -1
    logits = rng.standard_normal((8, 6, 5))
    parts = [(0, 3), (3, 5), (5, 8)]  # three ranks' slices of the global batch
    weighted = sum(slice_weight(y[a:b], y, -1) * _ce_reference(logits[a:b], y[a:b], -1)[0] for a, b in parts)
    assert weighted == pytest.approx(_ce_reference(logits, y, -1)[0], rel=1e-13)
    assert sum(slice_weight(y[a:b], y, -1) for a, b in parts) == pytest.approx(1.0)
    assert counted_targets(y, -1) == int((y != -1).sum()) and counted_targets(y) == y.size
    assert slice_weight(y[:2], y) == 2 / 8  # no ignore_index: samples
    assert slice_weight(y[:2], np.full((3, 6), -1), -1) == 0.0
