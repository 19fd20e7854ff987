"""ZeRO-3's unit-order check: every rank must gather the same units in the same order.

Stage 3 starts an all-gather at every unit's forward and backward. If ranks ran
units in a different order or a different number of times (the way DeepSpeed's
stage 2 once produced silently wrong gradients), equal-sized units would be
exchanged for one another without any error, and unequal ones would hang. So on the
first training step (and on every step in ``comm.debug`` mode) each such moment is
agreed first: every rank contributes (moment number, kind, unit) to a small
all-gather (24 bytes per rank, under comm's timeout, not in the byte ledger) and,
if they differ, every rank raises :class:`UnitOrderMismatch` naming what each rank
was about to run, before any parameter moves. The end of the step's backward is a
moment too, so a rank that ran fewer units meets the others' next unit there.
Cost: one small collective per unit moment on the checked steps (a sync point each).
"""

from __future__ import annotations

import numpy as np

FORWARD, BACKWARD, END = 0, 1, 2
_KIND = {FORWARD: "forward of", BACKWARD: "backward of", END: "the end of backward"}


class UnitOrderMismatch(RuntimeError):
    """Ranks ran stage-3 units in a different order or number (raised on every rank)."""


def _describe(kind: int, unit: int, names) -> str:
    if kind == END:
        return _KIND[END]
    return f"{_KIND.get(kind, '?')} unit {names[unit] if 0 <= unit < len(names) else unit!r}"


def agree(hcomm, comm, timeout, moment: int, kind: int, unit: int, names, step: int) -> None:
    """Collective: check that every rank is at the same (moment, kind, unit)."""
    size = comm.Get_size()
    if size == 1:
        return
    mine = np.array([moment, kind, unit], dtype=np.int64)
    every = np.empty(3 * size, dtype=np.int64)
    hcomm.all_gather(mine, every, comm=comm, timeout=timeout)
    rows = every.reshape(size, 3)
    if all((rows[r] == rows[0]).all() for r in range(size)):
        return
    groups: dict[tuple, list[int]] = {}
    for r in range(size):
        groups.setdefault(tuple(int(x) for x in rows[r]), []).append(r)
    parts = []
    for (m, k, u), ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who}: {_describe(k, u, names)} (unit moment #{m})")
    raise UnitOrderMismatch(
        f"ZeRO-3 step {step}: ranks disagree on the next unit to gather ("
        + "; ".join(parts) + "). Every rank must run the same units in the same order and "
        "number (a unit's parameters used only inside its forward, no rank-dependent "
        "control flow); nothing was gathered or updated with mismatched units")


__all__ = ["UnitOrderMismatch", "agree", "FORWARD", "BACKWARD", "END"]
