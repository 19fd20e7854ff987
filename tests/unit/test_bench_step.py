"""bench step's contenders do the same work: same first loss, and the hand-written NumPy
MLP takes the same steps as hpcdp (so the timing ratio compares like with like)."""

import numpy as np

from hpcdp.bench import step_time as bench


def test_numpy_reference_mlp_follows_hpcdp_for_several_steps(monkeypatch):
    monkeypatch.setattr(bench, "MLP_SIZES", [20, 16, 12, 5])
    monkeypatch.setattr(bench, "MLP_BATCH", 9)
    x, y = bench._mlp_batch(np.random.default_rng(1))
    h_step, weights = bench.hpcdp_mlp(x, y)
    n_step = bench.numpy_mlp(x, y, weights)
    losses = [(h_step(), n_step()) for _ in range(4)]
    np.testing.assert_allclose([a for a, _ in losses], [b for _, b in losses], rtol=1e-5)
    assert losses[-1][0] < losses[0][0]  # it trains


def test_measure_reports_medians_for_every_contender(monkeypatch):
    monkeypatch.setattr(bench, "MLP_SIZES", [20, 16, 5])
    monkeypatch.setattr(bench, "MLP_BATCH", 8)
    monkeypatch.setattr(bench, "GPT", dict(vocab_size=7, block_size=5, n_layer=1, n_head=2, n_embd=8))
    monkeypatch.setattr(bench, "GPT_BATCH", 3)
    monkeypatch.setattr(bench, "_torch", lambda: None)  # as without PyTorch (CI): no import cost
    res = bench.measure(1, ["mlp", "gpt"], warmup=1, repeats=3)
    times = res["models"]["mlp"]["times"]
    assert set(times) == {"hpcdp", "numpy"} and res["torch"] is None
    for t in list(times.values()) + list(res["models"]["gpt"]["times"].values()):
        assert t["repeats"] == 3 and 0 < t["min_s"] <= t["median_s"]


def test_the_table_says_why_torch_shows_a_dash():
    rows = [{"threads": 1, "torch": None, "models": {"mlp": {"times": {
        "hpcdp": {"median_s": 2e-3, "q1_s": 1e-3, "q3_s": 3e-3}, "numpy": {"median_s": 1e-3, "q1_s": 1e-3,
                                                                          "q3_s": 1e-3}}}}}]
    table = bench._table(rows) + bench.torch_note(rows)
    assert "2.00x" in table and "PyTorch is not installed" in table.splitlines()[-1]
    assert bench.torch_note([{**rows[0], "torch": "2.13.0"}]) == ""
