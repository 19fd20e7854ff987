"""What hpcdp's collectives cost on a machine: the link half of the cost model.

A machine is a :class:`Profile` (TOML, measured by ``hpcdp scale --calibrate`` or written
from a cluster's data sheet; shipped ones in ``hpcdp/comm/model/profiles/``). Every byte and
message count comes from :mod:`hpcdp.comm.model.volume` (the one place for them); this module
only turns counts into seconds, alpha-beta-gamma style:

    time = messages * alpha[link] + bytes * beta[link] * share + reduced bytes * gamma
           + software (messages * msg_s + per call: call_s[algorithm]
                       [+ 2(G-1) control messages * ctrl_msg_s in debug mode])

``latency`` is the wire's part (messages * alpha), ``software`` all of hpcdp's own
(Python) cost, so a table can say which of the two limits a collective.

- ``alpha`` (s per message) and ``beta`` (s per byte) per link kind: ``intra`` (ranks of
  one node: shared memory, NVLink) and ``inter`` (between nodes: the NIC). A ring step is
  as slow as its slowest hop, so a flat ring that spans nodes runs at the inter-node
  figures. ``share``: ranks of one node that drive inter-node traffic at once, per NIC
  (the hierarchical allreduce runs one cross-node ring per local rank).
- ``gamma`` (s per byte): the reduction (a NumPy add) of every byte a rank receives in a
  reduce-scatter or recursive-doubling round.
- software: hpcdp's Python layer. ``msg_s`` per message it sends (posting, polling,
  bookkeeping; on top of the wire's alpha), ``call_s[algorithm]`` per collective call
  (argument checks, request setup). hpcdp's collectives send nothing else on their way
  (missing ranks are found lazily, after a timeout: docs/collectives.md); only debug mode
  (``HPCDP_DEBUG=1``) sends a fingerprint to every peer per call, ``2(G-1)`` control
  messages on a group of G ranks, ``ctrl_msg_s`` each: a profile with ``debug = true``
  predicts such runs. That term grows with N like the ring's latency.

Priced here: the ring (reduce-scatter, all-gather, allreduce), recursive doubling, the
hierarchical allreduce and the parameter server's push + pull; :func:`fastest_allreduce`
is what ``algorithm="auto"`` runs when a profile is configured (hpcdp.comm.auto).

A profile also describes a rank's compute (``flops_per_s``, the optimizer's cost per
parameter, ``contention``, ``overlap``): the workload half of the model, which prices a
training config's step strategy by strategy, is :mod:`hpcdp.scale.model`.
"""
from __future__ import annotations

import functools
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpcdp.comm.model import volume as V

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"  # shipped as package data
SEGMENT_BYTES = 1 << 20  # hpcdp's ring segment (hpcdp.comm.ring.DEFAULT_SEGMENT_BYTES)


# -- the machine -----------------------------------------------------------------------

