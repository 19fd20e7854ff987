"""Config skew: ranks that resolved different configs would run different collective
schedules (``train.steps``, ``run.log_every``, ``run.eval_every``...) and hang.

Before training every rank compares a hash of its resolved config (the config
stage's fingerprint, :func:`hpcdp.failure.agreement.agree`); only if the hashes differ
are the configs themselves exchanged, so the error names each differing key and
which ranks hold which value.

Keys in :data:`PER_RANK_KEYS` may differ: node-local copies of the data have
different paths. What they hold is compared after loading (shapes and the step
schedule: :func:`schedule_text`).
"""

from __future__ import annotations

import json

from .ranks import fmt_ranks

PER_RANK_KEYS = ("data.path", "data.test_path")
_SHOWN = 4  # differing keys named in the message


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        elif key not in PER_RANK_KEYS:
            out[key] = v
    return out


def config_text(cfg) -> str:
    """The resolved config as canonical text (sorted ``key = value`` lines, minus the
    per-rank keys): equal texts mean equal collective schedules."""
    flat = _flat(cfg.to_dict())
    return "\n".join(f"{k} = {json.dumps(flat[k], sort_keys=True)}" for k in sorted(flat))


def _parse(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" = ")
        out[k] = v
    return out


def config_differences(texts: list[str]) -> str:
    """The message for differing config texts (one per rank): each differing key with
    its values and the ranks that hold them."""
    per_rank = [_parse(t) for t in texts]
    keys = sorted(set().union(*per_rank))
    parts = []
    for k in keys:
        values: dict[str, list[int]] = {}
        for r, d in enumerate(per_rank):
            values.setdefault(d.get(k, "(missing)"), []).append(r)
        if len(values) > 1:
            parts.append(f"{k} = " + ", ".join(f"{v} on {fmt_ranks(rs)}" for v, rs in values.items()))
    more = f"; and {len(parts) - _SHOWN} more key(s)" if len(parts) > _SHOWN else ""
    return ("the config differs across ranks (every rank must run the same config, or their "
            "collectives would not match): " + "; ".join(parts[:_SHOWN]) + more)


def schedule_text(ds, total_steps: int, batches_per_epoch: int) -> str:
    """What every rank must agree on after loading the data: its shape and the steps."""
    return (f"{ds.n_train} train / {ds.n_test} test samples of shape {tuple(ds.x_train.shape[1:])} "
            f"{ds.x_train.dtype}, {ds.n_classes} classes, {total_steps} steps "
            f"({batches_per_epoch} per epoch)")


def schedule_differences(texts: list[str]) -> str:
    groups: dict[str, list[int]] = {}
    for r, t in enumerate(texts):
        groups.setdefault(t, []).append(r)
    return ("the data differs across ranks (each rank would run a different number of steps "
            "or shapes): " + "; ".join(f"{fmt_ranks(rs)}: {t}" for t, rs in groups.items()))


__all__ = ["config_text", "config_differences", "schedule_text", "schedule_differences", "PER_RANK_KEYS"]
