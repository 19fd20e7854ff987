"""Fragments and their schedule (Streaming DiLoCo): pure functions, no communication.

A fragment is a contiguous range of the flat parameter buffer made of whole units
(``flat.units``: one per transformer block, the root unit for the embeddings and the
final norm). :func:`plan_fragments` cuts the units, in flat order, into ``P``
consecutive runs whose largest is as small as whole units allow (a unit is never
split; fewer units than fragments is refused). On a small GPT the root unit (the
token embedding) is the largest unit and bounds the largest fragment from below. Together the fragments tile ``[0, numel)``: every parameter is in exactly
one (asserted by :func:`check_tiling` and by the tests).

The schedule, with ``H = sync_every``, ``s = H / P`` (the stagger) and ``tau =
overlap`` (``tau < s``). Inner steps are numbered from 1 (the count of inner
updates done so far). Fragment ``p``:

- **lands** (its averaged outer gradient is applied) after inner step ``t`` when
  ``t % H == (p + 1) s % H``, i.e. at ``t = (p + 1) s, (p + 1) s + H, ...``;
- **is sent** ``tau`` steps earlier: after inner step ``t - tau``. Its outer
  gradient is the parameter change up to then; the inner steps in between go on
  while the exchange runs in the background.

With ``P = 1, tau = 0`` this is plain DiLoCo (all parameters at ``t = H, 2H, ...``).
Since ``tau < s`` a fragment lands before the next one is sent: at most one exchange
is in flight, and at every multiple of ``H`` none is (the last fragment has just
landed), which is where checkpoints go (``outer boundaries``). Every fragment is
synchronised once every ``H`` steps, so the bytes per step are those of plain
DiLoCo, but each exchange carries ``1/P`` of the model: the peak link rate falls
to about ``1/P``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fragment:
    index: int
    offset: int    # global flat offset
    size: int      # elements
    units: tuple   # unit indices (flat order)


def plan_fragments(units, numel: int, parts: int) -> list[Fragment]:
    """Cut ``units`` (objects with ``index``, ``offset``, ``size``, tiling ``[0, numel)``)
    into ``parts`` contiguous fragments of whole units with the smallest possible
    largest fragment (the peak link rate follows the largest): a binary search on that
    size, each candidate checked by filling fragments greedily in flat order; among
    equal largest sizes, the greedy fill's cut."""
    if parts < 1:
        raise ValueError(f"fragments: {parts} is out of range; allowed [1, inf)")
    if parts == 1:
        return [Fragment(0, 0, int(numel), tuple(u.index for u in units or ()))]
    if units is None or len(units) < parts:
        raise ValueError(f"parallel.diloco.fragments: {parts} fragments need at least {parts} units "
                         f"(the model has {len(units or [])}: one per block plus the root); "
                         "choose fewer fragments")
    units = sorted(units, key=lambda u: u.offset)
    sizes = [int(u.size) for u in units]

    def cut(limit: int):
        """Greedy runs of at most ``limit`` elements, or None if more than ``parts``."""
        runs, cur = [[]], 0
        for i, s in enumerate(sizes):
            if cur + s > limit and runs[-1]:
                runs.append([])
                cur = 0
            runs[-1].append(i)
            cur += s
        return runs if len(runs) <= parts else None

    lo, hi = max(sizes), sum(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cut(mid) is not None else (mid + 1, hi)
    runs = cut(lo)
    while len(runs) < parts:  # fewer runs than fragments: split the longest runs of several units
        k = max((r for r in runs if len(r) > 1), key=lambda r: sum(sizes[i] for i in r))
        j = runs.index(k)
        runs[j:j + 1] = [k[:1], k[1:]]
    out = []
    for p, run in enumerate(runs):
        chosen = [units[i] for i in run]
        off = chosen[0].offset
        size = chosen[-1].offset + chosen[-1].size - off
        out.append(Fragment(p, int(off), int(size), tuple(u.index for u in chosen)))
    check_tiling(out, numel)
    return out


def check_tiling(fragments, numel: int) -> None:
    """Every element of ``[0, numel)`` in exactly one fragment (raises otherwise)."""
    pos = 0
    for f in sorted(fragments, key=lambda f: f.offset):
        if f.offset != pos or f.size <= 0:
            raise ValueError(f"fragments do not tile the parameters: fragment {f.index} covers "
                             f"[{f.offset}, {f.offset + f.size}), expected to start at {pos}")
        pos += f.size
    if pos != numel:
        raise ValueError(f"fragments cover {pos} of {numel} parameters")


@dataclass(frozen=True)
class Schedule:
    sync_every: int   # H
    fragments: int    # P
    overlap: int      # tau

    @property
    def stagger(self) -> int:
        return self.sync_every // self.fragments

    def lands_at(self, t: int) -> int | None:
        """The fragment whose exchange lands after inner step ``t`` (>= 1), or None."""
        s, H = self.stagger, self.sync_every
        r = t % H
        for p in range(self.fragments):
            if r == ((p + 1) * s) % H:
                return p
        return None

    def sent_at(self, t: int) -> int | None:
        """The fragment sent after inner step ``t`` (its landing is at ``t + tau``)."""
        if t < 1:
            return None
        return self.lands_at(t + self.overlap) if t + self.overlap >= 1 else None

    def boundary(self, t: int) -> bool:
        """An outer boundary: no exchange in flight after step ``t`` (t a multiple of H)."""
        return t % self.sync_every == 0

    def last_landing(self, fragment: int, t: int) -> int:
        """The last step ``<= t`` after which ``fragment`` landed (0: never yet)."""
        first = (fragment + 1) * self.stagger
        if t < first:
            return 0
        return first + ((t - first) // self.sync_every) * self.sync_every


__all__ = ["Fragment", "plan_fragments", "check_tiling", "Schedule"]
