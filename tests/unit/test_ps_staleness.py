"""Staleness bound and the server's clock logic (pure, no MPI)."""

import random

import pytest

from hpcdp.strategies.ps.staleness import (ServerClock, StalenessBound, StalenessError,
                                           parse_staleness)


@pytest.mark.parametrize("raw, k", [(0, 0), (3, 3), (None, None), ("none", None),
                                    ("unbounded", None), ("INF", None), ("2", 2)])
def test_parse_staleness_accepts_ints_and_unbounded(raw, k):
    assert parse_staleness(raw) == k


@pytest.mark.parametrize("raw", [-1, "-3", 1.5, True, "often", [1]])
def test_parse_staleness_rejects_with_a_message_naming_the_key(raw):
    with pytest.raises(ValueError, match="parallel.ps.staleness"):
        parse_staleness(raw)


def test_negative_k_message_says_what_to_use():
    with pytest.raises(ValueError, match="negative.*k >= 0"):
        parse_staleness(-2)


def test_min_version_is_the_issue_rule():
    # k = 1: step 12 may start once the updates of steps <= 10 are in (version 11).
    b = StalenessBound(1)
    assert b.min_version(12) == 11
    assert not b.may_start(12, 10) and b.may_start(12, 11)
    # k = 0: before step t, version t (synchronous).
    assert [StalenessBound(0).min_version(t) for t in range(4)] == [0, 1, 2, 3]
    # the first k steps never wait
    assert [StalenessBound(3).min_version(t) for t in range(6)] == [0, 0, 0, 0, 1, 2]
    assert StalenessBound(None).min_version(10**6) == 0


def test_allows():
    assert StalenessBound(2).allows(2) and not StalenessBound(2).allows(3)
    assert not StalenessBound(None).allows(-1) and StalenessBound(None).allows(10**9)


def test_update_applied_only_when_all_workers_pushed_and_in_worker_order():
    c = ServerClock(3, StalenessBound(1))
    c.push(2, 0, 0, "g2")
    c.push(0, 0, 0, "g0")
    assert not c.ready()
    c.push(1, 0, 0, "g1")
    assert c.ready()
    assert c.pop_ready() == (0, ["g0", "g1", "g2"])
    assert c.version == 1 and not c.ready()


def test_fast_worker_runs_ahead_within_bound_and_staleness_recorded():
    c = ServerClock(2, StalenessBound(2))
    # worker 0 computes steps 0, 1, 2 from version 0 (k = 2 allows step 2 at version 0)
    for t in range(3):
        c.push(0, t, 0, f"a{t}")
    # step 3 from version 0 would have staleness 3 > k
    with pytest.raises(StalenessError, match="staleness 3 exceeds k = 2"):
        c.push(0, 3, 0, "bad")
    c.push(1, 0, 0, "b0")
    assert c.pop_ready() == (0, ["a0", "b0"])
    c.push(1, 1, 1, "b1")
    assert c.pop_ready() == (1, ["a1", "b1"])
    assert [(a.update, a.worker, a.staleness) for a in c.applied] == [
        (0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 0)]


def test_protocol_errors():
    c = ServerClock(2, StalenessBound(None))
    with pytest.raises(StalenessError, match="expected step 0"):
        c.push(0, 1, 0, None)
    with pytest.raises(StalenessError, match="newer than the server"):
        c.push(0, 0, 1, None)
    with pytest.raises(StalenessError, match="unknown worker"):
        c.push(5, 0, 0, None)
    with pytest.raises(StalenessError, match="not complete"):
        c.pop_ready()
    with pytest.raises(ValueError, match="at least one worker"):
        ServerClock(0, StalenessBound(0))


def test_finish_checks_counts_and_leftovers():
    c = ServerClock(2, StalenessBound(None))
    c.push(0, 0, 0, "a")
    c.finish(0, 1)
    with pytest.raises(StalenessError, match="after it said done"):
        c.push(0, 1, 0, "late")
    with pytest.raises(StalenessError, match="have not finished"):
        c.check_finished()
    c.finish(1, 0)
    with pytest.raises(StalenessError, match="different numbers of steps"):
        c.check_finished()
    with pytest.raises(StalenessError, match="said done twice"):
        c.finish(0, 1)
    d = ServerClock(1, StalenessBound(0))
    d.push(0, 0, 0, "a")
    with pytest.raises(StalenessError, match="said done after 3 steps but pushed 1"):
        d.finish(0, 3)


