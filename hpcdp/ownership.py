"""Who owns what: the flat ranges of parameters, gradients and optimizer state that
rank r holds, at a given ZeRO stage and world size. Pure functions, no MPI.

Built on the one shard rule (:func:`hpcdp.shard.shard_range`). The flat buffer is
cut into *groups*: contiguous ranges that one collective runs on (a bucket of whole
units at stages 1 and 2, one unit at stage 3; ``hpcdp.strategies.zero.groups``).
Each group is sharded on its own: rank r owns ``shard_range(size_g, N, r)`` of every
group g. So a rank's ZeRO shard of a group IS its chunk of that group's ring
reduce-scatter and all-gather: each collective is one balanced ring, never an
all-gather of unequal pieces. A rank therefore owns one range per group, not one
range of the whole buffer; its optimizer state is those ranges concatenated in flat
order.

What is sharded at each stage (0 is a replica: none, ddp)::

    stage   params   grads   optim
    0       full     full    full
    1       full     full    shard
    2       full     shard   shard
    3       shard    shard   shard

Checkpoints store every tensor in global flat coordinates and use :func:`intersect`
and :func:`local_slices` to find, in what a rank holds, the pieces another layout
needs, so they do not depend on how groups were cut.

Example: groups (0, 10), (10, 5) on N = 4 ranks. Rank 1 owns shard_range(10, 4, 1)
= (3, 3) of the first and shard_range(5, 4, 1) = (2, 1) of the second, i.e. global
ranges [(3, 3), (12, 1)], and its optimizer state has 4 elements.
"""

from __future__ import annotations

from hpcdp.shard import shard_range

KINDS = ("params", "grads", "optim")
SHARDED = {0: (), 1: ("optim",), 2: ("grads", "optim"), 3: ("params", "grads", "optim")}

Range = tuple[int, int]


def check_groups(groups) -> list[Range]:
    """``groups`` as a list of ``(offset, size)`` sorted by offset, checked to tile
    ``[0, numel)`` without gaps or overlaps (ValueError otherwise)."""
    out = sorted((int(o), int(s)) for o, s in groups)
    expect = 0
    for o, s in out:
        if s < 0 or o != expect:
            raise ValueError(f"groups must tile the flat buffer contiguously from 0: a group "
                             f"starts at {o} (size {s}), expected {expect}")
        expect = o + s
    return out


def group_shard(group: Range, world_size: int, rank: int) -> Range:
    """Global ``(offset, size)`` of ``rank``'s shard of one group (shard rule)."""
    off, size = group
    o, s = shard_range(size, world_size, rank)
    return off + o, s


def owned_ranges(kind: str, stage: int, groups, world_size: int, rank: int) -> list[Range]:
    """The global ranges of ``kind`` ("params", "grads", "optim") that ``rank`` holds.

    A full replica is one range ``[(0, numel)]``; a shard is one range per group
    (empty pieces left out), in flat order.
    """
    if kind not in KINDS:
        raise ValueError(f"ownership: kind must be one of {KINDS}, got {kind!r}")
    if stage not in SHARDED:
        raise ValueError(f"ownership: stage must be 0, 1, 2 or 3, got {stage!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"ownership: rank {rank} outside a world of {world_size}")
    groups = check_groups(groups)
    numel = groups[-1][0] + groups[-1][1] if groups else 0
    if kind not in SHARDED[stage]:
        return [(0, numel)] if numel else []
    out = []
    for g in groups:
        o, s = group_shard(g, world_size, rank)
        if s:
            out.append((o, s))
    return out


def total(ranges) -> int:
    """Elements in a list of ranges (the length of their concatenation)."""
    return sum(s for _, s in ranges)


def intersect(ranges_a, ranges_b) -> list[Range]:
    """The overlap of two lists of disjoint ranges, as disjoint ranges sorted by
    offset (empty overlaps left out). Linear in the number of ranges."""
    a = sorted((o, s) for o, s in ranges_a if s > 0)
    b = sorted((o, s) for o, s in ranges_b if s > 0)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][0] + a[i][1], b[j][0] + b[j][1])
        if hi > lo:
            out.append((lo, hi - lo))
        if a[i][0] + a[i][1] <= b[j][0] + b[j][1]:
            i += 1
        else:
            j += 1
    return out


def local_slices(held, wanted) -> list[tuple[int, int, int]]:
    """Where the pieces of ``wanted`` that are in ``held`` sit in the concatenation of
    ``held`` (in the order given): ``[(local_offset, global_offset, size), ...]``,
    sorted by global offset. ``held`` is what a rank stores (e.g. its optimizer
    state: its owned ranges concatenated); ``wanted`` any list of global ranges."""
    starts, pos = [], 0
    for o, s in held:
        starts.append((o, s, pos))
        pos += s
    out = []
    for lo, size in intersect(held, wanted):
        for o, s, p in starts:
            if o <= lo < o + s:
                out.append((p + lo - o, lo, size))
                break
    return out


__all__ = ["KINDS", "SHARDED", "check_groups", "group_shard", "owned_ranges", "total",
           "intersect", "local_slices"]
