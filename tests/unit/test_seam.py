"""The strategy seam's forward side and storage binding, without MPI: module forward
hooks, pre-backward hooks on a unit's output, the unit rule, FlatParams.bind /
release, and train_step's rules (weights, the empty-slice filler, the order of the
strategy's moments)."""

import numpy as np
import pytest

from hpcdp.autograd import Tensor
from hpcdp.nn import MLP, build_model
from hpcdp.nn.params import FlatParams
from hpcdp.nn.units import UnitError, plan_units
from hpcdp.step import LocalBatch, train_step

GPT_CFG = {"kind": "gpt", "vocab_size": 11, "block_size": 5, "n_layer": 2, "n_head": 2,
           "n_embd": 8, "seed": 0}


def _gpt_batch(n=3):
    rng = np.random.default_rng(0)
    return rng.integers(0, 11, (n, 5)), rng.integers(0, 11, (n, 5))


def test_forward_hooks_bracket_every_call_in_order():
    m = build_model(GPT_CFG, dtype="float64")
    events = []
    handles = []
    for name, mod in [("root", m)] + [(f"h.{i}", b) for i, b in enumerate(m.h)]:
        handles.append(mod.register_forward_pre_hook(lambda mod, args, name=name: events.append(("pre", name))))
        handles.append(mod.register_forward_hook(
            lambda mod, args, out, name=name: events.append(("post", name, out.shape))))
    x, _ = _gpt_batch()
    m(x)
    assert events == [("pre", "root"), ("pre", "h.0"), ("post", "h.0", (3, 5, 8)),
                      ("pre", "h.1"), ("post", "h.1", (3, 5, 8)), ("post", "root", (3, 5, 11))]
    for h in handles:
        h.remove()
    events.clear()
    m(x)
    assert events == []


def test_pre_backward_hook_runs_before_the_unit_backward_and_sees_rebound_data():
    """The hook on a block's output fires before any of that block's backward ops
    (no grad of its parameters yet, the later block's all final) and the block's
    backward reads the parameter data bound at that moment, not at forward time."""
    m = build_model(GPT_CFG, dtype="float64")
    x, y = _gpt_batch()
    order = []
    fired = {}

    def pre_hook(t, i):
        order.append(i)
        fired[i] = set(done)  # which parameters were final at the hook

    done = []
    for name, p in m.flat.params.items():
        p.register_grad_ready_hook(lambda q, name=name: done.append(name))
    outs = []
    for i, b in enumerate(m.h):
        b.register_forward_hook(lambda mod, args, out: outs.append(out))
    loss = m.loss(x, y)
    for i, out in enumerate(outs):
        out.register_pre_backward_hook(lambda t, i=i: pre_hook(t, i))
    # release h.0's c_fc weight after forward and bind zeros in h.0's pre-backward hook:
    # backward must compute with the zeros (closures read .data when they run)
    p = m.flat.params["h.0.mlp.c_fc.weight"]
    shape = p.data.shape
    p.data = None
    outs[0].register_pre_backward_hook(lambda t: setattr(p, "data", np.zeros(shape)))
    loss.backward()
    assert order == [1, 0]
    assert not any(n.startswith("h.1.") for n in fired[1])
    assert {n for n in fired[0] if n.startswith("h.")} == {n for n in m.flat.params if n.startswith("h.1.")}
    ref = build_model(GPT_CFG, dtype="float64")
    ref.loss(x, y).backward()
    wte = m.flat.params["wte.weight"].grad
    assert not np.allclose(wte, ref.flat.params["wte.weight"].grad)  # the zeros were used
    np.testing.assert_array_equal(m.flat.params["h.1.mlp.c_fc.weight"].grad,
                                  ref.flat.params["h.1.mlp.c_fc.weight"].grad)


def test_pre_backward_hook_on_a_leaf_is_refused():
    with pytest.raises(RuntimeError, match="leaf"):
        Tensor(np.ones(3), requires_grad=True).register_pre_backward_hook(lambda t: None)


@pytest.mark.parametrize("tied", [True, False])
def test_gpt_units_tile_the_buffer_root_first(tied):
    m = build_model({**GPT_CFG, "tied_head": tied}, dtype="float32")
    units = m.flat.units
    assert [u.name for u in units] == ["root", "h.0", "h.1"]
    assert units[0].module is m and units[1].module is m.h[0]
    assert units[0].params[:2] == ("wte.weight", "wpe.weight")
    assert ("lm_head.weight" in units[0].params) == (not tied)
    off = 0
    for u in units:
        assert u.offset == off and u.size == sum(m.flat.spec(n).size for n in u.params)
        off = u.end
    assert off == m.flat.numel


