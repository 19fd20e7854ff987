"""Bucket planning for DDP: pure logic, no MPI."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from hpcdp.strategies.buckets import (
    ReadyTracker, bucket_cap_elements, plan_buckets,
)


@dataclass
class Spec:
    name: str
    offset: int
    size: int


def layout_of(sizes):
    out, off = [], 0
    for i, s in enumerate(sizes):
        out.append(Spec(f"p{i}", off, s))
        off += s
    return out


def ranges(plan):
    return [(b.offset, b.size) for b in plan.buckets]


def test_large_cap_holds_every_parameter_in_one_bucket():
    plan = plan_buckets(layout_of([3, 5, 2]), cap=100)
    assert ranges(plan) == [(0, 10)]
    assert plan.buckets[0].params == (0, 1, 2)
    assert plan.buckets_of_param == ((0,), (0,), (0,))


def test_per_parameter_mode_is_reverse_layout_order():
    plan = plan_buckets(layout_of([3, 5, 2]), cap=None)
    assert ranges(plan) == [(8, 2), (3, 5), (0, 3)]
    assert [b.params for b in plan.buckets] == [(2,), (1,), (0,)]


def test_parameter_larger_than_cap_is_split_from_its_end():
    # p2 alone; p1 (5 elements) split into [4, 8) and its first element [3, 4),
    # which shares a bucket with p0.
    plan = plan_buckets(layout_of([3, 5, 2]), cap=4)
    assert ranges(plan) == [(8, 2), (4, 4), (0, 4)]
    assert [b.params for b in plan.buckets] == [(2,), (1,), (0, 1)]
    assert plan.buckets_of_param == ((2,), (1, 2), (0,))


def test_cap_of_one_element_gives_one_bucket_per_element():
    plan = plan_buckets(layout_of([2, 3]), cap=1)
    assert ranges(plan) == [(4, 1), (3, 1), (2, 1), (1, 1), (0, 1)]
    assert plan.buckets_of_param == ((3, 4), (0, 1, 2))


def test_empty_parameters_are_skipped():
    plan = plan_buckets(layout_of([2, 0, 3]), cap=None)
    assert ranges(plan) == [(2, 3), (0, 2)]
    assert plan.buckets_of_param[1] == ()


@pytest.mark.parametrize("seed", range(20))
def test_random_layouts_tile_the_buffer(seed):
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(0, 40, size=rng.integers(1, 12))]
    cap = int(rng.integers(1, 60))
    plan = plan_buckets(layout_of(sizes), cap=cap)
    numel = sum(sizes)
    # contiguous, descending, covering [0, numel), none larger than cap
    end = numel
    for b in plan.buckets:
        assert b.offset + b.size == end
        assert 0 < b.size <= cap
        end = b.offset
    assert end == 0
    # membership is exactly "overlaps", and parameters no larger than cap are never split
    lay = layout_of(sizes)
    for b in plan.buckets:
        overl = tuple(i for i, s in enumerate(lay)
                      if s.size and s.offset < b.offset + b.size and b.offset < s.offset + s.size)
        assert b.params == overl
    for i, s in enumerate(lay):
        if 0 < s.size <= cap:
            assert len(plan.buckets_of_param[i]) == 1


def test_tracker_launches_in_order_once_all_overlapping_params_are_ready():
    plan = plan_buckets(layout_of([3, 5, 2]), cap=4)  # buckets: {p2}, {p1}, {p0, p1}
    t = ReadyTracker(plan)
    assert t.mark_ready(2) == [0]
    assert t.mark_ready(1) == [1]      # bucket 2 still waits for p0
    assert t.mark_ready(0) == [2]
    t.reset()
    assert t.mark_ready(0) == []       # bucket 0 not ready: nothing may launch out of order
    assert t.mark_ready(1) == []
    assert t.mark_ready(2) == [0, 1, 2]


def test_tracker_remaining_and_double_fire():
    plan = plan_buckets(layout_of([3, 5, 2]), cap=None)
    t = ReadyTracker(plan)
    assert t.mark_ready(2) == [0]
    assert t.remaining() == [1, 2]     # p1, p0 never fired (no gradient this backward)
    assert t.remaining() == []
    t.reset()
    t.mark_ready(1)
    with pytest.raises(RuntimeError, match="twice"):
        t.mark_ready(1)


def test_bucket_cap_from_mib():
    assert bucket_cap_elements(25, 4) == 25 * 2**20 // 4
    assert bucket_cap_elements(0.5, 8) == 2**19 // 8
    for bad in (0, -1, -0.5):
        with pytest.raises(ValueError, match=r"bucket_mb must be > 0"):
            bucket_cap_elements(bad, 4)
    with pytest.raises(ValueError, match="smaller than one"):
        bucket_cap_elements(1e-9, 8)
    with pytest.raises(ValueError, match="number of MiB"):
        bucket_cap_elements("big", 4)


def test_bad_capacity_and_layout():
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(layout_of([2]), cap=0)
    with pytest.raises(ValueError, match="contiguous"):
        plan_buckets([Spec("a", 0, 2), Spec("b", 3, 1)], cap=4)


# -- the [parallel.ddp] config section ------------------------------------------

def _ddp_config(**ddp):
    from hpcdp.config import config_from_dict
    return config_from_dict({"parallel": {"strategy": "ddp", "ddp": ddp}})


def test_ddp_config_defaults_and_overrides():
    cfg = _ddp_config()
    opts = cfg.parallel.sub("ddp")
    assert (opts.bucket_mb, opts.bucketing, opts.overlap, opts.init) == (25.0, "size", True, "verify")
    opts = _ddp_config(bucket_mb=0.5, bucketing="per_param", overlap=False, check_every=10).parallel.sub()
    assert (opts.bucket_mb, opts.bucketing, opts.overlap, opts.check_every) == (0.5, "per_param", False, 10)


@pytest.mark.parametrize("bad", [0, -1, -0.25])
def test_ddp_bucket_size_must_be_positive(bad):
    from hpcdp.config_error import ConfigError
    with pytest.raises(ConfigError, match=r"parallel\.ddp\.bucket_mb: .* must be > 0 MiB"):
        _ddp_config(bucket_mb=bad)


@pytest.mark.parametrize("key,value,match", [
    ("bucketing", "greedy", "parallel.ddp.bucketing: 'greedy' is not allowed"),
    ("init", "random", "parallel.ddp.init: 'random' is not allowed"),
    ("check_every", -1, "parallel.ddp.check_every: -1 is out of range"),
    ("algorithm", "tree", "parallel.ddp.algorithm: 'tree' is not allowed"),
    ("bucket_size", 3, "parallel.ddp.bucket_size: unknown key"),
])
def test_ddp_config_bad_values_name_the_key(key, value, match):
    from hpcdp.config_error import ConfigError
    with pytest.raises(ConfigError, match=match.replace(".", r"\.")):
        _ddp_config(**{key: value})
