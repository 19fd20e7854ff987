"""Goodput with failures (hpcdp.scale.goodput): the formulas against the policies played
out step by step against random failures (seeded; about a second in all)."""

from __future__ import annotations

import json
import math
from argparse import Namespace

import pytest

from hpcdp.scale import goodput as G

MTTFS = (1800.0, 7200.0, 28800.0)   # the job's mean time to failure, s
SAVES = (10.0, 60.0, 300.0)         # a save's cost, s
RESTART = 120.0


@pytest.mark.parametrize("M", MTTFS)
@pytest.mark.parametrize("delta", SAVES)
def test_classic_goodput_formula_matches_the_policy_played_out(M, delta):
    k = 10                                  # steps per checkpoint interval
    step = G.daly_interval(delta, M) / k
    formula = G.classic_goodput(k * step, delta, RESTART, M)
    played = G.simulate_classic(k, step, delta, RESTART, M, failures=2000, seed=7)
    assert played == pytest.approx(formula, rel=0.02)


def test_the_simulation_can_tell_a_wrong_formula():
    """The first-order estimate 1 - delta/tau - tau/(2M) - R/M (no failures during saves
    and restarts, no second order) is off by more than 2% where M is short: the check
    above has the power to catch a formula of that quality."""
    M, delta, k = 1800.0, 300.0, 10
    tau = G.daly_interval(delta, M)
    played = G.simulate_classic(k, tau / k, delta, RESTART, M, failures=2000, seed=7)
    naive = 1 - delta / tau - tau / (2 * M) - RESTART / M
    assert abs(played / naive - 1) > 0.02
    assert played == pytest.approx(G.classic_goodput(tau, delta, RESTART, M), rel=0.02)


@pytest.mark.parametrize("node_mttf_h", (24.0, 168.0))
@pytest.mark.parametrize("nodes", (16, 128))
@pytest.mark.parametrize("repair", (3.0, 60.0))
def test_continue_goodput_formula_matches_the_policy_played_out(node_mttf_h, nodes, repair):
    node_mttf, step, rejoin = node_mttf_h * G.HOUR, 1.0, 600.0
    formula = G.continue_goodput(node_mttf / nodes, repair, step, rejoin, 1 / nodes)
    played = G.simulate_continue(step, repair, rejoin, nodes, node_mttf, failures=2000, seed=3)
    assert played == pytest.approx(formula, rel=0.02)
    # what it loses is what the formula says it loses (the stricter check: the loss)
    assert (1 - played) == pytest.approx(1 - formula, rel=0.25, abs=2e-4)


def test_young_daly_and_the_exact_optimum():
    M, delta = 8 * G.HOUR, 30.0
    young, daly = G.young_interval(delta, M), G.daly_interval(delta, M)
    assert young == pytest.approx(math.sqrt(2 * delta * M))
    assert daly == pytest.approx(young, rel=0.05)          # delta << M: the two agree
    best = G.best_interval(delta, RESTART, M)
    assert best == pytest.approx(daly, rel=0.02)           # Daly's estimate is near the optimum
    g = lambda t: G.classic_goodput(t, delta, RESTART, M)  # noqa: E731
    assert g(best) >= g(daly) >= g(2 * young) and g(best) >= g(young / 2)
    assert G.daly_interval(3 * M, M) == M                   # a save longer than 2M: every M
    stepped = G.best_interval(delta, RESTART, M, step_s=7.0)
    assert stepped / 7.0 == pytest.approx(round(stepped / 7.0))


def test_plan_per_rank_count_and_the_save_from_hpcdp_bench_ckpt(tmp_path):
    bench = tmp_path / "ckpt.json"
    bench.write_text(json.dumps({"bandwidth": [], "stall": [
        {"mode": "sync", "stall_s": 2.5}, {"mode": "thread", "stall_s": 0.4}]}))
    assert G.save_s_from_bench(str(bench))[0] == 0.4           # the mode that stalls least
    assert G.save_s_from_bench(str(bench), "sync")[0] == 2.5
    with pytest.raises(ValueError, match="no stall rows of mode process"):
        G.save_s_from_bench(str(bench), "process")
    rows = G.plan([4, 64, 1024, 4096], 4, 5000 * G.HOUR, 2.5, 300.0, lambda n: 0.2 + 1e-6 * n)
    assert [r.nodes for r in rows] == [1, 16, 256, 1024]
    classic = [r.goodput_classic for r in rows]
    assert classic == sorted(classic, reverse=True) and classic[-1] < 0.99 < classic[0]
    for r in rows:  # keeping on through a rank loss beats the restart whenever repair << restart
        assert r.goodput_continue > r.goodput_classic
        assert r.interval_s == pytest.approx(r.interval_steps * r.step_s)
    with pytest.raises(ValueError, match="fatal-fraction 1.5"):
        G.plan([4], 4, 1e6, 2.5, 300.0, lambda n: 0.2, fatal_fraction=1.5)
    with pytest.raises(ValueError, match="MTTF must be > 0"):
        G.plan([4], 4, -1.0, 2.5, 300.0, lambda n: 0.2)
    # a continuing job that cannot survive any failure is the classic job
    (one,) = G.plan([64], 4, 100 * G.HOUR, 2.5, 300.0, lambda n: 0.2, fatal_fraction=1.0)
    assert one.goodput_continue < one.goodput_classic + 1e-9
    text = G.format_plan(rows, 5000 * G.HOUR, 2.5, 300.0, 3.0, 300.0, "test")
    assert "Daly" in text and "4096" in text


def test_predict_with_a_node_mttf_adds_the_goodput_table(tmp_path):
    from hpcdp.scale.predict import goodput_of

    res = {"ranks_per_node": 4, "rows": [{"strategy": "ddp-auto", "ranks": n, "step_s": 0.1}
                                         for n in (1, 64, 4096)]}
    args = Namespace(goodput_strategy="", ckpt_bench="", ckpt_mode="", ckpt_save_s=5.0, node_mttf_h=8760.0,
                     restart_s=300.0, rejoin_s=None, repair_s=3.0, fatal_fraction=0.0)
    out, text = goodput_of(args, res)
    assert [r["ranks"] for r in out["rows"]] == [1, 64, 4096] and "classic" in text
    with pytest.raises(ValueError, match="needs the time a checkpoint save costs"):
        goodput_of(Namespace(**{**vars(args), "ckpt_save_s": None}), res)
