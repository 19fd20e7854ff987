"""The autograd's op profile: its op times fit inside the step, every op kind of the GPT
appears (forward and backward), and a step with the profile on computes the same bits
as with it off."""

import time
from pathlib import Path

import numpy as np
import pytest

from hpcdp.autograd.profile import OpProfile
from hpcdp.autograd.tensor import active_profile
from hpcdp.bench import step_time as bench

JOBS = Path(bench.__file__).resolve().parents[2] / "jobs"
TINY = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8)


def _tiny(monkeypatch):
    monkeypatch.setattr(bench, "GPT", dict(TINY))
    monkeypatch.setattr(bench, "GPT_BATCH", 3)
    x, y = bench._gpt_batch(np.random.default_rng(3))
    step, _n = bench.hpcdp_gpt(x, y)
    return step


def test_profile_covers_every_op_and_fits_in_the_step(monkeypatch):
    step = _tiny(monkeypatch)
    prof = OpProfile()
    t0 = time.perf_counter()
    for _ in range(2):
        step.profiled(prof)
    wall = time.perf_counter() - t0
    assert active_profile() is None  # the context ended it
    rows = prof.rows()
    assert 0 < prof.total_seconds() <= wall
    seen = {(r["phase"], r["op"]) for r in rows}
    for name in ("embedding", "add", "layer_norm", "linear", "reshape", "matmul",
                 "causal_self_attention_qkv", "cross_entropy"):
        assert ("forward", name) in seen, name
        assert ("backward", name) in seen, name
    assert {("region", "optimizer"), ("region", "zero_grad")} <= seen
    groups = {bench.hpcdp_group(r["op"], r["within"]) for r in rows}
    assert {"matmul", "layer norm", "attention", "residual add", "embedding", "loss",
            "optimizer"} <= groups
    # bytes: at least every op's output once
    assert all(r["bytes"] > 0 for r in rows if r["phase"] != "region")
    # 2 steps: each op of one step counted twice (the tiny GPT has 2 blocks)
    ln = [r for r in rows if (r["phase"], r["op"]) == ("forward", "layer_norm")][0]
    assert ln["calls"] == 2 * (2 * TINY["n_layer"] + 1)


def test_the_profile_changes_no_bit_of_the_training(monkeypatch):
    from hpcdp.nn import build_model
    from hpcdp.optim import AdamW

    monkeypatch.setattr(bench, "GPT", dict(TINY))
    monkeypatch.setattr(bench, "GPT_BATCH", 3)
    x, y = bench._gpt_batch(np.random.default_rng(3))
    losses, params = {}, {}
    for on in (False, True):
        model = build_model({"kind": "gpt", **TINY, "seed": 0}, dtype="float32", device="cpu")
        opt = AdamW(model.flat.numel, lr=1e-2, weight_decay=0.01, dtype="float32")
        step = bench._train_step(model, opt, x, y)
        prof = OpProfile()
        if on:  # train_step itself under the profile, and the profiled step's own calls
            with prof:
                losses[on] = [step()]
            losses[on] += [step.profiled(prof), step.profiled(prof)]
        else:
            losses[on] = [step() for _ in range(3)]
        params[on] = np.asarray(model.flat.data).copy()
        if on:
            assert prof.rows()
    assert losses[True] == losses[False]
    assert params[True].tobytes() == params[False].tobytes()


def test_the_profile_table_reads_group_by_group(monkeypatch):
    step = _tiny(monkeypatch)
    hp = bench.profile_hpcdp(step.profiled, 2)
    assert sum(hp["groups"]["matmul"]["forward"][:1]) > 0 and hp["groups"]["optimizer"]["optimizer"][0] > 0
    like_torch = {"step_s": 2 * hp["step_s"], "groups": hp["groups"],
                  "ops": [{"phase": "backward", "op": "aten::mm", "seconds": 1e-3}]}
    table = bench.profile_table(hp, like_torch)
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines()}
    assert set(bench.GROUPS) | {"Python/other", "step"} <= set(rows)
    assert rows["matmul"].rstrip().endswith("1.00x") and rows["step"].rstrip().endswith("0.50x")
    assert "aten::mm" in bench.top_ops(hp, like_torch)
    assert bench.torch_group("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert bench.torch_group("aten::addmm") == "matmul" and bench.torch_group("aten::gelu_backward") == "GELU"


@pytest.mark.parametrize("argv, says", [
    (["--models", "mlp", "--profile"], "add gpt to --models"),
    (["--models", "gpt", "--profile", "--torch-python", "/no/python"], "not an executable file"),
    (["--models", "gpt", "--gpt-config", "/no/job.toml"], "cannot read it"),
    (["--models", "gpt", "--gpt-config", str(JOBS / "digits_ddp.toml")], 'kind must be "gpt"'),
])
def test_bad_profile_options_say_what_to_do(monkeypatch, argv, says):
    monkeypatch.setattr(bench, "GPT", dict(TINY))
    with pytest.raises(ValueError, match=says):
        bench.main(argv)
