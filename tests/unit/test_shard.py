"""The one shard rule: contiguous, covering, balanced to one element, rank-ordered."""

import pytest

from hpcdp.shard import shard_bounds, shard_range


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 10, 97, 1000])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5, 8])
def test_pieces_cover_the_buffer_contiguously_and_balanced(n, parts):
    bounds = shard_bounds(n, parts)
    assert len(bounds) == parts
    offset = 0
    for off, size in bounds:
        assert off == offset
        offset += size
    assert offset == n
    sizes = [s for _, s in bounds]
    assert max(sizes) - min(sizes) <= 1
    # larger pieces come first
    assert sizes == sorted(sizes, reverse=True)


def test_worked_example_from_the_docstring():
    assert shard_bounds(10, 4) == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]


@pytest.mark.parametrize("args, msg", [((10, 0, 0), "parts"), ((10, 3, 3), "index"),
                                       ((10, 3, -1), "index"), ((-1, 3, 0), "n must")])
def test_bad_arguments_say_what_is_wrong(args, msg):
    with pytest.raises(ValueError, match=msg):
        shard_range(*args)