@dataclass
class Link:
    alpha_s: float           # per message
    beta_s_per_byte: float   # per byte, one direction (links are full duplex)
    # per byte of a ring step at large messages, fitted from hpcdp's own ring at two
    # sizes (hpcdp.scale.calibrate.fit_ring_beta: the working buffers, cache effects and
    # the receive path of the collectives themselves); 0: not measured, beta is used
    ring_beta_s_per_byte: float = 0.0
    # the protocol switch (eager -> rendezvous; a token bucket's burst on a rate-limited
    # link looks alike): messages of at most ``eager_bytes`` cost ``alpha_s + m beta_s_per_byte``,
    # larger ones ``rndv_alpha_s + m rndv_beta_s_per_byte`` (the piecewise line
    # hpcdp.scale.calibrate.fit_link fits from the probe's sizes). 0: one line for all
    eager_bytes: int = 0
    rndv_alpha_s: float = 0.0
    rndv_beta_s_per_byte: float = 0.0

    @property
    def ring_beta(self) -> float:
        return self.ring_beta_s_per_byte or self.beta_s_per_byte

    @property
    def segment_alpha_s(self) -> float:
        """The wire's cost per message of one of the ring's full segments
        (``SEGMENT_BYTES``: the protocol large ring steps travel by)."""
        return self.alpha_at(SEGMENT_BYTES)

    def _eager(self, m: float) -> bool:
        return not self.eager_bytes or m <= self.eager_bytes

    def alpha_at(self, m: float) -> float:
        """Seconds per message of ``m`` bytes (the protocol it travels by)."""
        return self.alpha_s if self._eager(m) else self.rndv_alpha_s

    def beta_at(self, m: float) -> float:
        """Seconds per byte of a message of ``m`` bytes, MPI's point-to-point line."""
        return self.beta_s_per_byte if self._eager(m) else self.rndv_beta_s_per_byte

    def coll_beta_at(self, m: float) -> float:
        """Seconds per byte of one of hpcdp's collective steps with messages of ``m``
        bytes: the collectives' own large-message slope (``ring_beta``: working
        buffers, cache effects) for rendezvous messages, the eager line below. With
        one line (no ``eager_bytes``), ``ring_beta`` as before."""
        if not self.eager_bytes:
            return self.ring_beta
        return self.beta_s_per_byte if self._eager(m) else (self.ring_beta_s_per_byte
                                                           or self.rndv_beta_s_per_byte)


@dataclass
class Profile:
    name: str
    intra: Link
    inter: Link
    gamma_s_per_byte: float          # reduction speed
    call_s: dict                     # hpcdp software cost per call, by algorithm
    msg_s: float                     # hpcdp software cost per data message
    ctrl_msg_s: float                # per control message (debug mode: 2(G-1) per call)
    flops_per_s: float               # achieved training FLOP/s of one rank
    optimizer_s_per_param: float
    step_overhead_s: float = 0.0     # per step, independent of batch and model size
    ranks_per_node: int = 1
    nics_per_node: int = 1
    cores_per_node: int = 0          # 0: unknown (no oversubscription flag)
    overlap: float = 1.0
    contention: dict = field(default_factory=dict)  # ranks on a node -> compute factor
    description: str = ""
    debug: bool = False              # predict HPCDP_DEBUG=1 runs (fingerprints every call)
    provenance: dict = field(default_factory=dict)  # how it was measured / sources
    copy_s_per_byte: float = 0.0     # a buffer copy (out-of-place results); 0: not measured
    # hpcdp's cost per message of the few-step collectives (recursive doubling / halving,
    # Bruck, the hierarchical reduce-scatter / all-gather) where they run on another
    # engine than the ring (the compiled engine runs the ring; these stay Python
    # requests); 0: msg_s
    few_step_msg_s: float = 0.0

    def __post_init__(self):
        if isinstance(self.call_s, (int, float)):
            self.call_s = {"ring": float(self.call_s)}
        if "ring" not in self.call_s or min(self.call_s.values()) < 0:
            raise ValueError(f"profile {self.name}: call_s needs a 'ring' entry, all >= 0 (seconds)")
        for key in ("gamma_s_per_byte", "msg_s", "ctrl_msg_s", "optimizer_s_per_param",
                    "step_overhead_s", "copy_s_per_byte", "few_step_msg_s"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"profile {self.name}: {key} must be >= 0, got {getattr(self, key)!r}")
        for kind in ("intra", "inter"):
            link = getattr(self, kind)
            if not (link.alpha_s >= 0 and link.beta_s_per_byte >= 0 and link.ring_beta_s_per_byte >= 0
                    and link.eager_bytes >= 0 and link.rndv_alpha_s >= 0 and link.rndv_beta_s_per_byte >= 0):
                raise ValueError(f"profile {self.name}: [{kind}] alpha_s, beta_s_per_byte, "
                                 "ring_beta_s_per_byte, eager_bytes, rndv_alpha_s and "
                                 "rndv_beta_s_per_byte must be >= 0")
        if not self.flops_per_s > 0:
            raise ValueError(f"profile {self.name}: flops_per_s must be > 0, got {self.flops_per_s!r}")
        if self.ranks_per_node < 1 or self.nics_per_node < 1:
            raise ValueError(f"profile {self.name}: ranks_per_node and nics_per_node must be >= 1")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"profile {self.name}: overlap must be in [0, 1], got {self.overlap!r}")
        self.contention = {int(k): float(v) for k, v in self.contention.items()}

    @property
    def few_msg_s(self) -> float:
        """Software per message of the few-step collectives."""
        return self.few_step_msg_s or self.msg_s

    def contention_at(self, ranks_on_node: int) -> float:
        """Measured compute slowdown with this many ranks on a node (nearest measured
        count at or below it; 1.0 when none was measured)."""
        known = [k for k in self.contention if k <= ranks_on_node]
        return self.contention[max(known)] if known else 1.0

    def to_toml_dict(self) -> dict:
        d = asdict(self)
        d["contention"] = {str(k): v for k, v in sorted(self.contention.items())}
        return d


