"""Units: the blocks a sharded strategy gathers, runs and releases one at a time.

A unit is one contiguous range ``[offset, offset + size)`` of the flat buffer plus
the module whose ``forward`` uses exactly those parameters (hooks attach to it).

The rule (``plan_units``): a model lists its blocks in ``unit_modules()`` as
``[(name, module), ...]`` (GPT: the transformer blocks ``h.i``; MLP: the layers
``fc<i>``). Each block is a unit. Every parameter that belongs to no block forms one
more unit, ``"root"``, whose module is the model itself: for GPT the token and
position embeddings, the final LayerNorm and the (tied or untied) head. The tied
``wte`` is used at the start of forward (embedding) and at its end (head), so it
must stay available for the whole forward and the whole backward; the model's own
forward brackets both uses, which makes the root unit exactly that. The root unit
is empty for a model whose parameters all sit in blocks (the MLP), and is then left
out.

For units to be contiguous, a model registers its root parameters first and then
its blocks in order (GPT: wte, wpe, ln_f, [lm_head], h.0, h.1, ...). A model whose
units are not contiguous ranges, or that lists no blocks, cannot be split:
``plan_units`` raises :class:`UnitError` saying which parameter breaks the rule.

A unit's parameters may be used only inside its module's ``forward`` (and the
backward of what that forward computed): that is when a sharded strategy has them
gathered.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


class UnitError(ValueError):
    """The model cannot be split into units (see the module docstring)."""


@dataclass(frozen=True)
class Unit:
    index: int            # in flat order (offset order)
    name: str
    offset: int           # first element in the flat buffer
    size: int             # elements
    params: tuple         # layout names inside the range, in layout order
    module_ref: Any = None  # weakref to the Module whose forward uses them

    @property
    def module(self):
        """The unit's Module (None: no hooks possible). Held weakly: the model owns its
        FlatParams, so a strong reference back would make every model a cycle that
        only the cyclic garbage collector frees (and memory figures would lag)."""
        return self.module_ref() if self.module_ref is not None else None

    @property
    def end(self) -> int:
        return self.offset + self.size


def _contiguous(name, names, specs) -> tuple[int, int]:
    chosen = sorted((specs[n] for n in names), key=lambda s: s.offset)
    for a, b in zip(chosen, chosen[1:]):
        if a.offset + a.size != b.offset:
            between = [s.name for s in specs.values() if a.offset + a.size <= s.offset < b.offset]
            raise UnitError(f"unit {name!r} is not one contiguous range of the flat buffer: "
                            f"{between[0] if between else '?'} sits between its parameters "
                            f"{a.name} and {b.name}; register a unit's parameters together")
    return chosen[0].offset, sum(s.size for s in chosen)


def plan_units(model, flat) -> list[Unit]:
    """The units of ``model`` (see the module docstring), sorted by offset."""
    blocks = list(model.unit_modules()) if hasattr(model, "unit_modules") else []
    if not blocks:
        raise UnitError(f"{type(model).__name__} lists no blocks (unit_modules()), so it "
                        "cannot be split into units")
    specs = {s.name: s for s in flat.layout}
    owner: dict[str, str] = {}
    found = []
    for name, module in blocks:
        names = [p.name for p in module.parameters() if p.name in specs]
        if not names:
            raise UnitError(f"unit {name!r} holds no parameters")
        for n in names:
            if n in owner:
                raise UnitError(f"parameter {n} is used by two units, {owner[n]!r} and {name!r}")
            owner[n] = name
        found.append((name, module, names))
    root = [s.name for s in flat.layout if s.name not in owner]
    if root:
        found.append(("root", model, root))
    units = []
    for name, module, names in found:
        off, size = _contiguous(name, names, specs)
        ordered = tuple(s.name for s in flat.layout if s.name in set(names))
        units.append((off, size, name, ordered, module))
    units.sort(key=lambda u: u[0])
    return [Unit(i, name, off, size, names, weakref.ref(module))
            for i, (off, size, name, names, module) in enumerate(units)]


def attach_units(model, flat) -> None:
    """Record the model's units on its FlatParams (``flat.units``), or why it has
    none (``flat.units_error``); a replicated strategy needs neither."""
    try:
        flat.units, flat.units_error = plan_units(model, flat), None
    except UnitError as e:
        flat.units, flat.units_error = None, str(e)


__all__ = ["Unit", "UnitError", "plan_units", "attach_units"]
