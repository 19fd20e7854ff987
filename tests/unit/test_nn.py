"""FlatParams, models, build_model, train/eval, hooks and accumulation on models."""

from types import SimpleNamespace

import numpy as np
import pytest

from hpcdp.autograd import Tensor
from hpcdp.nn import GPT, MLP, FlatParams, build_model

GPT_CFG = dict(kind="gpt", vocab_size=11, block_size=5, n_layer=2, n_head=2, n_embd=8,
               tied_head=True, dropout=0.0, seed=3)


def gpt_batch(seed=0, b=2, t=5, v=11):
    rng = np.random.default_rng(seed)
    return rng.integers(0, v, size=(b, t)), rng.integers(0, v, size=(b, t))


def test_flat_views_alias_buffers_and_layout_is_contiguous():
    m = MLP([5, 4, 3], seed=0)
    flat = m.flat
    off = 0
    for spec in flat.layout:
        assert spec.offset == off and spec.size == int(np.prod(spec.shape))
        off += spec.size
    assert flat.numel == off == 5 * 4 + 4 + 4 * 3 + 3
    assert flat.nbytes == off * 4 and flat.data.dtype == flat.grad.dtype == np.float32
    assert [s.name for s in flat.layout] == ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]
    for name, d, g in flat.named_views():
        spec = flat.spec(name)
        assert np.shares_memory(d, flat.data) and np.shares_memory(g, flat.grad)
        d[...] = 7.0
        g[...] = 3.0
        assert np.all(flat.data[spec.offset:spec.offset + spec.size] == 7.0)
    assert np.all(flat.grad == 3.0)
    flat.data[:] = 1.5  # writes through the flat buffer are what the model sees
    assert np.all(m.flat.params["fc1.weight"].data == 1.5)
    grad_views = [p.grad for p in flat.params.values()]
    flat.zero_grad()
    assert np.all(flat.grad == 0) and all(p.grad is g for p, g in
                                          zip(flat.params.values(), grad_views))


def test_from_arrays_and_errors():
    f = FlatParams.from_arrays([("a", np.ones((2, 2))), ("b", np.arange(3.0))], dtype="float64")
    np.testing.assert_array_equal(f.data, [1, 1, 1, 1, 0, 1, 2])
    assert f.params["b"].shape == (3,)
    with pytest.raises(ValueError, match="twice"):
        FlatParams.from_arrays([("a", np.ones(2)), ("a", np.ones(2))])
    with pytest.raises(ValueError, match="float"):
        FlatParams.from_arrays([("a", np.ones(2))], dtype="int32")


@pytest.mark.parametrize("make", [lambda s: MLP([6, 5, 3], seed=s),
                                  lambda s: build_model({**GPT_CFG, "seed": s})])
def test_init_depends_only_on_seed(make):
    a, b, c = make(1), make(1), make(2)
    np.testing.assert_array_equal(a.flat.data, b.flat.data)
    assert not np.allclose(a.flat.data, c.flat.data)


def test_float32_and_float64_start_equal():
    a = MLP([6, 5, 3], seed=4, dtype="float32")
    b = MLP([6, 5, 3], seed=4, dtype="float64")
    np.testing.assert_array_equal(a.flat.data, b.flat.data.astype(np.float32))


def test_gpt2_init_statistics():
    m = GPT(50, 16, 4, 4, 64, tied_head=False, seed=0)
    p = m.flat.params
    assert np.std(p["wte.weight"].data) == pytest.approx(0.02, rel=0.05)
    assert np.std(p["h.0.attn.c_proj.weight"].data) == pytest.approx(0.02 / np.sqrt(8), rel=0.1)
    assert np.std(p["h.3.mlp.c_proj.weight"].data) == pytest.approx(0.02 / np.sqrt(8), rel=0.1)
    assert np.all(p["h.1.ln_2.weight"].data == 1) and np.all(p["h.1.attn.c_attn.bias"].data == 0)
    assert "lm_head.weight" in p and "lm_head.weight" not in build_model(GPT_CFG).flat.params


def test_build_model_from_mapping_and_object():
    m = build_model(SimpleNamespace(kind="mlp", sizes=[4, 6, 2], activation="tanh", seed=0),
                    dtype="float64", device="cpu")
    assert isinstance(m, MLP) and m.flat.dtype == np.float64 and m.activation == "tanh"
    g = build_model(GPT_CFG, dtype="float32")
    assert isinstance(g, GPT) and g.n_layer == 2
    ids, _ = gpt_batch()
    assert g(ids).shape == (2, 5, 11)
    with pytest.raises(ValueError, match="kind"):
        build_model({"kind": "cnn"})
    with pytest.raises(ValueError, match="n_embd"):
        build_model({k: v for k, v in GPT_CFG.items() if k != "n_embd"})
    with pytest.raises(ValueError, match="divisible"):
        build_model({**GPT_CFG, "n_head": 3})


def test_model_input_errors():
    m = MLP([4, 3], seed=0)
    with pytest.raises(ValueError, match=r"\(batch, 4\)"):
        m(np.ones((2, 5)))
    g = build_model(GPT_CFG)
    with pytest.raises(ValueError, match="block_size"):
        g(np.zeros((1, 6), dtype=np.int64))


