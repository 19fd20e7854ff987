"""Weight-decay parameter groups on a flat buffer, as (offset, size) ranges.

GPT recipes decay only the weight matrices: biases, LayerNorm gains and biases and
the embeddings are left alone (minGPT's rule; GPT-2's training used it too). hpcdp's
optimizers see one flat buffer, so the groups are expressed as the flat ranges that
DO get weight decay, built once from the layout:

    ranges = decay_ranges(flat.layout, ["bias", "ln_*", "wte", "wpe"])
    opt.set_decay_ranges(ranges)                 # full-buffer coordinates

A sharded optimizer updates only part of the buffer: a parameter-server shard one
contiguous key range, a ZeRO rank several disjoint ranges concatenated. It says so
with ``opt.set_slice([(offset, size), ...])`` (the pieces of the full buffer its
arrays hold, in order) and :func:`local_runs` cuts its local array into runs with
decay and runs without. No per-element mask is stored: the groups cost a few
(offset, size) pairs per parameter, not a byte per element, so ZeRO's memory
formulas (optimizer state = k bytes x shard elements) hold unchanged.

Rules (``optim.no_decay``): a parameter is NOT decayed if a rule matches it. A rule
with a dot is an fnmatch pattern on the whole name ("h.*.attn.c_proj.weight"); one
without a dot matches any dot-separated part of the name ("bias" matches
"h.0.mlp.c_fc.bias", "ln_*" matches "h.3.ln_2.weight" and "ln_f.bias"). A rule of
your own that matches no parameter is an error (a typo would silently decay); the
default rules need not all match (an MLP has no LayerNorm).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

DEFAULT_NO_DECAY = ("bias", "ln_*", "wte", "wpe")


def rule_matches(rule: str, name: str) -> bool:
    if "." in rule:
        return fnmatchcase(name, rule)
    return any(fnmatchcase(part, rule) for part in name.split("."))


def decay_ranges(layout, no_decay=DEFAULT_NO_DECAY) -> list[tuple[int, int]]:
    """Sorted, merged (offset, size) ranges of the parameters in ``layout`` (ParamSpec
    with name, offset, size) that no rule in ``no_decay`` matches."""
    rules = list(no_decay)
    used = set()
    out: list[tuple[int, int]] = []
    for spec in sorted(layout, key=lambda s: s.offset):
        hit = [r for r in rules if rule_matches(r, spec.name)]
        used.update(hit)
        if hit or spec.size == 0:
            continue
        if out and out[-1][0] + out[-1][1] == spec.offset:
            out[-1] = (out[-1][0], out[-1][1] + spec.size)
        else:
            out.append((spec.offset, spec.size))
    unused = [r for r in rules if r not in used and r not in DEFAULT_NO_DECAY]
    if unused:
        names = ", ".join(s.name for s in layout)
        raise ValueError(f"optim.no_decay: rule {unused[0]!r} matches no parameter; the parameters are: {names}")
    return out


def local_runs(decay, pieces, n_local: int) -> list[tuple[int, int, bool]]:
    """Cut a local array into (lo, hi, decayed) runs, in order, covering [0, n_local).

    ``decay``: sorted disjoint (offset, size) ranges of the full buffer that get weight
    decay. ``pieces``: the (offset, size) ranges of the full buffer the local array
    holds, concatenated in this order (their sizes must add up to ``n_local``).
    Adjacent runs of the same kind are merged. Cost: O(pieces + ranges) once.
    """
    total = sum(size for _, size in pieces)
    if total != n_local:
        raise ValueError(f"weight-decay slice: the pieces {list(pieces)} hold {total} elements, "
                         f"the optimizer was given an array of {n_local}")
    runs: list[tuple[int, int, bool]] = []

    def add(lo, hi, on):
        if hi <= lo:
            return
        if runs and runs[-1][2] == on and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi, on)
        else:
            runs.append((lo, hi, on))

    base = 0
    for off, size in pieces:
        end, pos = off + size, off
        for d_off, d_size in decay:
            d_end = d_off + d_size
            if d_end <= pos or d_off >= end:
                continue
            lo, hi = max(d_off, pos), min(d_end, end)
            add(base + pos - off, base + lo - off, False)
            add(base + lo - off, base + hi - off, True)
            pos = hi
        add(base + pos - off, base + end - off, False)
        base += size
    return runs
