"""``hpcdp scale --calibrate``: measure a machine (or an allocation) and write its profile.

What is measured, and what each fit gives (docs/scaling.md has the reasoning):

1. ``hpcdp.scale.linkprobe`` on 2 ranks of one node (and, with ``--inter``, on 2 nodes):
   the exchange line ``alpha + S * beta`` (the link: less mpi4py's own cost of the
   ``Sendrecv`` call, ``py_call_s``, so the wire's C-level line), hpcdp's ring on an
   8 KiB buffer in 4-16 eager segments at equal bytes (slope: one pipelined message's
   software, ``msg_s``; on the Python engine too under the compiled one, for the
   few-step collectives' ``few_step_msg_s``), 8-byte ring and recursive allreduces
   (per-call cost ``call_s``), and one control-message pair (``ctrl_msg_s``: debug
   mode's per-peer fingerprints);
2. in this process: ``gamma`` (a NumPy add, the ring's reduction) and the optimizer's
   time per parameter for the config's optimizer;
3. one-rank training steps of the config at three batch sizes (``B/2, B, 2B``): the
   line ``step_overhead_s + P * optimizer_s_per_param + B * flops_per_sample / flops_per_s``;
4. the compute-only job (:mod:`hpcdp.scale.compute_only`) at each rank count of
   ``--ranks`` (one node): ``contention[k] = t(k) / t(1)``.

Every measurement is a median or best of interleaved repeats; the profile records the
load average before and after, the CPU and the commands, since a shared machine makes
every figure noisy. ``--overlap`` is an input (0: shared-memory MPI driven by the CPU
that computes, the case here; 1: a NIC or DMA engine moves the bytes).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from hpcdp.comm.model import volume as V
from hpcdp.comm.model.cost import SEGMENT_BYTES, Link, Profile, profile_from_dict
from hpcdp.launch import loadavg
from hpcdp.scale.linkprobe import SMALL_BUFFER


# -- fits (pure: unit-tested on synthetic timings) ------------------------------------

def fit_line(xs, ys) -> tuple[float, float]:
    """(intercept, slope) >= 0 of ``y = a + b x``, least squares on relative error
    (weights 1/y, so small and large points count alike)."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    w = 1.0 / y
    A = np.stack([w, x * w], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
    if b < 0:  # no measurable slope: a constant
        return float(np.median(y)), 0.0
    if a < 0:  # through the origin
        return 0.0, float(np.sum(x * y * w * w) / np.sum(x * x * w * w))
    return float(a), float(b)


PIECEWISE_MIN_ERROR = 0.10  # a single line's largest relative residual that asks for a break


def _rel_residuals(xs, ys, a: float, b: float) -> list:
    return [abs(a + b * x - y) / y for x, y in zip(xs, ys)]


def fit_link(exchange, piecewise: bool = True) -> Link:
    """The link from ``[[bytes, seconds], ...]`` of a two-way exchange.

    One line ``alpha + S beta`` where it fits (every point within 10%); otherwise the
    protocol switch of the MPI library (eager up to a threshold, rendezvous above; the
    shared-memory cells vs single-copy, UCX's eager vs rendezvous, a rate limiter's
    burst look alike) as two lines: each break between two probed sizes with at least
    two points on each side is tried, the one with the smallest sum of squared relative
    residuals kept if it at least halves the single line's (a sum, not the largest
    residual: one disturbed small-message point on a loaded machine must not veto a
    break every other point shows); ``eager_bytes`` is the
    largest size on the eager line (Hockney's model per protocol, as LogGP's G changes
    at the threshold)."""
    pts = sorted((int(s), float(t)) for s, t in exchange)
    xs, ys = [s for s, _ in pts], [t for _, t in pts]
    a, b = fit_line(xs, ys)
    res = _rel_residuals(xs, ys, a, b)
    if not piecewise or max(res) <= PIECEWISE_MIN_ERROR or len(pts) < 4:
        return Link(alpha_s=a, beta_s_per_byte=b)
    best = None
    for i in range(2, len(pts) - 1):
        lo = fit_line(xs[:i], ys[:i])
        hi = fit_line(xs[i:], ys[i:])
        sse = sum(r * r for r in _rel_residuals(xs[:i], ys[:i], *lo) + _rel_residuals(xs[i:], ys[i:], *hi))
        if best is None or sse < best[0]:
            best = (sse, xs[i - 1], lo, hi)
    if best is None or best[0] > sum(r * r for r in res) / 2:
        return Link(alpha_s=a, beta_s_per_byte=b)
    _, eager, (a1, b1), (a2, b2) = best
    return Link(alpha_s=a1, beta_s_per_byte=b1, eager_bytes=eager, rndv_alpha_s=a2,
                rndv_beta_s_per_byte=b2)


def fit_ring_beta(probe: dict, gamma: float, per_msg: float = 0.0) -> float:
    """Seconds per byte of a large ring step, from the probe's two large ring allreduces
    at 2 ranks (``ring_large``): between them the per-call cost cancels, the extra
    messages (1 MiB segments) cost ``per_msg`` each (alpha + msg_s), and the rest is
    ``S * ring_beta`` (2(N-1)/N of the buffer sent at N = 2) plus the reduction of half
    the buffer (``gamma``). 0 (not measured: the Sendrecv line's beta is used) without
    that probe or when the slope is not above the reduction."""
    pts = sorted(probe.get("ring_large") or [])
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return 0.0
    (s1, t1), (s2, t2) = pts[0], pts[-1]

    def msgs(s):
        return max(V.ring_messages(s // 4, 2, 1, 4, SEGMENT_BYTES, ("rs", "ag")))

    slope = (t2 - t1 - (msgs(s2) - msgs(s1)) * per_msg) / (s2 - s1)
    return max(0.0, slope - gamma / 2)


def measure_copy(nbytes: int = 4 << 20, reps: int = 20) -> float:
    """Seconds per byte of ``np.copyto`` (an out-of-place collective's result copy)."""
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return best / nbytes


def wire_exchange(probe: dict) -> list:
    """The probe's exchange points less mpi4py's own cost of a ``Sendrecv`` call
    (``py_call_s``, measured to ``MPI.PROC_NULL``): the wire's C-level line, what hpcdp's
    compiled ring (MPI's C functions, no Python per message) pays. Probes recorded
    before ``py_call_s`` existed: the exchanges as they are."""
    py = float(probe.get("py_call_s") or 0.0)
    return [[s, t - py if t > 2 * py else t / 2] for s, t in probe["exchange"]]


def fit_software(probe: dict, link: Link, gamma: float) -> dict:
    """``msg_s``, ``few_step_msg_s``, ``call_s`` (ring, recursive) and ``ctrl_msg_s`` from
    a linkprobe result, with ``link`` the wire's line (:func:`wire_exchange`).

    ``msg_s``: the slope over 4-16 eager segments of one 8 KiB ring at equal bytes
    (``segments_small``; :func:`segment_slope`): a step's segments are independent, so
    they pipeline and each extra one costs its posting, polling and bookkeeping, not the
    wire's latency, which the model adds per dependent message (``alpha``). Under the
    compiled engine the same on the Python engine gives ``few_step_msg_s`` (the few-step
    collectives, recursive doubling among them, still run as Python requests; 0: they
    run on the ring's engine, ``msg_s``). ``call_s``: each 8-byte call less its messages. Probes recorded
    before ``segments_small``: the same over the 256 KiB ring's 2 KiB-128 KiB segments."""
    small = probe.get("segments_small")
    pts, buf = (small, SMALL_BUFFER) if small else (probe["segments"], probe.get("segments_bytes", 256 << 10))
    msg_s = message_cost(pts, buf, link, gamma)
    few = 0.0
    if probe.get("segments_small_python"):
        few = message_cost(probe["segments_small_python"], SMALL_BUFFER, link, gamma)
    calls, a = probe["calls"], link.alpha_at(8)
    ctrl = probe["token_pair_s"] / 2  # debug mode's fingerprints (not on the normal path)
    call = {"ring": max(0.0, calls["ring"] - 2 * (a + msg_s) - 4 * gamma),
            "recursive": max(0.0, calls["recursive"] - (a + (few or msg_s)) - 8 * gamma)}
    return {"msg_s": msg_s, "few_step_msg_s": few, "call_s": call, "ctrl_msg_s": ctrl}


def link_step_extra(probe: dict, link: Link, soft: dict, gamma: float) -> dict:
    """What one dependent message of hpcdp's collectives costs on a link beyond MPI's
    ``Sendrecv`` line, from the link's own 8-byte calls (the probe run on that link).

    The software figures (``msg_s``, ``call_s``) are fitted on the node's pair, where
    that extra is 0 by construction; between nodes the same 8-byte calls measured on
    the inter-node pair are each ``call_s`` plus their dependent messages (2 for the
    ring, 1 for recursive doubling), every one ``alpha + extra + msg_s``: hpcdp's
    nonblocking requests progressed by polling pay the network path per message where
    the blocking ``Sendrecv`` waits inside MPI (quiet emulated cluster, recorded probe:
    ring 93.1 us, recursive 46.0 us across against 48.4 / 23.0 us within a node, 22.4 /
    23.0 us more per dependent message where the ``Sendrecv`` alphas differ by 12.1 us).
    Returns ``{"extra_s": the ring's figure (>= 0), "recursive_s": the same from
    recursive doubling (a cross-check, not used)}``."""
    calls, a = probe["calls"], link.alpha_at(4)
    ring = (calls["ring"] - soft["call_s"]["ring"] - 4 * gamma) / 2 - soft["msg_s"] - a
    few = soft["few_step_msg_s"] or soft["msg_s"]
    rec = calls["recursive"] - soft["call_s"]["recursive"] - 8 * gamma - few - link.alpha_at(8)
    return {"extra_s": max(0.0, ring), "recursive_s": rec}


def with_step_extra(link: Link, extra: float) -> Link:
    """The link with ``extra`` seconds on every message's start-up, both protocols."""
    from dataclasses import replace

    return replace(link, alpha_s=link.alpha_s + extra,
                   rndv_alpha_s=link.rndv_alpha_s + extra if link.eager_bytes else link.rndv_alpha_s)


def segment_slope(points, buffer: int, link: Link, gamma: float) -> float:
    """Seconds per message over ``[[messages, s], ...]`` of one 2-rank ring allreduce of
    ``buffer`` bytes cut into segments: each point less what the wire charges it (its 2
    dependent steps' ``alpha`` and its ``buffer`` bytes, both at the line of its segment
    size, and the reduction of half the buffer), then the least-squares slope. With
    every segment in one protocol (``segments_small``) that is the plain slope; over
    the older probe's 2 KiB-128 KiB segments it keeps the rendezvous ones' line out of
    the software (that probe's slope minus alpha had fitted 0)."""
    xs, rs = [m for m, _ in points], _left_over(points, buffer, link, gamma)
    return float(np.polyfit(xs, rs, 1)[0]) if len(set(xs)) > 1 else 0.0


def _left_over(points, buffer: int, link: Link, gamma: float) -> list:
    """Each point's seconds less what the wire charges it: its 2 dependent steps' ``alpha``
    and its ``buffer`` bytes at the line of its segment size (``buffer / m``: buffer / 2
    per rank's chunk, m / 2 per step), and the reduction of half the buffer."""
    return [t - 2 * link.alpha_at(buffer / m) - buffer * link.coll_beta_at(buffer / m) - buffer / 2 * gamma
            for m, t in points]


def message_cost(points, buffer: int, link: Link, gamma: float) -> float:
    """:func:`segment_slope`; when noise hid the slope (it came out 0 or below, seen on a
    loaded machine), the smallest of the points' what-the-wire-does-not-explain per
    message instead: an upper bound (it charges the call's fixed cost to the messages as
    well) that shrinks as the measurement improves, where 0 would claim the messages cost
    nothing. 0 only when no point has anything left over."""
    slope = segment_slope(points, buffer, link, gamma)
    if slope > 0:
        return slope
    left = [r / m for (m, _), r in zip(points, _left_over(points, buffer, link, gamma))]
    return max(0.0, min(left)) if left else 0.0


def fit_compute(points, params: int, flops_per_sample: float, optimizer_s_per_param: float) -> dict:
    """``flops_per_s`` and ``step_overhead_s`` from ``[[batch, step seconds], ...]`` of one rank.

    When the steps do not grow with the batch (a model so small that noise hides its
    compute), the largest batch's step is taken as all compute (overhead 0) and the
    result says so (``fallback``), instead of failing a study job over it."""
    a, b = fit_line([bt for bt, _ in points], [t for _, t in points])
    if b > 0:
        return {"flops_per_s": flops_per_sample / b,
                "step_overhead_s": max(0.0, a - params * optimizer_s_per_param), "fallback": ""}
    bt, t = max(points)
    return {"flops_per_s": flops_per_sample * bt / t, "step_overhead_s": 0.0,
            "fallback": f"step time did not grow with the batch ({points}): too noisy or too "
                        "small a model; flops_per_s from the largest batch alone"}


def refit_small(profile: Profile, max_bytes: int) -> Profile:
    """The profile with its link and software refitted from its own recorded probe
    (``[provenance.probe_intra]``), using exchanges of at most ``max_bytes`` only: to
    check how well small-message calibration predicts large messages."""
    from dataclasses import replace

    probe = profile.provenance.get("probe_intra")
    if not probe:
        raise SystemExit(f"profile {profile.name}: no recorded probe data ([provenance.probe_intra]); "
                         "recalibrate with this version of hpcdp scale --calibrate")
    small = {**probe, "exchange": [[s, t] for s, t in probe["exchange"] if s <= max_bytes]}
    if len(small["exchange"]) < 2:
        raise SystemExit(f"--probe-max {max_bytes}: fewer than 2 probe sizes that small")
    link = fit_link(wire_exchange(small))
    if all(sz <= max_bytes for sz, _ in probe.get("ring_large") or [[max_bytes + 1, 0]]):
        soft = fit_software(small, link, profile.gamma_s_per_byte)
        link.ring_beta_s_per_byte = fit_ring_beta(probe, profile.gamma_s_per_byte,
                                                  link.segment_alpha_s + soft["msg_s"])
    soft = fit_software(small, link, profile.gamma_s_per_byte)
    inter = profile.inter if profile.provenance.get("inter_measured") else link
    return replace(profile, name=f"{profile.name}-upto{max_bytes}B", intra=link, inter=inter,
                   msg_s=soft["msg_s"], few_step_msg_s=soft["few_step_msg_s"],
                   call_s={**profile.call_s, **soft["call_s"]}, ctrl_msg_s=soft["ctrl_msg_s"])


# -- measurements ----------------------------------------------------------------------

def fastest_probe(probes: list):
    """Element-wise fastest of several linkprobe results (None for none)."""
    if not probes:
        return None
    out = dict(probes[0])
    out["exchange"] = [[s, min(p["exchange"][i][1] for p in probes)]
                       for i, (s, _) in enumerate(probes[0]["exchange"])]
    out["segments"] = [[m, min(p["segments"][i][1] for p in probes)]
                       for i, (m, _) in enumerate(probes[0]["segments"])]
    if all("ring_large" in p for p in probes):
        out["ring_large"] = [[s, min(p["ring_large"][i][1] for p in probes)]
                             for i, (s, _) in enumerate(probes[0]["ring_large"])]
    out["calls"] = {k: min(p["calls"][k] for p in probes) for k in probes[0]["calls"]}
    out["token_pair_s"] = min(p["token_pair_s"] for p in probes)
    if all("py_call_s" in p for p in probes):
        out["py_call_s"] = min(p["py_call_s"] for p in probes)
    for key in ("segments_small", "segments_small_python"):
        if all(key in p for p in probes):
            out[key] = [[m, min(p[key][i][1] for p in probes)] for i, (m, _) in enumerate(probes[0][key])]
    out["rounds"] = len(probes)
    return out


def measure_gamma(nbytes: int = 4 << 20, reps: int = 20) -> float:
    """Seconds per byte of ``np.add(a, b, out=a)`` on float32 (the ring's reduction)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    return best / nbytes


def measure_optimizer(cfg, params: int, reps: int = 20) -> float:
    """Seconds per parameter of one step of the config's optimizer (median)."""
    from hpcdp.optim import build_optimizer

    dt = np.dtype(cfg.run.dtype)
    opt = build_optimizer(cfg.optim, dtype=cfg.run.dtype)
    w = np.zeros(params, dt)
    g = np.full(params, 1e-3, dt)
    opt.step(w, g)  # first call sizes state / compiles
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step(w, g)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / params


def _probe(args, nodes: int, out: Path) -> dict:
    from hpcdp.launch import find_mpiexec, run_child

    path = out.with_suffix(f".probe-{'inter' if nodes > 1 else 'intra'}.json")  # the last round's
    if args.launcher:
        launch = shlex.split(args.launcher.format(n=2, nodes=nodes, ppn=2 // nodes))
    else:
        launch = [find_mpiexec("hpcdp scale --calibrate"), "-n", "2"]
    cmd = launch + [sys.executable, "-m", "hpcdp.scale.linkprobe", "--json", str(path),
                    "--rounds", "3"]
    if args.probe_max:
        from hpcdp.bench.collectives import parse_size
        cmd += ["--max-bytes", str(parse_size(args.probe_max))]
    run_child(cmd, "hpcdp scale --calibrate", args.timeout)
    data = json.loads(path.read_text())
    data["command"] = shlex.join(cmd)
    return data


def measure_rounds(args, points, out: Path, work: Path) -> tuple:
    """``--repeats`` interleaved rounds, each: the link probes, then every step point.
    A burst of load hits one round of everything, not every round of one thing; each
    figure keeps its fastest round. Returns (intra probe, inter probe, {point: step})."""
    from hpcdp.launch import wait_quiet
    from hpcdp.scale.study import run_point

    probes: dict = {"intra": [], "inter": []}
    best: dict = {}
    for rnd in range(args.repeats):
        wait_quiet(getattr(args, "wait_quiet", 0.0), getattr(args, "wait_max", 1800.0))
        if args.ranks_per_node != 1:  # one rank per node: there is no intra-node pair
            probes["intra"].append(_probe(args, 1, out))
        if args.inter:
            probes["inter"].append(_probe(args, 2, out))
        for k, gb, variant in points:
            t = run_point(args, k, gb, variant, work)["step_time_s"]
            best[(k, gb, variant)] = min(t, best.get((k, gb, variant), t))
        print(f"  round {rnd + 1}/{args.repeats}: load {loadavg()}", flush=True)
    return fastest_probe(probes["intra"]), fastest_probe(probes["inter"]), best


def run(args) -> Profile:
    from hpcdp.scale.study import study_ranks
    from hpcdp.config import load_config
    from hpcdp.scale.model import workload_from_config

    if not args.out.endswith(".toml"):
        raise SystemExit("hpcdp scale --calibrate: --out must name the profile file to write, "
                         "e.g. --out profiles/mycluster.toml")
    if args.steps <= args.warmup:
        raise SystemExit(f"hpcdp scale: --steps {args.steps} must exceed --warmup {args.warmup}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_suffix(".runs")
    cfg = load_config(args.config, args.set or [], shared_options=True)
    wl = workload_from_config(cfg)
    batch = args.batch or cfg.train.global_batch
    load_before = loadavg()
    print(f"calibrating: load average {load_before}", flush=True)

    if args.ranks_per_node == 1 and not args.inter:
        raise SystemExit("hpcdp scale --calibrate: with one rank per node there is no intra-node "
                         "link to measure; add --inter (2 nodes)")
    batches = sorted({max(1, batch // 2), batch, 2 * batch})
    ranks = study_ranks(args.ranks)
    points = [(1, b, "bucketed") for b in batches] + [(k, k * batch, "compute_only") for k in ranks]
    intra, inter, best = measure_rounds(args, points, out, work)
    link_inter = fit_link(wire_exchange(inter)) if inter else None
    link_intra = fit_link(wire_exchange(intra)) if intra else link_inter
    link_inter = link_inter or link_intra
    gamma = measure_gamma()
    copy = measure_copy()
    soft = fit_software(intra or inter, link_intra, gamma)
    extra = None
    if inter and intra:  # the inter link as hpcdp's collectives see it: its own 8-byte calls
        extra = link_step_extra(inter, link_inter, soft, gamma)
        link_inter = with_step_extra(link_inter, extra["extra_s"])
        print(f"  inter-node: {extra['extra_s'] * 1e6:.2f} us per dependent message beyond the "
              f"Sendrecv line (recursive doubling's calls say {extra['recursive_s'] * 1e6:.2f} us)", flush=True)
    for link, probe in ((link_intra, intra or inter), (link_inter, inter or intra)):
        link.ring_beta_s_per_byte = fit_ring_beta(probe, gamma, link.segment_alpha_s + soft["msg_s"])
    opt_s = measure_optimizer(cfg, wl.params)
    for kind, link in (("intra", link_intra), ("inter", link_inter if inter else None)):
        if link is not None and link.eager_bytes:
            print(f"  {kind} protocol break after {link.eager_bytes} B: above it alpha "
                  f"{link.rndv_alpha_s * 1e6:.2f} us, beta {1e9 * link.rndv_beta_s_per_byte:.3f} ns/B",
                  flush=True)
    print(f"  link: alpha {link_intra.alpha_s * 1e6:.2f} us, beta {1e9 * link_intra.beta_s_per_byte:.3f} "
          f"ns/B, ring {1e9 * link_intra.ring_beta:.3f} ns/B; gamma {1e9 * gamma:.3f} ns/B; "
          f"copy {1e9 * copy:.3f} ns/B; msg {soft['msg_s'] * 1e6:.2f} us (few-step "
          f"{(soft['few_step_msg_s'] or soft['msg_s']) * 1e6:.2f} us); "
          f"optimizer {opt_s * 1e9:.2f} ns/param", flush=True)
    steps = {b: best[(1, b, "bucketed")] for b in batches}
    comp = fit_compute([[b, t] for b, t in steps.items()], wl.params, wl.flops_per_sample, opt_s)
    print(f"  compute: {', '.join(f'B={b}: {1e3 * t:.2f} ms' for b, t in steps.items())} -> "
          f"{comp['flops_per_s'] / 1e9:.2f} GFLOP/s, overhead {1e3 * comp['step_overhead_s']:.2f} ms",
          flush=True)
    co = {k: best[(k, k * batch, "compute_only")] for k in ranks}
    contention = {str(k): co[k] / co[1] for k in ranks}
    print(f"  contention (compute-only step vs one rank): {contention}", flush=True)

    cores = int(os.environ.get("SLURM_CPUS_ON_NODE", 0) or os.cpu_count() or 0)
    prof = profile_from_dict({
        "name": out.stem,
        "description": args.description or f"measured by hpcdp scale --calibrate on {platform.node()}",
        "intra": link_intra.__dict__, "inter": link_inter.__dict__,
        "gamma_s_per_byte": gamma, "copy_s_per_byte": copy, "call_s": soft["call_s"], "msg_s": soft["msg_s"],
        "ctrl_msg_s": soft["ctrl_msg_s"], "few_step_msg_s": soft["few_step_msg_s"],
        "flops_per_s": comp["flops_per_s"],
        "optimizer_s_per_param": opt_s, "step_overhead_s": comp["step_overhead_s"],
        "ranks_per_node": args.ranks_per_node or max(cores, max(ranks)), "nics_per_node": 1,
        "cores_per_node": cores, "overlap": args.overlap, "contention": contention,
        "provenance": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
            "cpu": _cpu_model(), "load_before": load_before, "load_after": loadavg(),
            "command": "hpcdp scale " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
            "config": str(args.config), "batch": batch,
            "inter_measured": bool(inter), "probes": [p["command"] for p in (intra, inter) if p],
            **({"inter_step_extra_s": extra["extra_s"], "inter_step_extra_recursive_s": extra["recursive_s"]}
               if extra else {}),
            **{f"probe_{kind}": {k: p[k] for k in ("exchange", "segments", "calls", "token_pair_s",
                                                   "ring_large", "py_call_s", "segments_small",
                                                   "segments_small_python") if k in p}
               for kind, p in (("intra", intra), ("inter", inter)) if p},
            "compute_steps": {str(b): t for b, t in steps.items()},
            "compute_fit": comp["fallback"] or "line over the batch sizes",
            "compute_only_steps": {str(k): t for k, t in co.items()},
        }})
    write_profile(prof, out)
    print(f"wrote {out}")
    return prof


def write_profile(prof: Profile, path: Path) -> None:
    from hpcdp.config import dump_toml

    text = dump_toml(prof.to_toml_dict())
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # never a half-written profile


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
