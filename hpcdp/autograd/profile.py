"""Per-op profile of forward and backward: time and bytes touched of each op kind.

Usage::

    with OpProfile() as prof:
        loss = model.loss(x, y); loss.backward()
        prof.time_region("optimizer", opt_step)
    prof.rows()   # one dict per (phase, op, within)

The hook is :func:`hpcdp.autograd.tensor.op` (every public op in ``ops`` and
``functional`` carries it) and the backward loop of ``tensor.run_backward``: each
reads one attribute per call and does nothing else while no profile records, so the
computed values are the same bit for bit with the profile on or off.

What is recorded:
- forward: each op call, timed exclusively (an op that calls other ops counts only
  its own code; its inner ops are recorded with ``within`` set to the outermost op's
  name);
- backward: each op node's closure plus the handling of its parents' gradients
  (accumulation into parameter grads included), under the op that made the node
  (and the ``within`` its forward had);
- regions: whatever :meth:`OpProfile.time_region` times (an optimizer step).
- bytes: the arrays an op reads and writes, counted once each (inputs + output
  forward; incoming gradient + parents' gradients + the parents' saved arrays
  backward): a lower bound on the memory traffic, exact for a single-pass kernel.
"""

from __future__ import annotations

import time

from .tensor import Tensor, set_active_profile

_clock = time.perf_counter


def _nbytes(x) -> int:
    if isinstance(x, Tensor):
        return int(x.data.nbytes)
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


class OpProfile:
    """Accumulates (phase, op, within) -> [calls, seconds, bytes] while active."""

    def __init__(self):
        self.table: dict[tuple, list] = {}
        self._depth = 0
        self._outer = None
        self._inner_s = 0.0
        self._within: dict[int, str] = {}
        self._prev = None

    # -- activation ---------------------------------------------------------------
    def __enter__(self):
        self._prev = set_active_profile(self)
        return self

    def __exit__(self, *exc):
        set_active_profile(self._prev)
        return False

    def _add(self, key, seconds, nbytes):
        row = self.table.get(key)
        if row is None:
            self.table[key] = [1, seconds, nbytes]
        else:
            row[0] += 1
            row[1] += seconds
            row[2] += nbytes

    # -- hooks (called by hpcdp.autograd.tensor) ------------------------------------
    def forward(self, fn, args, kwargs):
        name = fn.__name__
        outer, saved_inner = self._outer, self._inner_s
        if self._depth == 0:
            self._outer = name
        self._inner_s = 0.0
        self._depth += 1
        t0 = _clock()
        try:
            out = fn(*args, **kwargs)
        finally:
            elapsed = _clock() - t0
            self._depth -= 1
            own = elapsed - self._inner_s
            self._inner_s = saved_inner + elapsed
            within = self._outer if self._depth > 0 else ""
            self._outer = outer if self._depth > 0 else None
        if self._depth == 0:
            self._inner_s = 0.0
        if within and isinstance(out, Tensor):
            self._within[id(out)] = within
        nbytes = _nbytes(args) + _nbytes(out)
        self._add(("forward", name, within), own, nbytes)
        return out

    def backward_pass(self, nodes, grads, uses, be, retain_graph, backward_node):
        within = self._within
        for node in nodes:
            name = node._backward.__qualname__.split(".", 1)[0]
            nbytes = 2 * int(node.data.nbytes) + 2 * sum(
                int(p.data.nbytes) for p in node._parents if p.requires_grad)
            t0 = _clock()
            backward_node(node, grads, uses, be, retain_graph)
            self._add(("backward", name, within.get(id(node), "")), _clock() - t0, nbytes)
        within.clear()

    def time_region(self, name, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` and record its time under ("region", name)."""
        t0 = _clock()
        out = fn(*args, **kwargs)
        self._add(("region", name, ""), _clock() - t0, 0)
        return out

    # -- results ------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """One dict per (phase, op, within): calls, seconds, bytes; largest time first."""
        out = [{"phase": k[0], "op": k[1], "within": k[2], "calls": v[0], "seconds": v[1], "bytes": v[2]}
               for k, v in self.table.items()]
        return sorted(out, key=lambda r: -r["seconds"])

    def total_seconds(self) -> float:
        return sum(v[1] for v in self.table.values())


__all__ = ["OpProfile"]
