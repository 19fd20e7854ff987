"""The one rule that splits a flat buffer into parts.

Every place in hpcdp that cuts a flat buffer into N pieces uses :func:`shard_range`:
the ring collectives' chunks, the multi-server parameter server's key ranges, ZeRO
shards and checkpoint resharding. Keeping one rule means a shard written by one
component is found at the same (offset, size) by every other.

Rule: ``n`` elements over ``parts`` pieces. Every piece gets ``n // parts`` elements
and the first ``n % parts`` pieces get one more. Pieces are contiguous and in rank
order. So sizes differ by at most one element, pieces may be empty when
``n < parts``, and ``n == 0`` gives ``parts`` empty pieces.

Example: n=10, parts=4 -> (0, 3), (3, 3), (6, 2), (8, 2).
"""

from __future__ import annotations


def shard_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """Return ``(offset, size)`` of piece ``index`` of ``n`` elements cut into ``parts``."""
    if parts < 1:
        raise ValueError(f"shard_range: parts must be >= 1, got {parts}")
    if not 0 <= index < parts:
        raise ValueError(f"shard_range: index must be in [0, {parts}), got {index}")
    if n < 0:
        raise ValueError(f"shard_range: n must be >= 0, got {n}")
    base, rem = divmod(n, parts)
    offset = index * base + min(index, rem)
    size = base + (1 if index < rem else 0)
    return offset, size


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """All ``(offset, size)`` pairs of :func:`shard_range`, in order."""
    return [shard_range(n, parts, i) for i in range(parts)]


def place_shard(full, shard, parts: int, index: int) -> None:
    """Copy ``shard`` (shard ``index`` of ``parts``) into its position in ``full``
    (:func:`shard_range` of ``full``'s length): an all-gather's own chunk put in place."""
    off = shard_range(full.size, parts, index)[0]
    full[off:off + shard.size] = shard
