"""Model-state memory per rank, predicted before anything is allocated, and the
up-front check that refuses a run whose model state cannot fit on a node.

The prediction is exact, not a rule of thumb: it counts the elements each rank owns
by :func:`hpcdp.ownership.owned_ranges` (the same function the strategies use), so
for fp32 and AdamW it is DDP's 16 Psi, ZeRO-1's 4 Psi + 4 Psi + 8 Psi / N, ZeRO-2's
4 Psi + 12 Psi / N and ZeRO-3's 16 Psi / N, with uneven shards to the element. It
covers the persistent model state only (parameters, gradients, optimizer state);
the working set (buckets, gathered units) and activations come on top, so the check
refuses only what cannot fit even without them.

Hybrid sharding (``parallel.zero.shard = "node"``) shards over the ``L`` ranks of a
node: the same formulas with ``L`` in place of N (``world_size = L``, ``rank`` = the
node-local rank). :func:`mixed_state_bytes` adds the 16-bit terms (parameters and
gradients in 16 bits, fp32 master copy and optimizer moments; the ZeRO paper's
(2 + 2 + K) Psi).
"""

from __future__ import annotations

from hpcdp.config_error import ConfigError
from hpcdp.ownership import owned_ranges, total

GIB = float(1 << 30)


def optim_slots(optim_cfg) -> int:
    """Optimizer state buffers per parameter: AdamW 2 (m, v), SGD 1 with momentum."""
    if optim_cfg.kind == "adamw":
        return 2
    return 1 if optim_cfg.momentum else 0


def state_bytes(stage: int, groups, world_size: int, rank: int, itemsize: int, slots: int) -> dict:
    """Bytes of parameters, gradients and optimizer state ``rank`` holds (exact for
    these groups; ``groups = [(0, numel)]`` when they are not known yet)."""
    out = {}
    for kind in ("params", "grads", "optim"):
        n = total(owned_ranges(kind, stage, groups, world_size, rank)) * itemsize
        out[kind] = n * slots if kind == "optim" else n
    out["total"] = out["params"] + out["grads"] + out["optim"]
    return out


def mixed_state_bytes(stage: int, groups, world_size: int, rank: int, slots: int, *,
                      half: int = 2, master: int = 4) -> dict:
    """Bytes of model state ``rank`` holds with mixed precision (the ZeRO paper's
    accounting): parameters and gradients in 16 bits (``half`` bytes each), and the
    optimizer's state in fp32: a master copy of the parameters plus ``slots`` moments
    (``master`` bytes each; K = 4 + 4 slots = 12 with Adam). The optimizer state
    (master copy included) is sharded from stage 1, gradients from 2, parameters at 3,
    as :func:`state_bytes`; with ``groups = [(0, Psi)]`` and N dividing Psi that is
    (2 + 2 + K) Psi for DDP, 2 Psi + 2 Psi + K Psi / N at stage 1, 2 Psi + (2 + K) Psi / N
    at stage 2 and (2 + 2 + K) Psi / N at stage 3. For hybrid sharding
    (``parallel.zero.shard = "node"``) pass the ranks per node and the node-local rank.
    hpcdp itself trains in one dtype (:func:`state_bytes`); this is the prediction
    for a 16-bit run with fp32 master state."""
    out = {}
    for kind in ("params", "grads", "optim"):
        n = total(owned_ranges(kind, stage, groups, world_size, rank))
        out[kind] = n * master * (1 + slots) if kind == "optim" else n * half
    out["total"] = out["params"] + out["grads"] + out["optim"]
    return out


def available_bytes() -> int:
    """MemAvailable of this node (Linux), or 0 when unknown (no check then)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_fits(world, need_per_rank: int, *, strategy: str, hint: str = "") -> None:
    """Refuse (ConfigError) when the model state of the ranks on this node exceeds the
    node's available memory. Local: every rank reads /proc/meminfo itself; train.py
    calls it inside a setup stage, whose agreement makes every rank raise the same
    error if any rank refuses (hpcdp.failure.agreement)."""
    avail = available_bytes()
    need_node = need_per_rank * world.local_size
    if avail <= 0 or need_node <= avail:
        return
    raise ConfigError(
        f"parallel.strategy = {strategy!r}: the model state needs {need_per_rank / GIB:.2f} GiB per "
        f"rank (parameters, gradients, optimizer state), {world.local_size} ranks on a node need "
        f"{need_node / GIB:.2f} GiB, more than the {avail / GIB:.2f} GiB available there; "
        f"refused before allocating anything. {hint}".rstrip())


def check_alloc(need: int, what: str, hint: str = "") -> None:
    """Refuse (ConfigError) one process's allocation of ``need`` bytes when it exceeds
    this node's available memory: the check tools that build a model outside training
    (``hpcdp sample``) run before allocating its buffers."""
    avail = available_bytes()
    if avail <= 0 or need <= avail:
        return
    raise ConfigError(f"{what} needs {need / GIB:.2f} GiB, more than the {avail / GIB:.2f} GiB available "
                      f"on this node; refused before allocating anything. {hint}".rstrip())


__all__ = ["optim_slots", "state_bytes", "mixed_state_bytes", "available_bytes", "check_fits", "check_alloc",
           "GIB"]
