"""``hpcdp scale``: the study's arithmetic, and one real sweep over 1 and 2 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.launch import LaunchError, find_mpiexec
from hpcdp.scale.study import add_measured_efficiency, study_ranks

ROOT = Path(__file__).resolve().parents[2]

TINY = """
[run]
name = "scale-test"
dtype = "float32"
[model]
kind = "mlp"
sizes = [8, 16, 3]
[data]
kind = "synthetic_classification"
n_samples = 256
n_features = 8
n_classes = 3
[train]
steps = 4
global_batch = 8
[optim]
kind = "sgd"
lr = 0.05
[parallel]
strategy = "ddp"
[parallel.ddp]
bucket_mb = 0.0001
"""


def test_parse_ranks_adds_the_one_rank_baseline():
    assert study_ranks("4,2") == [1, 2, 4]
    assert study_ranks("1,2,2") == [1, 2]
    for bad in ("", "0,2", "two"):
        with pytest.raises(LaunchError, match="--ranks"):
            study_ranks(bad)


def test_efficiency_is_throughput_over_k_times_one_rank():
    pts = [{"ranks": 1, "samples_per_s": 100.0}, {"ranks": 2, "samples_per_s": 180.0},
           {"ranks": 4, "samples_per_s": 200.0}]
    add_measured_efficiency(pts)
    assert [p["efficiency"] for p in pts] == [1.0, 0.9, 0.5]


def test_scale_sweep_writes_table_json_and_plot(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "hpcdp.cli", "scale", "--config", str(cfg), "--ranks", "1,2",
           "--steps", "4", "--warmup", "1", "--repeats", "2", "--variants", "bucketed,no_overlap",
           "--out", str(out)]
    assert Path(find_mpiexec()).exists()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((out / "scale.json").read_text())
    weak = {(p["variant"], p["ranks"]): p for p in res["weak"]}
    strong = {(p["variant"], p["ranks"]): p for p in res["strong"]}
    assert set(weak) == {("bucketed", 1), ("bucketed", 2), ("no_overlap", 2)}
    assert weak[("bucketed", 2)]["global_batch"] == 16 and strong[("bucketed", 2)]["global_batch"] == 8
    assert weak[("bucketed", 1)]["efficiency"] == 1.0
    for p in res["weak"] + res["strong"]:  # two rounds; each point keeps its fastest
        assert len(p["repeats_step_time_s"]) == 2
        assert p["step_time_s"] == min(p["repeats_step_time_s"])
    numel = 8 * 16 + 16 + 16 * 3 + 3
    for p in (weak[("bucketed", 2)], weak[("no_overlap", 2)], strong[("bucketed", 2)]):
        # two ranks: each sends exactly n elements per bucket (2n - |c0| - |c1|), any split
        assert p["grad_bytes_sent"] == numel * 4
        assert p["samples_per_s"] > 0 and 0 <= p["comm_exposed_s"] <= p["comm_s"] + 1e-9
    assert weak[("no_overlap", 2)]["comm_hidden_s"] == 0
    assert [c["over"] for c in res["variant_speedup"]] == ["no_overlap"]
    table = (out / "scale.txt").read_text()
    assert "weak" in table and "strong" in table and "no_overlap" in table
    assert (out / "scale.png").stat().st_size > 0


def test_scale_rejects_bad_arguments(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for extra, msg in ((["--study", "diagonal"], "--study"), (["--variants", "magic"], "magic"),
                       (["--steps", "2", "--warmup", "2"], "--steps"),
                       (["--repeats", "0"], "--repeats"),
                       (["--launcher", "srun -n 4"], "{n}")):
        proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "scale", "--config", str(cfg),
                               *extra], env=env, capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert proc.returncode != 0 and msg in proc.stderr, proc.stderr


def test_the_plots_draw_every_variant_and_both_studies(tmp_path):
    """scale.png from a study with three weak variants, an efficiency *gained* by
    contention (a negative loss) and the shared one-rank point; memory.png with four
    strategies that coincide at N = 1: both render, and every series is drawn."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from hpcdp.scale.report import plot
    from hpcdp.scale.zero_study import _plot_memory

    def pt(variant, k, t, eff):
        return {"variant": variant, "ranks": k, "step_time_s": t, "efficiency": eff,
                "loss_contention": None if k == 1 else -0.2, "loss_comm": None if k == 1 else 0.5,
                "comm_exposed_s": 0.001 * k, "comm_hidden_s": 0.002 * k}
    weak = [pt("bucketed", 1, 0.01, 1.0)] + [pt(v, k, 0.012 * k, 0.8 / k) for k in (2, 4)
                                              for v in ("bucketed", "per_param", "no_overlap")]
    strong = [pt("bucketed", k, 0.01 / k, 0.9 / k) for k in (1, 2, 4)]
    drawn = []
    real_close = plt.close

    def keep(fig):  # look at what was drawn before the figure goes
        drawn.append([sorted(t.get_text() for t in (ax.get_legend().get_texts() if ax.get_legend() else []))
                      for ax in fig.axes])
        real_close(fig)
    plt.close = keep
    try:
        assert plot({"weak": weak, "strong": strong, "baseline": [], "title": "t"}, tmp_path / "scale.png") is None
        points = [{"strategy": s, "ranks": k, "formula_bytes": [1e6 / k], "mem_persistent_bytes": [1e6 / k],
                   "mem_peak_bytes": [1.2e6 / k]} for s in ("ddp", "zero1", "zero2", "zero3") for k in (1, 2)]
        _plot_memory({"points": points, "config": "c", "params": 10, "dtype": "float32", "optimizer": "adamw"},
                     tmp_path / "memory.png")
    finally:
        plt.close = real_close
    step_time, efficiency, where, _ = drawn[0]
    for v in ("bucketed", "per_param", "no_overlap"):
        assert f"weak {v} measured" in step_time and f"weak {v}" in efficiency
    assert "strong bucketed measured" in step_time
    assert any("contention" in t for t in where)
    assert "zero3 peak (with working buffers)" in drawn[1][0]
    assert (tmp_path / "scale.png").stat().st_size > 0 and (tmp_path / "memory.png").stat().st_size > 0
