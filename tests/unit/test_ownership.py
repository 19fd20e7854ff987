"""The ownership rule (hpcdp/ownership.py): pure logic, closed-form expectations."""

import itertools

import numpy as np
import pytest

from hpcdp.ownership import check_groups, intersect, local_slices, owned_ranges, total
from hpcdp.shard import shard_range


def test_docstring_example():
    groups = [(0, 10), (10, 5)]
    assert owned_ranges("optim", 1, groups, 4, 1) == [(3, 3), (12, 1)]
    assert owned_ranges("params", 1, groups, 4, 1) == [(0, 15)]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_what_each_stage_shards(stage):
    groups = [(0, 7), (7, 13), (20, 1)]
    sharded = {0: set(), 1: {"optim"}, 2: {"grads", "optim"}, 3: {"params", "grads", "optim"}}[stage]
    for kind in ("params", "grads", "optim"):
        got = owned_ranges(kind, stage, groups, 3, 2)
        if kind in sharded:
            want = [(o + shard_range(s, 3, 2)[0], shard_range(s, 3, 2)[1]) for o, s in groups]
            assert got == [r for r in want if r[1]]
        else:
            assert got == [(0, 21)]


@pytest.mark.parametrize("N", range(1, 9))
def test_shards_of_all_ranks_tile_every_group_exactly_once(N):
    rng = np.random.default_rng(N)
    sizes = rng.integers(0, 12, size=6)  # zeros and sizes < N included
    groups, off = [], 0
    for s in sizes:
        groups.append((off, int(s)))
        off += int(s)
    cover = np.zeros(off, dtype=int)
    for r in range(N):
        ranges = owned_ranges("grads", 2, groups, N, r)
        for o, s in ranges:
            cover[o:o + s] += 1
        # one range per non-empty piece, each inside its group, sizes by the shard rule
        assert total(ranges) == sum(shard_range(s, N, r)[1] for _, s in groups)
    assert np.all(cover == 1)


def test_groups_must_tile_the_buffer():
    assert check_groups([(5, 5), (0, 5)]) == [(0, 5), (5, 5)]
    with pytest.raises(ValueError, match="starts at 6"):
        check_groups([(0, 5), (6, 5)])
    with pytest.raises(ValueError, match="kind must be"):
        owned_ranges("moments", 1, [(0, 4)], 2, 0)
    with pytest.raises(ValueError, match="stage must be"):
        owned_ranges("optim", 4, [(0, 4)], 2, 0)
    with pytest.raises(ValueError, match="rank 2 outside"):
        owned_ranges("optim", 1, [(0, 4)], 2, 2)


def _brute_intersect(a, b):
    sa = {i for o, s in a for i in range(o, o + s)}
    sb = {i for o, s in b for i in range(o, o + s)}
    return sorted(sa & sb)


def _expand(ranges):
    return [i for o, s in ranges for i in range(o, o + s)]


@pytest.mark.parametrize("seed", range(20))
def test_intersect_matches_brute_force(seed):
    rng = np.random.default_rng(seed)

    def random_ranges():
        cuts = np.sort(rng.choice(60, size=rng.integers(2, 12), replace=False))
        pairs = [(int(lo), int(hi - lo)) for lo, hi in zip(cuts[:-1], cuts[1:])]
        return [p for p in pairs if rng.random() < 0.6]

    a, b = random_ranges(), random_ranges()
    got = intersect(a, b)
    assert _expand(got) == _brute_intersect(a, b)
    assert all(s > 0 for _, s in got)
    assert got == sorted(got) and intersect(b, a) == got


def test_intersect_edge_cases():
    assert intersect([], [(0, 5)]) == []
    assert intersect([(0, 5)], [(5, 5)]) == []          # touching, not overlapping
    assert intersect([(0, 10)], [(2, 3), (7, 1)]) == [(2, 3), (7, 1)]
    assert intersect([(0, 3), (3, 3)], [(2, 2)]) == [(2, 1), (3, 1)]


@pytest.mark.parametrize("N_write,N_read", list(itertools.product([1, 2, 3, 4], [1, 2, 3, 5])))
def test_local_slices_reshard_optimizer_state_between_world_sizes(N_write, N_read):
    """Write each rank's concatenated state on N_write ranks with one grouping, read it
    back on N_read ranks with another grouping: every element lands where it belongs."""
    numel = 29
    truth = np.arange(numel, dtype=float) * 10
    write_groups = [(0, 11), (11, 7), (18, 11)]
    read_groups = [(0, 4), (4, 25)]
    stored = []  # (held ranges, local array) per writer
    for r in range(N_write):
        held = owned_ranges("optim", 2, write_groups, N_write, r)
        stored.append((held, np.concatenate([truth[o:o + s] for o, s in held]) if held else np.zeros(0)))
    for r in range(N_read):
        want = owned_ranges("optim", 3, read_groups, N_read, r)
        mine = np.full(total(want), np.nan)
        for held, local in stored:
            for loc, glob, size in local_slices(held, want):
                # where this global piece goes in the reader's concatenation
                for dst, g2, s2 in local_slices(want, [(glob, size)]):
                    mine[dst:dst + s2] = local[loc + g2 - glob:loc + g2 - glob + s2]
        assert np.array_equal(mine, np.concatenate([truth[o:o + s] for o, s in want]) if want else mine)


def test_local_slices_positions():
    held = [(10, 4), (30, 2)]  # concatenation: 10..13 then 30..31
    assert local_slices(held, [(12, 20)]) == [(2, 12, 2), (4, 30, 2)]
    assert local_slices(held, [(0, 5)]) == []
