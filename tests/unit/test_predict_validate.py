"""hpcdp scale --predict (model only, in process) and the validation summary."""

from __future__ import annotations

import json

import pytest

from hpcdp.commands.scale import main as scale_main
from hpcdp.scale.validate import (collective_points, format_validation, point_statistic,
                                  repeat_statistic, summarize)

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
    # the crossover in bytes per rank count: example-cluster's 15 us per message against
    # its 4 us alpha, software-bound below ~ N x 275 KB
    wire = res["crossovers"]["ring_wire_bound_from_bytes"]
    assert sorted(int(n) for n in wire) == [2, 4, 8, 16, 32, 64]
    assert wire["64"] > wire["32"] > 32 * 4 and "bound by the wire, not hpcdp's software" in \
        (out / "predict.txt").read_text()
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


def test_the_repeat_statistic_drops_a_rate_limited_links_burst():
    # the quiet cross-link run's ring 32 KiB repeats (us): four at tbf's rate, one that
    # started with the 256 KB token bucket full (docs/results.md)
    burst = [271.7, 274.6, 274.6, 134.3, 274.5]
    assert repeat_statistic(burst, "fastest") == 134.3
    assert repeat_statistic(burst, "median") == 274.5
    assert repeat_statistic(burst, "steady", rate_floor_s=275.0) == 271.7  # the burst dropped
    # small messages: the floor (bytes at the rate) is ~0, noise only slows: the fastest
    noisy = [155.5, 99.9, 90.0, 96.2, 102.6]
    assert repeat_statistic(noisy, "steady", rate_floor_s=0.07) == 90.0
    assert repeat_statistic(noisy, "steady") == repeat_statistic(noisy, "fastest")
    assert repeat_statistic([10.0, 11.0, 30.0], "steady", rate_floor_s=100.0) == 11.0  # all below: median
    with pytest.raises(ValueError, match="no samples"):
        repeat_statistic([], "median")
    with pytest.raises(ValueError, match="fastest, steady, median"):
        repeat_statistic([1.0], "mean")
    # auto: steady where the ranks span nodes, the fastest within one
    assert point_statistic("auto", 2, 1) == "steady" and point_statistic("auto", 2, 2) == "fastest"
    assert point_statistic("median", 2, 2) == "median"
    with pytest.raises(ValueError, match="--statistic"):
        point_statistic("best", 2, 2)


def test_validation_points_across_a_rate_limited_link_skip_the_burst():
    from hpcdp.comm.model.cost import Link, Profile

    link = Link(alpha_s=50e-6, beta_s_per_byte=8.4e-9)  # 1 Gbit/s (tbf), as the emulated cluster
    prof = Profile(name="tbf", intra=link, inter=link, gamma_s_per_byte=0.0, call_s={"ring": 0.0},
                   msg_s=0.0, ctrl_msg_s=0.0, flops_per_s=1e9, optimizer_s_per_param=0.0)
    bench = {"rows": [{"algorithm": "ring", "size": 32768,
                       "samples_us": [271.7, 274.6, 274.6, 134.3, 274.5]}]}
    across = collective_points(prof, bench, 2, 1, 2)[0]
    within = collective_points(prof, bench, 2, 2, 2)[0]
    assert across["statistic"] == "steady" and across["measured_s"] == pytest.approx(271.7e-6)
    assert within["statistic"] == "fastest" and within["measured_s"] == pytest.approx(134.3e-6)
    assert collective_points(prof, bench, 2, 1, 2, statistic="fastest")[0]["measured_s"] == \
        pytest.approx(134.3e-6)


def test_zero_step_study_puts_the_model_beside_each_point():
    """--study zero-step --profile P: every strategy's measured step gets the model's
    prediction of that strategy and algorithm (ZeRO's groups from parallel.zero.bucket_mb)."""
    from argparse import Namespace

    from hpcdp.comm.model.cost import load_profile
    from hpcdp.config import load_config
    from hpcdp.scale import model as M
    from hpcdp.scale.zero_study import predict_steps, strategies_for

    sets = ["parallel.zero.bucket_mb=0.25"]
    args = Namespace(config="jobs/gpt_ddp.toml", set=sets, batch=8, ranks_per_node=None)
    table = strategies_for("ring,recursive")
    points = [{"strategy": s, "ranks": 2, "step_time_s": 0.1} for s in ("ddp", "zero3", "zero2-recursive")]
    predict_steps(args, points, table, "dev-vm-2core")
    prof = load_profile("dev-vm-2core")
    zwl = M.workload_from_config(load_config("jobs/gpt_ddp.toml", sets + ["parallel.ddp.bucket_mb=0.25"],
                                             shared_options=True))
    assert len(zwl.buckets) > len(M.workload_from_config(load_config("jobs/gpt_ddp.toml", sets,
                                                                     shared_options=True)).buckets)
    for p, (strategy, algo) in zip(points, (("ddp", None), ("zero3", "ring"), ("zero2", "recursive"))):
        if strategy != "ddp":
            want = M.step(prof, zwl, strategy, 2, 4.0, algorithm=algo, per_node=2).step_s
            assert p["pred_step_s"] == pytest.approx(want, rel=1e-12)
        assert p["pred_error"] == pytest.approx(0.1 / p["pred_step_s"] - 1)
    # hybrid sharding (parallel.zero.shard = "node"): the model's hybrid stage, nodes of
    # --ranks-per-node ranks
    hyb = Namespace(config="jobs/gpt_ddp.toml", set=sets + ['parallel.zero.shard="node"'], batch=8,
                    ranks_per_node=1)
    pts = [{"strategy": "zero3", "ranks": 2, "step_time_s": 0.1}]
    predict_steps(hyb, pts, table, "dev-vm-2core")
    assert pts[0]["pred_strategy"] == "hybrid3"
    assert pts[0]["pred_step_s"] == pytest.approx(M.step(prof, zwl, "hybrid3", 2, 4.0, per_node=1).step_s, rel=1e-12)