def test_random_schedules_never_exceed_k_and_apply_everything():
    """Simulate W workers with random speeds obeying the worker rule; the server clock
    never sees a violation and records staleness <= k for every gradient."""
    for k in (0, 1, 2, 4, None):
        rng = random.Random(k if k is not None else 99)
        W, T = 3, 12
        bound = StalenessBound(k)
        c = ServerClock(W, bound)
        step = [0] * W
        while not all(s == T for s in step):
            w = rng.randrange(W)
            if step[w] < T and bound.may_start(step[w], c.version):
                # worker w computes from the newest version it may see
                c.push(w, step[w], c.version - rng.randint(0, c.version - bound.min_version(step[w]))
                       if c.version > bound.min_version(step[w]) else c.version, None)
                step[w] += 1
            while c.ready():
                c.pop_ready()
        for w in range(W):
            c.finish(w, T)
        assert c.check_finished() == T
        assert len(c.applied) == W * T
        assert all(bound.allows(a.staleness) for a in c.applied)
        if k == 0:
            assert all(a.staleness == 0 for a in c.applied)


# -- staleness-aware learning rate ---------------------------------------------------

def test_stale_factors_never_touch_staleness_0_and_1():
    from hpcdp.strategies.ps.staleness import stale_factors
    for rule in ("relative", "inverse", "none"):
        assert stale_factors([0, 1, 0, 1], rule) is None  # k = 0 and k = 1: bit for bit


def test_inverse_is_one_over_max_1_s():
    from hpcdp.strategies.ps.staleness import stale_factors
    assert stale_factors([0, 2, 4, 1], "inverse") == [1.0, 0.5, 0.25, 1.0]
    assert stale_factors([3, 3], "inverse") == [1 / 3, 1 / 3]


def test_relative_keeps_the_updates_lr_and_damps_stale_against_fresh():
    from hpcdp.strategies.ps.staleness import stale_factors
    f = stale_factors([0, 2, 4, 1], "relative")
    assert sum(f) == pytest.approx(4.0)                 # mean 1: the update keeps its lr
    assert f[0] / f[1] == pytest.approx(2.0) and f[0] / f[2] == pytest.approx(4.0)
    assert f[0] == f[3]                                 # s = 0 and s = 1 are both "fresh"
    assert stale_factors([3, 3, 3], "relative") is None  # equally stale: nothing to re-weight
    assert stale_factors([5, 2], "none") is None


def test_damp_stale_scales_in_place_before_aggregation():
    import numpy as np

    from hpcdp.strategies.ps.staleness import damp_stale
    grads = [np.full(3, 8.0, dtype=np.float32), np.full(3, 8.0, dtype=np.float32)]
    keep = grads[0]
    damp_stale(grads, [1, 4], "inverse")
    assert grads[0] is keep and (grads[0] == 8.0).all() and (grads[1] == 2.0).all()
    assert grads[1].dtype == np.float32
    damp_stale(grads, [0, 0], "relative")               # no-op: bit-identical
    assert (grads[0] == 8.0).all() and (grads[1] == 2.0).all()


@pytest.mark.parametrize("raw", ["inv", "", None, 1])
def test_check_stale_lr_names_the_key_and_choices(raw):
    from hpcdp.strategies.ps.staleness import check_stale_lr
    with pytest.raises(ValueError, match="parallel.ps.stale_lr: .* choose one of 'relative', 'inverse', 'none'"):
        check_stale_lr(raw)


def test_records_stay_bounded_however_long_the_run():
    from hpcdp.strategies.ps.staleness import Recent

    r = Recent(keep=5)
    for i in range(23):
        r.append(i)
    assert r.total == 23 and 5 <= len(r) < 10 and r[-1] == 22 and r == list(range(23 - len(r), 23))
    c = ServerClock(2, StalenessBound(0))
    c.applied = Recent(keep=3)
    for t in range(50):
        c.push(0, t, t, None)
        c.push(1, t, t, None)
        c.pop_ready()
    assert c.version == 50 and len(c.applied) < 6 and c.applied[-1].update == 49