def profile_from_dict(d: dict, where: str = "profile") -> Profile:
    d = dict(d)
    try:
        d["inter"] = Link(**d.get("inter", d["intra"]))  # one node only: no inter link
        d["intra"] = Link(**d["intra"])
        return Profile(**d)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: not a machine profile ({e}); see docs/scaling.md for the keys") from None


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


@functools.lru_cache(maxsize=16)
def load_profile(name_or_path: str) -> Profile:
    """A profile from a TOML file, or a shipped one by name (``hpcdp/profiles/NAME.toml``)."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ValueError(f"machine profile {name_or_path!r}: no such file, and no shipped profile of "
                         f"that name (shipped: {', '.join(available_profiles())}); "
                         "make one with hpcdp scale --calibrate")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"machine profile {path}: {e}") from None
    return profile_from_dict(data, str(path))


@dataclass(frozen=True)
class Topology:
    """N ranks in blocks of ``per_node`` (ranks 0..L-1 on node 0, ...)."""

    nodes: int
    per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    @classmethod
    def of(cls, N: int, per_node: int) -> "Topology":
        """Nodes filled in order; a last, partly filled node counts as a whole one."""
        per = min(N, per_node)
        return cls(nodes=-(-N // per), per_node=per)


# -- costs -----------------------------------------------------------------------------
# software_cost, debug_ctrl_cost and ring_phases_cost are the building blocks a new
# algorithm's cost function (registered in hpcdp.comm.algorithms) is written with.

@dataclass
class Cost:
    """Seconds by cause, and the bytes one rank sends/receives per link kind."""

    latency_s: float = 0.0
    bandwidth_s: float = 0.0
    reduce_s: float = 0.0
    software_s: float = 0.0
    intra: tuple = (0, 0)
    inter: tuple = (0, 0)

    @property
    def total_s(self) -> float:
        return self.latency_s + self.bandwidth_s + self.reduce_s + self.software_s

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.latency_s + o.latency_s, self.bandwidth_s + o.bandwidth_s,
                    self.reduce_s + o.reduce_s, self.software_s + o.software_s,
                    _add2(self.intra, o.intra), _add2(self.inter, o.inter))

    @property
    def link_bytes(self) -> int:
        """Bytes this rank sends plus receives, all links."""
        return sum(self.intra) + sum(self.inter)


def _add2(a, b):
    return (a[0] + b[0], a[1] + b[1])


def software_cost(p: Profile, group: int, algorithm: str = "ring", calls: int = 1) -> float:
    """hpcdp's per-call cost: request setup (plus, in debug mode, 2(G-1) fingerprint
    messages per call)."""
    if group <= 1:
        return 0.0
    call = p.call_s.get(algorithm, p.call_s["ring"])
    return calls * (call + debug_ctrl_cost(p, group))


def debug_ctrl_cost(p: Profile, group: int) -> float:
    """Debug mode's fingerprint exchange on a group of ``group`` ranks (0 otherwise)."""
    return 2 * (group - 1) * p.ctrl_msg_s if p.debug else 0.0


