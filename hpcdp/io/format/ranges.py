"""Range arithmetic for checkpoints: pure functions, no files, no MPI.

A checkpoint stores every logical tensor (a parameter, or one optimizer state buffer
of a parameter) as pieces, each a half-open range ``[offset, offset + size)`` of the
tensor's flattened elements (C order). Saving cuts what a rank owns of the model's
flat buffers at parameter boundaries (:func:`split_by_layout`); loading intersects
the ranges a rank needs with the stored pieces (:func:`intersect`, the one in
``hpcdp.ownership``). Which ranges a rank owns is the strategy's business
(``hpcdp.shard.shard_range`` for replicated strategies,
``hpcdp.ownership.owned_ranges`` for sharded ones): the rule here is only "take the
overlap", so a checkpoint written under any strategy and rank count is read under
any other.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from hpcdp.ownership import intersect as _intersect


class Span(NamedTuple):
    """``size`` elements of one logical tensor starting at element ``offset``."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def intersect(ranges_a: Iterable[tuple[int, int]], ranges_b: Iterable[tuple[int, int]]) -> list[Span]:
    """Every non-empty overlap of an ``(offset, size)`` in ``ranges_a`` with one in
    ``ranges_b``, sorted by offset: :func:`hpcdp.ownership.intersect` (the function
    ZeRO's ownership uses), as :class:`Span` values."""
    return [Span(o, s) for o, s in _intersect(ranges_a, ranges_b)]


def split_by_layout(layout, offset: int, size: int) -> list[tuple[str, Span, int]]:
    """Cut the flat-buffer range ``[offset, offset + size)`` at parameter boundaries.

    ``layout``: ``ParamSpec``-like objects (name, offset, size) in flat order. Returns
    ``(parameter name, span within that parameter, position within the range)`` for
    every parameter the range touches.
    """
    out = []
    end = offset + size
    for spec in layout:
        lo, hi = max(offset, spec.offset), min(end, spec.offset + spec.size)
        if hi > lo:
            out.append((spec.name, Span(lo - spec.offset, hi - lo), lo - offset))
    return out


def coverage_problems(numel: int, spans: Iterable[tuple[int, int]]) -> str | None:
    """None when ``spans`` tile ``[0, numel)`` exactly (no gap, no overlap); else a
    sentence naming the first gap or overlap."""
    pos = 0
    for off, size in sorted((int(o), int(s)) for o, s in spans):
        if off > pos:
            return f"elements [{pos}, {off}) are in no piece"
        if off < pos:
            return f"elements [{off}, {min(pos, off + size)}) are in two pieces"
        pos = off + size
    if pos < numel:
        return f"elements [{pos}, {numel}) are in no piece"
    if pos > numel:
        return f"pieces reach element {pos}, past the tensor's {numel} elements"
    return None


def blocks_covering(span_in_piece: Span, block: int) -> tuple[int, int]:
    """Indices ``[first, last)`` of the ``block``-element checksum blocks of a piece
    that a read of ``span_in_piece`` (coordinates within the piece) must verify."""
    if span_in_piece.size <= 0:
        return 0, 0
    return span_in_piece.offset // block, (span_in_piece.end + block - 1) // block


__all__ = ["Span", "intersect", "split_by_layout", "coverage_problems", "blocks_covering"]
