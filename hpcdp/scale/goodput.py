"""Goodput with failures: the checkpoint interval and the share of wall time that trains.

A job on ``nodes`` nodes, each failing at random (exponential, mean ``node_mttf_s``),
fails as a whole at the rate ``nodes / node_mttf_s``: its mean time to failure is
``M = node_mttf_s / nodes``. Two policies:

**classic** (what hpcdp does today: every rank ends, the job is requeued and resumes from
its newest checkpoint). Training runs in segments of ``tau`` seconds, each followed by a
save of ``delta`` seconds (the training time a save costs: ``hpcdp bench ckpt``'s stall
per save); a failure loses the segment in progress (and a save in progress), then the
restart takes ``R`` seconds (requeue, launch, restore; a failure during it restarts it).
With exponential failures the expected wall time per segment is exact (Daly 2006, eq. 13;
failures during saves and restarts included):

    wall(tau) = M e^(R/M) (e^((tau + delta)/M) - 1)           goodput = tau / wall(tau)

The interval that maximises it: Young (1974) ``sqrt(2 delta M)``; Daly's higher-order
estimate (2006, eq. 37) ``sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 + delta/(18M)] - delta``
for ``delta < 2M``, else ``M``. :func:`best_interval` also finds the maximum of the exact
expression, in whole steps.

**continue** (a job that keeps training through a rank loss: failure.on_rank_loss =
"continue", issue 36, being built; the figures it needs are parameters here). A node's
loss costs ``repair_s`` of every survivor's time (detection, agreement, shrinking the
communicators, redoing the uncommitted step's start: ft's measured "kill to the first
committed step on the survivors"; its aim is 3 s at p95), the part of the step in flight
(half a step on average), and the lost node's share of throughput (``ranks_per_node /
ranks``) until a node rejoins after ``rejoin_s``. To first order in ``lambda = 1/M``:

    goodput = 1 - lambda (repair_s + step_s / 2 + rejoin_s * L / N)

times the classic goodput of the failures the mode cannot survive (``fatal_fraction`` of
them, e.g. below the minimum world size; 0: none, and no checkpoints are needed).

:func:`simulate_classic` and :func:`simulate_continue` play each policy out step by step
against random failures (seeded); tests/unit/test_goodput.py holds the formulas to them
within 2% over a grid of MTTFs and save times.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

HOUR = 3600.0


# -- classic: end, requeue, resume ---------------------------------------------------

def young_interval(delta: float, M: float) -> float:
    """Young (1974): the checkpoint interval sqrt(2 delta M)."""
    return math.sqrt(2.0 * delta * M)


def daly_interval(delta: float, M: float) -> float:
    """Daly (2006) higher-order estimate of the optimum interval (compute between saves)."""
    if delta >= 2.0 * M:
        return M
    x = delta / (2.0 * M)
    return math.sqrt(2.0 * delta * M) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def classic_goodput(tau: float, delta: float, restart: float, M: float) -> float:
    """Share of wall time that is kept training: tau / wall(tau) (Daly 2006, exact for
    exponential failures)."""
    if tau <= 0 or M <= 0:
        raise ValueError("goodput: the interval and the MTTF must be > 0")
    wall = M * math.exp(restart / M) * math.expm1((tau + delta) / M)
    return tau / wall


def best_interval(delta: float, restart: float, M: float, step_s: float = 0.0) -> float:
    """The interval that maximises :func:`classic_goodput` (golden-section search on a
    unimodal function), rounded to whole steps of ``step_s`` when given."""
    lo, hi = 1e-9 * M, 20.0 * max(M, delta)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(200):
        if classic_goodput(a, delta, restart, M) < classic_goodput(b, delta, restart, M):
            lo, a = a, b
            b = lo + g * (hi - lo)
        else:
            hi, b = b, a
            a = hi - g * (hi - lo)
    tau = (lo + hi) / 2
    if step_s > 0:
        k = max(1, round(tau / step_s))
        tau = max((kk * step_s for kk in (k - 1, k, k + 1) if kk >= 1),
                  key=lambda t: classic_goodput(t, delta, restart, M))
    return tau


def continue_goodput(M: float, repair: float, step_s: float, rejoin: float, lost_share: float,
                     fatal_fraction: float = 0.0, delta: float = 0.0, restart: float = 0.0,
                     tau: float | None = None) -> float:
    """The continue mode's goodput, first order in 1/M (module docstring). With
    ``fatal_fraction`` > 0 the failures it cannot survive are handled the classic way
    (checkpoints every ``tau``, default Daly's interval for them)."""
    survivable = (1.0 - fatal_fraction) / M
    g = 1.0 - survivable * (repair + step_s / 2.0 + rejoin * lost_share)
    if fatal_fraction > 0:
        Mf = M / fatal_fraction
        t = tau if tau is not None else daly_interval(delta, Mf)
        g *= classic_goodput(t, delta, restart, Mf)
    return max(0.0, g)


# -- the policies played out ----------------------------------------------------------

def simulate_classic(tau_steps: int, step_s: float, delta: float, restart: float, M: float,
                     failures: int = 2000, seed: int = 0) -> float:
    """Goodput of the classic policy played out step by step: ``tau_steps`` steps of
    ``step_s``, then a save of ``delta``; failures from an exponential clock of mean ``M``
    (wall time: during steps, saves and restarts alike); a failure loses everything since
    the last completed save and costs a restart of ``restart`` seconds (which a failure
    starts again). Runs until ``failures`` failures have happened."""
    rng = random.Random(seed)
    clock = kept = 0.0
    seen = 0
    nxt = rng.expovariate(1.0 / M)
    while seen < failures:
        # the segment's steps, one after the other; those that end before the next
        # failure are counted at once
        done = min(tau_steps, math.floor((nxt - clock) / step_s))
        clock += done * step_s
        if done == tau_steps and clock + delta <= nxt:  # every step and the save complete
            clock += delta
            kept += tau_steps * step_s
            continue
        # a failure at time nxt (in a step or in the save): the segment is lost, then
        # the restart (begun again while failures hit it)
        clock = nxt
        seen += 1
        nxt = clock + rng.expovariate(1.0 / M)
        while clock + restart > nxt:
            clock = nxt
            seen += 1
            nxt = clock + rng.expovariate(1.0 / M)
        clock += restart
    return kept / clock


def simulate_continue(step_s: float, repair: float, rejoin: float, nodes: int, node_mttf: float,
                      failures: int = 2000, seed: int = 0) -> float:
    """Goodput of the continue mode played out step by step on ``nodes`` nodes (each
    fails at rate 1/``node_mttf``, only while it is in the job): a failure loses the step
    in flight and stalls everyone for ``repair`` seconds; the job then trains at the
    survivors' share of its throughput until the node rejoins ``rejoin`` seconds after the
    failure. Goodput = work done (in full-job step time) / wall time."""
    rng = random.Random(seed)
    clock = kept = 0.0
    seen = 0
    back = []  # times at which lost nodes rejoin

    def next_failure(now):
        up = nodes - len(back)
        return now + rng.expovariate(up / node_mttf) if up > 0 else math.inf

    nxt = next_failure(0.0)
    while seen < failures:
        while back and back[0] <= clock:
            back.pop(0)
            nxt = next_failure(clock)  # memoryless: redraw with the new count
        rate = (nodes - len(back)) / nodes  # share of the full job's throughput
        # whole steps at this rate: until the next failure, or until a node rejoins (the
        # rate changes at the first step boundary after it)
        n = math.floor((nxt - clock) / step_s)
        if back:
            n = min(n, math.ceil((back[0] - clock) / step_s))
        if n >= 1:
            clock += n * step_s
            kept += n * step_s * rate
            continue
        # a node fails inside this step: the step is lost, everyone repairs
        clock = nxt
        seen += 1
        back.append(clock + rejoin)
        back.sort()
        end = clock + repair
        nxt = next_failure(clock)
        while nxt < end:  # another failure during the repair: repaired together, later
            seen += 1
            back.append(nxt + rejoin)
            back.sort()
            end = nxt + repair
            nxt = next_failure(nxt)
        clock = end
    return kept / clock


# -- the plan per rank count ------------------------------------------------------------

@dataclass
class GoodputRow:
    ranks: int
    nodes: int
    job_mttf_s: float
    step_s: float
    young_s: float
    daly_s: float
    interval_s: float          # the best interval in whole steps (exact expression)
    interval_steps: int
    goodput_classic: float
    goodput_continue: float

    def as_dict(self) -> dict:
        return asdict(self)


def plan(ranks: list, per_node: int, node_mttf_s: float, save_s: float, restart_s: float,
         step_s_of, repair_s: float = 3.0, rejoin_s: float | None = None,
         fatal_fraction: float = 0.0) -> list:
    """A :class:`GoodputRow` per rank count; ``step_s_of(N)`` is the predicted step."""
    if node_mttf_s <= 0 or save_s < 0 or restart_s < 0 or repair_s < 0:
        raise ValueError("goodput: the node MTTF must be > 0 and the save, restart and repair times >= 0")
    if not 0.0 <= fatal_fraction <= 1.0:
        raise ValueError(f"goodput: --fatal-fraction {fatal_fraction} is a share of the failures, 0 to 1")
    rejoin = restart_s if rejoin_s is None else rejoin_s
    rows = []
    for N in ranks:
        nodes = -(-N // per_node)
        M = node_mttf_s / nodes
        step_s = step_s_of(N)
        tau = best_interval(save_s, restart_s, M, step_s)
        lost_share = min(per_node, N) / N
        rows.append(GoodputRow(
            ranks=N, nodes=nodes, job_mttf_s=M, step_s=step_s, young_s=young_interval(save_s, M),
            daly_s=daly_interval(save_s, M), interval_s=tau, interval_steps=max(1, round(tau / step_s)),
            goodput_classic=classic_goodput(tau, save_s, restart_s, M),
            goodput_continue=continue_goodput(M, repair_s, step_s, rejoin, lost_share, fatal_fraction,
                                              save_s, restart_s)))
    return rows


def _dur(s: float) -> str:
    if s >= 2 * HOUR:
        return f"{s / HOUR:.1f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def format_plan(rows: list, node_mttf_s: float, save_s: float, restart_s: float, repair_s: float,
                rejoin_s: float, source: str = "") -> str:
    lines = [f"goodput with failures: node MTTF {_dur(node_mttf_s)}, save {save_s:.2f} s"
             + (f" ({source})" if source else "") + f", restart {_dur(restart_s)}; continue mode: "
             f"repair {repair_s:.1f} s, a lost node back after {_dur(rejoin_s)}",
             f"{'ranks':>6} {'nodes':>6} {'job MTTF':>9} {'Young':>9} {'Daly':>9} {'interval':>19} "
             f"{'classic':>8} {'continue':>9}"]
    for r in rows:
        lines.append(f"{r.ranks:>6} {r.nodes:>6} {_dur(r.job_mttf_s):>9} {_dur(r.young_s):>9} "
                     f"{_dur(r.daly_s):>9} {_dur(r.interval_s):>8} {r.interval_steps:>9} st "
                     f"{100 * r.goodput_classic:>7.2f}% {100 * r.goodput_continue:>8.2f}%")
    lines.append("(classic: end, requeue, resume from the newest checkpoint, saving every 'interval' "
                 "steps (the best whole number; Young's and Daly's estimates beside it); continue: "
                 "keep training through a rank loss (issue 36), its repair time a parameter until "
                 "measured)")
    return "\n".join(lines)


def save_s_from_bench(path: str, mode: str = "") -> tuple[float, str]:
    """The training time one save costs, from ``hpcdp bench ckpt --json FILE``: the
    stall per save of ``mode`` (sync, thread, process), or of the measured mode that
    stalls least. Returns (seconds, where it came from)."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--ckpt-bench {path}: {e}") from None
    rows = data.get("stall") or []
    if mode:
        rows = [r for r in rows if r.get("mode") == mode]
    if not rows:
        raise ValueError(f"--ckpt-bench {path}: no stall rows{' of mode ' + mode if mode else ''} "
                         "(run hpcdp bench ckpt without --no-stall, with --json)")
    best = min(rows, key=lambda r: r["stall_s"])
    return float(best["stall_s"]), f"hpcdp bench ckpt, {best['mode']} save: stall per save"


__all__ = ["young_interval", "daly_interval", "classic_goodput", "best_interval", "continue_goodput",
           "simulate_classic", "simulate_continue", "plan", "format_plan", "GoodputRow",
           "save_s_from_bench"]