def ring_phases_cost(p: Profile, nbytes: int, G: int, kind: str, phases, share: float = 1.0,
          itemsize: int = 4, calls: int = 1, call_group: int | None = None) -> Cost:
    """One ring collective over G ranks whose slowest hop is a ``kind`` link. The rank
    counted is G-1 (the smallest chunk under the shard rule: the most bytes)."""
    if G <= 1 or nbytes <= 0:
        return Cost()
    n, r = nbytes // itemsize, G - 1
    sent, recv = V.ring_bytes(n, G, r, itemsize, phases)
    msgs = max(V.ring_messages(n, G, r, itemsize, SEGMENT_BYTES, phases))
    rs_recv = V.ring_bytes(n, G, r, itemsize, ("rs",))[1] if "rs" in phases else 0
    link = getattr(p, kind)
    m = min(SEGMENT_BYTES, -(-nbytes // G))  # the size of one ring message
    c = Cost(latency_s=msgs * link.alpha_at(m),
             bandwidth_s=max(sent, recv) * link.coll_beta_at(m) * share,
             reduce_s=rs_recv * p.gamma_s_per_byte,
             software_s=software_cost(p, call_group or G, "ring", calls) + msgs * p.msg_s)
    setattr(c, kind, (sent, recv))
    return c


def _flat_kind(t: Topology) -> str:
    return "inter" if t.nodes > 1 else "intra"


def ring_allreduce(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    return ring_phases_cost(p, nbytes, t.ranks, _flat_kind(t), ("rs", "ag"), itemsize=itemsize)


def reduce_scatter(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """Out of place (as ``hpcdp bench collectives`` runs it): the reduced chunk is copied
    from the working buffer to the result at the end (``copy_s_per_byte``)."""
    c = ring_phases_cost(p, nbytes, t.ranks, _flat_kind(t), ("rs",), itemsize=itemsize)
    c.reduce_s += _chunk_copy_s(p, nbytes, t.ranks)
    return c


def all_gather(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """Out of place: the rank's own chunk is copied into the result first."""
    c = ring_phases_cost(p, nbytes, t.ranks, _flat_kind(t), ("ag",), itemsize=itemsize)
    c.reduce_s += _chunk_copy_s(p, nbytes, t.ranks)
    return c


def _chunk_copy_s(p: Profile, nbytes: int, G: int) -> float:
    return 0.0 if G <= 1 or nbytes <= 0 else -(-nbytes // G) * p.copy_s_per_byte


def recursive_allreduce(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """log2(p) whole-buffer exchanges (+ a fold and an unfold on the critical path when N
    is not a power of two). With L ranks per node (a power of two) and ranks in node
    blocks, the first log2(L) rounds pair ranks of one node; fold pairs (2i, 2i+1) share
    a node when L is even."""
    N = t.ranks
    if N <= 1 or nbytes <= 0:
        return Cost()
    rounds = (1 << (N.bit_length() - 1)).bit_length() - 1
    fold = 1 if N & (N - 1) else 0
    per, multi = t.per_node, t.nodes > 1
    intra_rounds = (min(rounds, per.bit_length() - 1) if per & (per - 1) == 0 else 0) if multi else rounds
    fold_kind = "inter" if multi and per % 2 else "intra"
    sent, recv = V.recursive_bytes(nbytes, N, 1 if fold else N - 1)  # a rank on the longest path
    exchange = max(sent, recv) / (rounds + fold)   # bytes of one exchange, each way
    c = Cost(software_s=software_cost(p, N, "recursive"),
             reduce_s=(rounds + fold) * nbytes * p.gamma_s_per_byte)
    for kind, k, hops in (("intra", intra_rounds, intra_rounds), ("inter", rounds - intra_rounds,
                                                                   rounds - intra_rounds),
                          (fold_kind, fold, 2 * fold)):
        if k:
            link = getattr(p, kind)
            c.latency_s += hops * link.alpha_at(exchange)
            c.software_s += hops * p.few_msg_s
            c.bandwidth_s += hops * exchange * _step_beta(link, exchange)
            setattr(c, kind, _add2(getattr(c, kind), (round(k * exchange),) * 2))
    return c


def _step_beta(link: Link, m: float) -> float:
    """Per byte of a few-step algorithm's exchange of ``m`` bytes: MPI's line, or with a
    per-protocol profile the collectives' own slope for rendezvous messages (the
    working buffer a round receives into and reduces from, as in the ring)."""
    return link.coll_beta_at(m) if link.eager_bytes else link.beta_s_per_byte


def hierarchical_allreduce(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """Reduce-scatter in the node, ring allreduce of 1/L of the buffer across nodes (L
    rings at once share the node's NICs), all-gather in the node (hpcdp.comm.hierarchical)."""
    L, M = t.per_node, t.nodes
    if t.ranks <= 1 or nbytes <= 0:
        return Cost()
    n = nbytes // itemsize
    chunk = V.hierarchical_bytes(n, M, L, M - 1, L - 1, itemsize)  # counts, for the check below
    share = max(1.0, L / p.nics_per_node)
    c = (ring_phases_cost(p, nbytes, L, "intra", ("rs",), itemsize=itemsize)
         + ring_phases_cost(p, (n // L) * itemsize, M, "inter", ("rs", "ag"), share, itemsize)
         + ring_phases_cost(p, nbytes, L, "intra", ("ag",), itemsize=itemsize))
    # the outer request's own setup (the profile's "hierarchical" call cost, 0 if not
    # measured: the phases' calls dominate), and in debug mode its fingerprints to all N
    c.software_s += p.call_s.get("hierarchical", 0.0) + debug_ctrl_cost(p, t.ranks)
    c.intra, c.inter = chunk["intra"], chunk["inter"]
    return c


def priced(collective: str = "allreduce") -> dict:
    """``{algorithm: cost function}`` of the algorithms the model prices (:data:`PRICES`:
    hpcdp's own, and each one registered in hpcdp.comm.algorithms with a cost function)."""
    return {name: fn for name, (fn, _) in PRICES[collective].items()}


def candidates(collective: str, t: Topology) -> list[str]:
    """The algorithms ``"auto"`` may pick for ``collective`` on ``t`` (``model_picks``:
    "always", or "multi_node" on 2+ nodes of 2+ ranks), in registration order."""
    multi = t.nodes > 1 and t.per_node > 1
    return [name for name, (_, picks) in PRICES[collective].items()
            if picks == "always" or (picks == "multi_node" and multi)]


def allreduce(p: Profile, nbytes: int, t: Topology, algorithm: str = "ring",
              itemsize: int = 4) -> tuple[str, Cost]:
    """(algorithm used, cost); ``"auto"``: the fastest of the algorithms the model may
    pick (registered with ``model_picks``: ring and recursive doubling; hierarchical on 2+
    nodes of 2+ ranks)."""
    if algorithm == "auto":
        names = candidates("allreduce", t)
        costs = {a: priced()[a](p, nbytes, t, itemsize) for a in names}
        best = min(names, key=lambda a: costs[a].total_s)
        return best, costs[best]
    table = priced()
    if algorithm not in table:
        raise ValueError(f"cost model: allreduce algorithm {algorithm!r}; choose one of "
                         f"{', '.join(table)}, auto")
    return algorithm, table[algorithm](p, nbytes, t, itemsize)


def fastest_allreduce(nbytes: int, profile, nodes: int, per_node: int) -> str:
    """The allreduce ``algorithm="auto"`` uses when a profile is configured: the same
    answer on every rank (it depends only on these arguments). ``profile``: a Profile,
    or its name / path (then answers are cached: this runs on every auto allreduce)."""
    if isinstance(profile, str):
        return _fastest_cached(nbytes, profile, nodes, per_node)
    return allreduce(profile, nbytes, Topology(nodes, per_node), "auto", itemsize=1)[0]


@functools.lru_cache(maxsize=4096)
def _fastest_cached(nbytes: int, name: str, nodes: int, per_node: int) -> str:
    return fastest_allreduce(nbytes, load_profile(name), nodes, per_node)


# -- few-step reduce-scatter / all-gather ------------------------------------------------

def halving_phase_cost(p: Profile, at, G: int, rank: int, collective: str, itemsize: int,
                       kind_of, share: float = 1.0) -> Cost:
    """Recursive halving (reduce-scatter) or doubling (all-gather) over ``G`` ranks on
    chunks at offsets ``at(0..G)`` (hpcdp.comm.schedules.halving), seen from ``rank`` (one that
    runs every step; a fold, when G is not a power of two, is on everyone's critical
    path). ``kind_of(a, b)``: the link kind between ranks a and b of the group."""
    c = Cost()
    if G <= 1 or at(G) == at(0):
        return c
    size = lambda a, b: (at(b) - at(a)) * itemsize  # noqa: E731
    rs = collective == "reduce_scatter"
    per = {"intra": [0, 0], "inter": [0, 0]}

    def hop(kind, out_b, in_b, reduced):
        link, m = getattr(p, kind), max(out_b, in_b)
        c.latency_s += link.alpha_at(m)
        c.bandwidth_s += m * _step_beta(link, m) * (share if kind == "inter" else 1.0)
        c.reduce_s += reduced * p.gamma_s_per_byte
        c.software_s += p.few_msg_s
        per[kind][0] += out_b
        per[kind][1] += in_b
    rem = G - (1 << (G.bit_length() - 1))
    whole = size(0, G)
    if rem:  # fold (whole buffer / one chunk) and unfold (one chunk / all but one)
        k = kind_of(0, 1)
        hop(k, 0, whole if rs else size(0, 1), whole if rs else 0)
        hop(k, size(0, 1) if rs else whole - size(0, 1), 0, 0)
    for peer, _, keep, give in V.halving_steps(G, rank):
        kept, given = size(*keep), size(*give)
        out_b, in_b = (given, kept) if rs else (kept, given)
        hop(kind_of(peer, rank), out_b, in_b, kept if rs else 0)
    c.intra, c.inter = tuple(per["intra"]), tuple(per["inter"])
    return c


def _node_kind(t: Topology):
    L, multi = t.per_node, t.nodes > 1
    return lambda a, b: "inter" if multi and a // L != b // L else "intra"


def _nic_share(p: Profile, t: Topology) -> float:
    """In a step between nodes of a flat few-step algorithm every rank of a node sends
    across at once: its L ranks share the node's NICs (a ring has one such hop per node)."""
    return max(1.0, t.per_node / p.nics_per_node) if t.nodes > 1 else 1.0


def _halving_collective(collective: str, p: Profile, nbytes: int, t: Topology, itemsize: int) -> Cost:
    """log2 N halving (reduce-scatter) or doubling (all-gather) steps, plus the fold of
    a non-power of two, on the ring's chunks; a step between nodes runs at the
    inter-node figures (the first steps, at the largest distance, when ranks are placed
    node by node)."""
    N = t.ranks
    if N <= 1 or nbytes <= 0:
        return Cost()
    c = halving_phase_cost(p, V.offsets_of(nbytes // itemsize, N), N, N - 1, collective,
                           itemsize, _node_kind(t), _nic_share(p, t))
    c.software_s += software_cost(p, N, "recursive")
    return c


def halving_reduce_scatter(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """Recursive halving reduce-scatter (:func:`_halving_collective`)."""
    return _halving_collective("reduce_scatter", p, nbytes, t, itemsize)


def doubling_all_gather(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """Recursive doubling all-gather (:func:`_halving_collective`)."""
    return _halving_collective("all_gather", p, nbytes, t, itemsize)


def bruck_all_gather(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    """ceil(log2 N) steps; on 2+ nodes every step has some hops between nodes (rank r
    sends to r - 2^k), so each runs at the inter-node figures, the node's ranks sharing
    its NICs (an upper bound for the steps of distance < L)."""
    N = t.ranks
    if N <= 1 or nbytes <= 0:
        return Cost()
    n, r = nbytes // itemsize, N - 1
    at = V.offsets_of(n, N)
    kind = _flat_kind(t)
    link = getattr(p, kind)
    c = Cost(software_s=software_cost(p, N, "bruck"))
    d = 1
    while d < N:
        cnt = min(d, N - d)
        first = r % N
        end = first + cnt
        out_b = (at(min(end, N)) - at(first) + (at(end - N) if end > N else 0)) * itemsize
        c.latency_s += link.alpha_at(out_b)
        c.software_s += p.few_msg_s
        c.bandwidth_s += out_b * _step_beta(link, out_b) * _nic_share(p, t)
        d <<= 1
    setattr(c, kind, V.bruck_all_gather_bytes(n, N, r, itemsize))
    return c


def _hier_shard(p: Profile, nbytes: int, t: Topology, itemsize: int, collective: str) -> Cost:
    """Halving (doubling) inside the node on the whole buffer, then across the nodes on
    the node-local slice, 1/L of it (the node's L ranks drive its NICs at once)."""
    L, M = t.per_node, t.nodes
    if t.ranks <= 1 or nbytes <= 0:
        return Cost()
    n = nbytes // itemsize
    slice_at, piece_at = V.hier_shard_layout(n, M, L)
    share = max(1.0, L / p.nics_per_node)
    intra = halving_phase_cost(p, slice_at, L, L - 1, collective, itemsize, lambda a, b: "intra")
    inter = halving_phase_cost(p, piece_at(L - 1), M, M - 1, collective, itemsize,
                               lambda a, b: "inter", share)
    c = intra + inter
    c.software_s += software_cost(p, t.ranks, "hierarchical")
    return c


def hier_reduce_scatter(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    return _hier_shard(p, nbytes, t, itemsize, "reduce_scatter")


def hier_all_gather(p: Profile, nbytes: int, t: Topology, itemsize: int = 4) -> Cost:
    return _hier_shard(p, nbytes, t, itemsize, "all_gather")


# What the model prices, per collective: algorithm -> (cost function, model_picks), in
# the registration order of hpcdp.comm.algorithms (the first of equal costs wins).
# hpcdp's own algorithms are listed here, where their prices are written; the registry
# takes their cost and model_picks from this table, and adds (:func:`price`) or drops
# (:func:`unprice`) the ones registered later. The model imports no registry.
PRICES: dict[str, dict[str, tuple]] = {
    "allreduce": {"ring": (ring_allreduce, "always"), "recursive": (recursive_allreduce, "always"),
                  "hierarchical": (hierarchical_allreduce, "multi_node")},
    "reduce_scatter": {"ring": (reduce_scatter, "always"), "recursive": (halving_reduce_scatter, "always"),
                       "hierarchical": (hier_reduce_scatter, "multi_node")},
    "all_gather": {"ring": (all_gather, "always"), "recursive": (doubling_all_gather, "always"),
                   "bruck": (bruck_all_gather, "always"), "hierarchical": (hier_all_gather, "multi_node")},
}


def price(collective: str, name: str, cost, model_picks: str = "never") -> None:
    """Price ``name`` with ``cost(profile, nbytes, topology, itemsize) -> Cost`` (a
    registered algorithm's; ``cost=None``: not priced)."""
    if cost is None:
        unprice(collective, name)
    else:
        PRICES[collective][name] = (cost, model_picks)


def unprice(collective: str, name: str) -> None:
    PRICES[collective].pop(name, None)


def pick(collective: str, p: Profile, nbytes: int, t: Topology, algorithm: str = "auto",
         itemsize: int = 4) -> tuple[str, Cost]:
    """(algorithm used, cost) of one ``collective``; ``"auto"``: the fastest of the
    registered algorithms the model may pick (``model_picks``; "multi_node" ones only on
    2+ nodes of 2+ ranks)."""
    table = priced(collective)
    if algorithm == "auto":
        names = candidates(collective, t)
        costs = {a: table[a](p, nbytes, t, itemsize) for a in names}
        best = min(names, key=lambda a: costs[a].total_s)
        return best, costs[best]
    if algorithm not in table:
        raise ValueError(f"cost model: {collective} algorithm {algorithm!r}; choose one of "
                         f"{', '.join(table)}, auto")
    return algorithm, table[algorithm](p, nbytes, t, itemsize)


def fastest(collective: str, nbytes: int, profile, nodes: int, per_node: int) -> str:
    """What ``algorithm="auto"`` runs for ``collective`` with a profile configured (the
    same answer on every rank). ``profile``: a Profile, or its name / path (cached)."""
    if collective == "allreduce":
        return fastest_allreduce(nbytes, profile, nodes, per_node)
    if isinstance(profile, str):
        return _fastest_any_cached(collective, nbytes, profile, nodes, per_node)
    return pick(collective, profile, nbytes, Topology(nodes, per_node), "auto", itemsize=1)[0]


@functools.lru_cache(maxsize=4096)
def _fastest_any_cached(collective: str, nbytes: int, name: str, nodes: int, per_node: int) -> str:
    return fastest(collective, nbytes, load_profile(name), nodes, per_node)


def ps_push_pull(p: Profile, nbytes: int, t: Topology, servers: int, itemsize: int = 4) -> Cost:
    """Synchronous push + pull with ``servers`` colocated servers (ranks 0..K-1), seen
    from server 0's link: it receives its shard from every other worker, reduces them,
    and sends the result back. Its peers on the same node use intra-node links and the
    rest its node's NICs, shared by the servers placed on that node; both kinds work at
    once, so a phase lasts as long as the slower."""
    N, K = t.ranks, servers
    if N <= 1 or nbytes <= 0:
        return Cost()
    n, srv = nbytes // itemsize, list(range(K))
    push = V.ps_push_bytes(n, 0, srv, range(N), itemsize)
    pull = V.ps_pull_bytes(n, 0, srv, range(N), itemsize)
    peers = N - 1
    local = t.per_node - 1
    share = max(1.0, min(K, t.per_node) / p.nics_per_node)
    c = Cost(software_s=software_cost(p, N, "ps", calls=2), reduce_s=push[1] * p.gamma_s_per_byte)
    for phase in (push, pull):
        shard = max(phase) / peers  # what the server exchanges with one worker
        slowest = (0.0, 0.0, 0.0)
        for kind, count, sh in (("intra", local, 1.0), ("inter", peers - local, share)):
            if count:
                link = getattr(p, kind)
                lat, soft = count * link.alpha_at(shard), count * p.msg_s
                bw = count * shard * link.beta_at(shard) * sh
                slowest = max(slowest, (lat, bw, soft), key=sum)
        c.latency_s += slowest[0]
        c.bandwidth_s += slowest[1]
        c.software_s += slowest[2]
    for kind, count in (("intra", local), ("inter", peers - local)):
        frac = count / peers
        setattr(c, kind, (round((push[0] + pull[0]) * frac), round((push[1] + pull[1]) * frac)))
    return c


__all__ = ["Profile", "Link", "Topology", "Cost", "load_profile", "profile_from_dict",
           "available_profiles", "allreduce", "ring_allreduce", "recursive_allreduce",
           "hierarchical_allreduce", "reduce_scatter", "all_gather", "ps_push_pull",
           "fastest_allreduce", "priced", "candidates", "PRICES", "price", "unprice", "pick", "fastest", "halving_phase_cost",
           "halving_reduce_scatter", "doubling_all_gather", "bruck_all_gather", "hier_reduce_scatter",
           "hier_all_gather", "software_cost", "debug_ctrl_cost", "ring_phases_cost",
           "SEGMENT_BYTES", "PROFILE_DIR"]