def test_mlp_has_one_unit_per_layer_and_no_root():
    m = MLP([6, 10, 4], seed=0)
    assert [(u.name, u.offset, u.size) for u in m.flat.units] == [("fc0", 0, 70), ("fc1", 70, 44)]


def test_a_model_whose_units_are_not_contiguous_is_named():
    m = MLP([6, 10, 4], seed=0)

    class Swapped:
        def unit_modules(self):  # both weights without fc0's bias: not one range
            return [("odd", _Holder(m.layers[0].weight, m.layers[1].weight))]
    with pytest.raises(UnitError, match="unit 'odd' is not one contiguous range.*fc0.bias sits between"):
        plan_units(Swapped(), m.flat)
    flat = FlatParams.from_arrays([("a", np.ones(3))])
    assert flat.units is None and "no model" in flat.units_error


class _Holder:
    def __init__(self, *params):
        self.params = params

    def parameters(self):
        return iter(self.params)


def test_bind_and_release_storage_of_one_unit():
    m = MLP([6, 10, 4], seed=0, dtype="float64")
    flat = m.flat
    unit = flat.units[1]
    w = flat.params["fc1.weight"]
    gathered = np.arange(unit.size, dtype=np.float64)
    grads = np.zeros(unit.size)
    flat.bind(unit.offset, unit.size, data=gathered, grad=grads)
    assert np.shares_memory(w.data, gathered) and w.data.shape == (10, 4)
    assert w.data[0, 0] == 0.0 and flat.params["fc1.bias"].data[0] == 40.0
    x = Tensor(np.ones((2, 6)))
    m.loss(x, Tensor(np.array([0, 1]))).backward()
    assert np.any(grads != 0)  # fc1's gradient landed in the bound buffer
    flat.release(unit.offset, unit.size, data=True, grad=True)
    assert w.data is None and w.grad is None
    assert flat.params["fc0.weight"].data is not None  # other units untouched
    with pytest.raises(ValueError, match="cuts parameter fc0.bias"):
        flat.bind(0, 65, data=np.zeros(65))
    flat.drop_full_data()
    flat.drop_full_grad()
    assert flat.data is None and flat.grad is None and flat.params["fc0.weight"].data is None
    flat.zero_grad()  # no full buffer: nothing to zero


class _Recorder:
    """A strategy that records the moments train_step drives."""

    dp_rank, dp_size = 0, 1

    def __init__(self, flat):
        self.flat, self.events = flat, []

    def zero_grad(self):
        self.events.append("zero_grad")
        self.flat.zero_grad()

    def begin_backward(self, last_micro=True):
        self.events.append(("begin", last_micro))

    def finish_gradients(self):
        self.events.append("finish")

    def step(self):
        self.events.append("step")


def test_train_step_weights_micro_batches_and_runs_a_filler_for_an_empty_one():
    m = MLP([4, 3], seed=0, dtype="float64")
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((10, 4)), rng.integers(0, 3, 10)
    seen = []

    def fetch(idx):
        seen.append(list(idx))
        return Tensor(X[idx]), Tensor(Y[idx])

    rec = _Recorder(m.flat)
    after = []
    # this rank: 3 samples of a global batch of 10, in 3 micro-batches, one empty
    res = train_step(m, rec, LocalBatch([np.array([2, 3]), np.array([], int), np.array([4])], 10,
                                        filler=np.array([7])), fetch, after_backward=after.append)
    assert rec.events == ["zero_grad", ("begin", False), ("begin", False), ("begin", True),
                          "finish", "step"]
    assert seen == [[2, 3], [7], [4]] and after == [0, 1, 2] and res.samples == 3
    # the gradient is the one of (sum of the 3 samples' losses) / 10: the filler adds 0
    ref = MLP([4, 3], seed=0, dtype="float64")
    (ref.loss(Tensor(X[[2, 3, 4]]), Tensor(Y[[2, 3, 4]])) * (3 / 10)).backward()
    np.testing.assert_allclose(m.flat.grad, ref.flat.grad, rtol=1e-13, atol=1e-16)
    assert res.loss == pytest.approx(ref.loss(Tensor(X[[2, 3, 4]]), Tensor(Y[[2, 3, 4]])).item() * 0.3)
