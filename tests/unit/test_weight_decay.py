"""Weight-decay groups on the flat buffer: rules -> ranges -> runs of a (sliced) optimizer.

Zero gradients make the expectations closed-form: one step multiplies a decayed
element by exactly 1 - lr*wd (AdamW) and leaves an undecayed one exactly as it was.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import load_config
from hpcdp.nn import GPT, MLP
from hpcdp.optim import SGD, AdamW, build_optimizer, decay_ranges, local_runs
from hpcdp.optim.decay import rule_matches

LR, WD = 0.1, 0.2


def _gpt(tied=True):
    return GPT(16, 8, 2, 2, 8, tied_head=tied, dtype="float64")


def _decayed_names(model, rules=("bias", "ln_*", "wte", "wpe")):
    ranges = decay_ranges(model.flat.layout, rules)
    mask = _mask(ranges, model.flat.numel)
    return {s.name for s in model.flat.layout if mask[s.offset:s.offset + s.size].all()}, ranges, mask


def _mask(ranges, n):
    m = np.zeros(n, dtype=bool)
    for off, size in ranges:
        m[off:off + size] = True
    return m


def test_gpt_default_decays_exactly_the_weight_matrices():
    for tied in (True, False):
        model = _gpt(tied)
        names, ranges, mask = _decayed_names(model)
        expected = {s.name for s in model.flat.layout if len(s.shape) == 2 and s.name.split(".")[0] not in ("wte", "wpe")}
        assert names == expected
        assert ("lm_head.weight" in names) == (not tied)
        assert mask.sum() == sum(s.size for s in model.flat.layout if s.name in expected)
        # merged: ranges are disjoint, sorted and never touch
        assert all(a[0] + a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_rules_parts_and_whole_names():
    assert rule_matches("bias", "h.0.mlp.c_fc.bias") and not rule_matches("bias", "h.0.mlp.c_fc.weight")
    assert rule_matches("ln_*", "h.1.ln_2.weight") and rule_matches("ln_*", "ln_f.bias")
    assert rule_matches("h.*.attn.c_proj.weight", "h.3.attn.c_proj.weight")
    assert not rule_matches("h.*.attn.c_proj.weight", "h.3.mlp.c_proj.weight")
    names, _, _ = _decayed_names(_gpt(), ["h.*.attn.*"])
    assert names == {s.name for s in _gpt().flat.layout if ".attn." not in s.name}
    assert _decayed_names(_gpt(), [])[2].all()  # no rules: everything decays


def test_mlp_default_leaves_biases_alone():
    m = MLP([4, 6, 3], seed=0, dtype="float64")
    names, _, _ = _decayed_names(m)
    assert names == {"fc0.weight", "fc1.weight"}


def test_a_rule_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match=r"optim.no_decay: rule 'lnn_\*' matches no parameter; the parameters are: wte.weight"):
        decay_ranges(_gpt().flat.layout, ["bias", "lnn_*"])
    with pytest.raises(ConfigError, match=r"optim.no_decay\[1\]: '' must be a non-empty"):
        load_config(None, ['optim.no_decay=["bias", ""]'])
    assert load_config(None).optim.no_decay == ["bias", "ln_*", "wte", "wpe"]


@pytest.mark.parametrize("pieces", [
    [(0, 20)], [(3, 9)], [(12, 8), (0, 5)], [(0, 0), (5, 3), (9, 1), (15, 5)]])
def test_local_runs_cover_the_slice_and_follow_the_ranges(pieces):
    decay = [(2, 4), (8, 1), (10, 6)]
    full = _mask(decay, 20)
    local = np.concatenate([full[o:o + s] for o, s in pieces])
    runs = local_runs(decay, pieces, local.size)
    got = np.zeros(local.size, dtype=int) - 1
    for lo, hi, on in runs:
        assert (got[lo:hi] == -1).all()
        got[lo:hi] = on
    np.testing.assert_array_equal(got, local)
    assert all(a[2] != b[2] or a[1] != b[0] for a, b in zip(runs, runs[1:]))  # merged
    with pytest.raises(ValueError, match="hold .* elements, the optimizer was given an array of"):
        local_runs(decay, pieces, local.size + 1)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_one_step_decays_exactly_the_decayed_elements(kind):
    model = _gpt()
    cfg = load_config(None, [f'optim.kind="{kind}"', f"optim.lr={LR}", f"optim.weight_decay={WD}",
                             *(["optim.momentum=0.9"] if kind == "sgd" else [])])  # SGD's key only
    opt = build_optimizer(cfg.optim, layout=model.flat.layout, dtype="float64")
    p0 = model.flat.data.copy()
    opt.step(model.flat.data, np.zeros_like(p0))
    mask = _decayed_names(model)[2]
    np.testing.assert_array_equal(model.flat.data[~mask], p0[~mask])
    np.testing.assert_allclose(model.flat.data[mask], p0[mask] * (1 - LR * WD), rtol=1e-15)


@pytest.mark.parametrize("make", [
    lambda: SGD(lr=LR, momentum=0.9, nesterov=True, weight_decay=WD, dtype="float64"),
    lambda: AdamW(lr=LR, betas=(0.9, 0.99), weight_decay=WD, dtype="float64")])
def test_sliced_optimizers_equal_the_full_one(make):
    """Two 'ZeRO ranks' owning disjoint pieces (one owns two, concatenated) and a 'PS
    shard' step exactly like the full-buffer optimizer, restricted to their pieces."""
    rng = np.random.default_rng(0)
    n = 40
    decay = [(3, 7), (15, 2), (20, 14)]
    full_p = rng.standard_normal(n)
    grads = [rng.standard_normal(n) for _ in range(3)]
    full = make()
    full.set_decay_ranges(decay)
    owners = [[(0, 12), (30, 10)], [(12, 18)]]
    sliced = []
    for pieces in owners:
        opt = make()
        opt.set_decay_ranges(decay)
        opt.set_slice(pieces)
        sliced.append((opt, pieces, np.concatenate([full_p[o:o + s] for o, s in pieces])))
    for g in grads:
        full.step(full_p, g)
        for opt, pieces, p in sliced:
            opt.step(p, np.concatenate([g[o:o + s] for o, s in pieces]))
    for _, pieces, p in sliced:
        np.testing.assert_array_equal(p, np.concatenate([full_p[o:o + s] for o, s in pieces]))
    # and the groups matter: without them the result differs
    plain, q = make(), rng.standard_normal(n)
    q2 = q.copy()
    plain.step(q, grads[0])
    grouped = make()
    grouped.set_decay_ranges(decay)
    grouped.step(q2, grads[0])
    assert not np.array_equal(q, q2)


def test_no_ranges_or_no_decay_is_one_update():
    opt = AdamW(lr=LR, weight_decay=WD, dtype="float64")
    assert opt.decay_runs(10) == [(0, 10, WD)]
    opt.set_decay_ranges([(2, 3)])
    assert opt.decay_runs(10) == [(0, 2, 0.0), (2, 5, WD), (5, 10, 0.0)]
    opt.weight_decay = 0.0
    assert opt.decay_runs(10) == [(0, 10, 0.0)]
