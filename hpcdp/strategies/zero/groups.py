"""Collective groups of ZeRO: which contiguous ranges one reduce-scatter (and one
all-gather) runs on. Pure planning, no MPI.

- Stages 1 and 2 (:func:`plan_groups`): whole units (``flat.units``, or one per
  parameter for a FlatParams without units) merged while the group stays within
  ``cap`` elements, cut from the END of the buffer like DDP's buckets (backward
  finishes the last units first); a unit larger than ``cap`` is a group of its own.
  A unit is never split, so a stage-2 group's gradient storage can be bound at the
  pre-backward moment of its first unit to run backward.
- Stage 3 (:func:`plan_unit_groups`): one group per unit: a unit is what is gathered
  before its forward and backward.

Either way every group is sharded on its own by the shard rule
(:func:`hpcdp.ownership.owned_ranges`), so a rank's ZeRO shard of a group is its
ring chunk of that group's reduce-scatter and all-gather.
"""

from __future__ import annotations

from hpcdp.strategies.buckets import BucketPlan, plan_from_ranges


def unit_spans(flat) -> list[tuple[int, int]]:
    """``(offset, size)`` of each unit in flat order (one per parameter if the
    FlatParams has no units)."""
    if flat.units:
        return [(u.offset, u.size) for u in flat.units]
    return [(s.offset, s.size) for s in flat.layout]


def plan_groups(flat, cap: int) -> BucketPlan:
    """Stages 1/2: whole units merged up to ``cap`` elements, launch order from the end."""
    if cap < 1:
        raise ValueError(f"group capacity must be >= 1 element, got {cap}")
    ranges: list[tuple[int, int]] = []
    start = end = None
    for off, size in reversed(unit_spans(flat)):
        if not size:
            continue
        if end is None:
            start, end = off, off + size
        elif end - off <= cap:
            start = off
        else:
            ranges.append((start, end - start))
            start, end = off, off + size
    if end is not None:
        ranges.append((start, end - start))
    return plan_from_ranges(flat.layout, ranges)


def plan_unit_groups(flat) -> BucketPlan:
    """Stage 3: one group per (non-empty) unit, launch order from the end."""
    return plan_from_ranges(flat.layout, [(o, s) for o, s in reversed(unit_spans(flat)) if s])


def group_ranges(plan: BucketPlan) -> list[tuple[int, int]]:
    """The groups' ``(offset, size)`` sorted by offset (what ownership needs)."""
    return sorted((b.offset, b.size) for b in plan.buckets)


__all__ = ["unit_spans", "plan_groups", "plan_unit_groups", "group_ranges"]
