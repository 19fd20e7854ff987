"""hpcdp scale --predict (model only, in process) and the validation summary."""

from __future__ import annotations

import json

import pytest

from hpcdp.commands.scale import main as scale_main
from hpcdp.scale.validate import format_validation, summarize

GPT = """
[model]
kind = "gpt"
vocab_size = 16
block_size = 8
n_layer = 2
n_head = 2
n_embd = 16
[data]
kind = "synthetic_sequence"
vocab_size = 16
seq_len = 8
[train]
global_batch = 4
[optim]
kind = "adamw"
[parallel]
strategy = "ddp"
[parallel.ddp]
bucket_mb = 0.01
"""


def test_predict_writes_table_json_plot(tmp_path, capsys):
    cfg = tmp_path / "gpt.toml"
    cfg.write_text(GPT)
    out = tmp_path / "pred"
    assert scale_main(["--predict", "--profile", "example-cluster", "--config", str(cfg),
                       "--ranks", "1,2,4,...,64", "--strategies", "ddp-ring,ddp-auto,ps2,zero3",
                       "--out", str(out)]) == 0
    res = json.loads((out / "predict.json").read_text())
    rows = {(r["strategy"], r["ranks"]): r for r in res["rows"]}
    assert {s for s, _ in rows} == {"ddp-ring", "ddp-auto", "ps2", "zero3"}
    assert sorted(n for s, n in rows if s == "ddp-ring") == [1, 2, 4, 8, 16, 32, 64]
    assert sorted(n for s, n in rows if s == "ps2") == [2, 4, 8, 16, 32, 64]  # K <= N
    assert rows[("ddp-ring", 1)]["weak_efficiency"] == 1.0
    for r in res["rows"]:
        assert r["step_s"] >= r["compute_s"] > 0 and 0 < r["weak_efficiency"] <= 1.0 + 1e-12
        assert 0 < r["strong_efficiency"] <= 1.0 + 1e-12
    # weak efficiency of the flat ring only falls as N grows (more steps, same compute)
    effs = [rows[("ddp-ring", n)]["weak_efficiency"] for n in (1, 2, 4, 8, 16, 32, 64)]
    assert effs == sorted(effs, reverse=True)
    assert set(res["crossovers"]) >= {"ring_latency_reaches_bandwidth_at",
                                      "hierarchical_beats_ring_from", "parameter_server"}
    assert (out / "predict.png").stat().st_size > 0
    assert "crossovers" in (out / "predict.txt").read_text()


@pytest.mark.parametrize("argv,msg", [
    (["--predict", "--config", "X"], "--profile P is required"),
    (["--predict", "--profile", "nope-profile", "--config", "X"], "no shipped profile"),
    (["--predict", "--profile", "example-cluster", "--config", "X", "--strategies", "ps0"],
     "--strategies"),
    (["--predict", "--profile", "example-cluster", "--config", "X", "--ranks", "1,...,8"],
     "two growing terms"),
])
def test_predict_bad_arguments(tmp_path, argv, msg):
    cfg = tmp_path / "gpt.toml"
    cfg.write_text(GPT)
    argv = [str(cfg) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit, match=msg):
        scale_main(argv + ["--out", str(tmp_path / "o")])


def _pt(kind, err, cal=False, over=False):
    return {"kind": kind, "what": "x", "ranks": 2, "measured_s": 1 + err, "pred_s": 1.0,
            "error": err, "calibration": cal, "oversubscribed": over}


def test_validation_summary_counts_only_held_out_points():
    pts = [_pt("collective", 0.05), _pt("collective", -0.08), _pt("collective", 0.15),
           _pt("collective", 3.0, over=True), _pt("collective", 0.9, cal=True),
           _pt("step", 0.02), _pt("step", -0.25)]
    s = summarize(pts)
    assert s["collective"]["held_out_points"] == 3
    assert s["collective"]["median_abs_error"] == pytest.approx(0.08)
    assert s["collective"]["max_abs_error"] == pytest.approx(0.15)
    assert s["collective"]["within_aim"] is True and s["collective"]["all_points"] == 5
    assert s["step"]["within_aim"] is False  # one point beyond 20%
    text = format_validation({"profile": "p", "load": "load", "points": pts, "summary": s})
    assert "NOT met" in text and "cal (fitted on it)" in text and "* oversubscribed" in text


def test_zero_step_study_puts_the_model_beside_each_point():
    """--study zero-step --profile P: every strategy's measured step gets the model's
    prediction of that strategy and algorithm (ZeRO's groups from parallel.zero.bucket_mb)."""
    from argparse import Namespace

    from hpcdp.comm.cost import load_profile
    from hpcdp.config import load_config
    from hpcdp.scale import model as M
    from hpcdp.scale.zero_study import predict_steps, strategies_for

    sets = ["parallel.zero.bucket_mb=0.25"]
    args = Namespace(config="jobs/gpt_ddp.toml", set=sets, batch=8, ranks_per_node=None)
    table = strategies_for("ring,recursive")
    points = [{"strategy": s, "ranks": 2, "step_time_s": 0.1} for s in ("ddp", "zero3", "zero2-recursive")]
    predict_steps(args, points, table, "dev-vm-2core")
    prof = load_profile("dev-vm-2core")
    zwl = M.workload_from_config(load_config("jobs/gpt_ddp.toml", sets + ["parallel.ddp.bucket_mb=0.25"]))
    assert len(zwl.buckets) > len(M.workload_from_config(load_config("jobs/gpt_ddp.toml", sets)).buckets)
    for p, (strategy, algo) in zip(points, (("ddp", None), ("zero3", "ring"), ("zero2", "recursive"))):
        if strategy != "ddp":
            want = M.step(prof, zwl, strategy, 2, 4.0, algorithm=algo, per_node=2).step_s
            assert p["pred_step_s"] == pytest.approx(want, rel=1e-12)
        assert p["pred_error"] == pytest.approx(0.1 / p["pred_step_s"] - 1)