def test_loss_is_scalar_and_near_log_classes_at_init():
    g = build_model(GPT_CFG)
    ids, tgt = gpt_batch()
    loss = g.loss(ids, tgt)
    assert loss.shape == () and abs(loss.item() - np.log(11)) < 0.1
    m = MLP([8, 16, 10], seed=0)
    assert m.loss(np.random.default_rng(0).standard_normal((4, 8)), np.arange(4)).shape == ()


def test_dropout_only_in_train_mode():
    g = build_model({**GPT_CFG, "dropout": 0.5})
    ids, _ = gpt_batch()
    g.eval()
    e1, e2 = g(ids).data, g(ids).data
    np.testing.assert_array_equal(e1, e2)
    g.train()
    with pytest.raises(RuntimeError, match="streams.set"):
        g(ids)  # no (step, samples) to key the masks by
    samples = np.arange(len(ids))
    g.streams.set(0, samples)
    t1 = g(ids).data
    g.streams.set(1, samples)
    t2 = g(ids).data
    assert not np.allclose(t1, e1) and not np.allclose(t1, t2)
    g.streams.set(0, samples)
    np.testing.assert_array_equal(g(ids).data, t1)  # the key, not a call count, decides
    assert all(m.training for m in g.modules())


def test_causal_gpt_future_tokens_do_not_change_past_logits():
    g = build_model(GPT_CFG, dtype="float64")
    ids, _ = gpt_batch()
    base = g(ids).data
    ids2 = ids.copy()
    ids2[:, 3] = (ids2[:, 3] + 1) % 11
    out = g(ids2).data
    np.testing.assert_array_equal(out[:, :3], base[:, :3])
    assert not np.allclose(out[:, 3:], base[:, 3:])


@pytest.mark.parametrize("model", ["mlp", "gpt_tied", "gpt_untied"])
def test_hooks_once_per_param_after_final_grad_in_reverse_order_of_use(model):
    if model == "mlp":
        m = MLP([6, 5, 4, 3], seed=0, dtype="float64")
        x, y = np.random.default_rng(0).standard_normal((4, 6)), np.array([0, 1, 2, 1])
    else:
        m = build_model({**GPT_CFG, "tied_head": model == "gpt_tied"}, dtype="float64")
        x, y = gpt_batch()
    fired = []
    for name, p in m.flat.params.items():
        p.register_grad_ready_hook(lambda q, name=name: fired.append((name, q.grad.copy())))
    m.loss(x, y).backward()
    names = [n for n, _ in fired]
    layout = [s.name for s in reversed(m.flat.layout)]
    if model == "mlp":
        want = layout  # layout order is the order of use
    else:
        # GPT's layout puts the root unit (wte, wpe, ln_f, head) first; its parameters
        # are used at both ends of forward: the head and ln_f first in backward, the
        # embeddings last (the tied wte is final only after its embedding use).
        want = (["lm_head.weight"] if model == "gpt_untied" else []) + ["ln_f.bias", "ln_f.weight"]
        want += [n for n in layout if n.startswith("h.")] + ["wpe.weight", "wte.weight"]
    assert names == want  # each exactly once
    for name, g_at_hook in fired:  # final when fired (wte: embedding + tied head)
        np.testing.assert_array_equal(g_at_hook, m.flat.params[name].grad)
    m.loss(x, y).backward()
    assert len(fired) == 2 * len(m.flat.layout)


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_two_backwards_without_zero_grad_sum(model):
    if model == "mlp":
        m = MLP([6, 5, 3], seed=0, dtype="float64")
        rng = np.random.default_rng(1)
        b1 = (rng.standard_normal((4, 6)), np.array([0, 1, 2, 1]))
        b2 = (rng.standard_normal((3, 6)), np.array([2, 2, 0]))
    else:
        m = build_model(GPT_CFG, dtype="float64")
        b1, b2 = gpt_batch(1), gpt_batch(2)
    m.loss(*b1).backward()
    g1 = m.flat.grad.copy()
    m.flat.zero_grad()
    m.loss(*b2).backward()
    g2 = m.flat.grad.copy()
    m.flat.zero_grad()
    m.loss(*b1).backward()
    m.loss(*b2).backward()
    np.testing.assert_allclose(m.flat.grad, g1 + g2, rtol=1e-12, atol=1e-15)


def test_scaled_loss_scales_gradients():
    m = MLP([6, 5, 3], seed=0, dtype="float64")
    x, y = np.random.default_rng(1).standard_normal((4, 6)), np.array([0, 1, 2, 1])
    m.loss(x, y).backward()
    g = m.flat.grad.copy()
    m.flat.zero_grad()
    (m.loss(x, y) * 0.25).backward()
    np.testing.assert_allclose(m.flat.grad, 0.25 * g, rtol=1e-12)


def test_mlp_learns_a_separable_problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    m = MLP([4, 16, 2], seed=0)
    be = m.flat.backend
    first = m.loss(x, y).item()
    for _ in range(100):
        m.flat.zero_grad()
        m.loss(x, y).backward()
        be.sgd_update(m.flat.data, m.flat.grad, None, 0.5, 0.0, 0.0, False)
    assert m.loss(x, y).item() < 0.3 * first
    acc = (np.argmax(m(Tensor(x)).data, axis=1) == y).mean()
    assert acc > 0.95
