"""Strategy options as plain typed data: the ``[parallel.<strategy>]`` tables.

Pure data and validation, no strategy code: parsing a config imports this module
and nothing under ``hpcdp.strategies`` (the strategies import their options from
here). Each class is a ``@dataclass(kw_only=True)``; a field's docstring sits under
it; choices are ``Literal`` (the loader checks them and names the dotted key and
the allowed values); ``__post_init__`` checks what a type cannot say.

Adding a strategy's options: write its dataclass here and add it to
:data:`PARALLEL_OPTIONS` (a strategy outside hpcdp may use
:func:`hpcdp.config.register_parallel_config` instead). Options read only in some
settings say when in ``APPLIES`` (and tables of other strategies the strategy also
reads in ``ALSO_READS``): :mod:`hpcdp.config_applies` refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from hpcdp.config_error import ConfigError

MIB = 1 << 20




def _choices(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not allowed; choose one of "
                          + ", ".join(repr(a) for a in allowed))


def literal_values(tp) -> tuple:
    """The allowed values of a ``Literal[...]`` annotation."""
    return tuple(getattr(tp, "__args__", ()))


# -- ddp ---------------------------------------------------------------------------

AllreduceAlgorithm = Literal["ring", "auto", "recursive", "native", "hierarchical"]
"""hpcdp.comm.auto's allreduce names (listed here so parsing does not import comm)."""

CommDtype = Literal["float32", "float16", "bfloat16"]
"""What gradient (and ZeRO-3 parameter) messages carry: hpcdp.comm.engines.wire.WIRE_DTYPES."""
WIRE_ALGORITHMS = ("ring", "auto")
"""Algorithms that carry a 16-bit wire ("auto" then runs the ring): hpcdp.comm.engines.wire."""


def _check_comm_dtype(s: str, comm_dtype, algorithm) -> None:
    _choices(f"{s}.comm_dtype", comm_dtype, literal_values(CommDtype))
    if comm_dtype != "float32" and algorithm not in WIRE_ALGORITHMS:
        raise ConfigError(f"{s}.comm_dtype = {comm_dtype!r} needs {s}.algorithm = \"ring\" or \"auto\" "
                          f"(got {algorithm!r}): only the ring adds 16-bit messages in float32 "
                          f"(MPI's own collectives would sum in 16 bits); set {s}.comm_dtype = "
                          "\"float32\" to keep that algorithm")


@dataclass(kw_only=True)
class DDPConfig:
    """``[parallel.ddp]``: replicas, gradients summed by allreduce (docs/ddp.md)."""

    # when a key is read (hpcdp/config_applies.py): a key not listed always is
    APPLIES: ClassVar[dict] = {"bucket_mb": ("parallel.ddp.bucketing", ("size",))}

    bucket_mb: float = 25.0
    """MiB per gradient bucket (like the common frameworks)."""
    bucketing: Literal["size", "per_param"] = "size"
    """"size": buckets of bucket_mb; "per_param": one allreduce per parameter."""
    overlap: bool = True
    """Start allreduces during backward (false: all after it)."""
    init: Literal["verify", "broadcast"] = "verify"
    """Before step 1: "verify" replicas are identical, or "broadcast" rank 0's
    parameters (then verify)."""
    check_every: int = 0
    """Compare a parameter hash across ranks every K steps (0: off)."""
    algorithm: AllreduceAlgorithm = "ring"
    """Allreduce algorithm of hpcdp.comm."""
    comm_dtype: CommDtype = "float32"
    """What the gradient allreduce's messages carry: "float32" (the gradients' own bytes),
    or "float16" / "bfloat16": half the bytes, sums still accumulated in float32 inside
    the ring (hpcdp.comm.engines.wire says where rounding happens); needs algorithm "ring" or
    "auto" (which then runs the ring) and a float32 run."""

    def __post_init__(self):
        s = "parallel.ddp"
        _choices(f"{s}.algorithm", self.algorithm, literal_values(AllreduceAlgorithm))
        _check_comm_dtype(s, self.comm_dtype, self.algorithm)
        if not self.bucket_mb > 0:
            raise ConfigError(
                f"{s}.bucket_mb: {self.bucket_mb!r} is out of range; a bucket must be > 0 MiB "
                f"(use {s}.bucketing = \"per_param\" for one bucket per parameter)")
        _choices(f"{s}.bucketing", self.bucketing, ("size", "per_param"))
        _choices(f"{s}.init", self.init, ("verify", "broadcast"))
        if self.check_every < 0:
            raise ConfigError(f"{s}.check_every: {self.check_every} is out of range; allowed "
                              "[0, inf) (0 switches the replica check off)")


# -- ps ----------------------------------------------------------------------------

UNBOUNDED_SPELLINGS = ("none", "unbounded", "inf")
STALE_LR_RULES = ("relative", "inverse", "none")


def parse_staleness(value, *, key: str = "parallel.ps.staleness") -> int | None:
    """Validate a staleness bound: an int >= 0, or None / "none" / "unbounded" / "inf"."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in UNBOUNDED_SPELLINGS:
            return None
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{key}: {value!r} is not a staleness bound; use an integer k >= 0 "
                             f"or \"none\" for unbounded") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: {value!r} is not a staleness bound; use an integer k >= 0 "
                         f"or \"none\" for unbounded")
    if value < 0:
        raise ValueError(f"{key}: k = {value} is negative; use k >= 0 (0 = synchronous) "
                         f"or \"none\" for unbounded")
    return value


def check_stale_lr(value, *, key: str = "parallel.ps.stale_lr") -> str:
    """Validate the staleness-aware learning-rate rule (ps/staleness.py: stale_factors)."""
    if value not in STALE_LR_RULES:
        raise ValueError(f"{key}: {value!r} is not allowed; choose one of "
                         + ", ".join(repr(r) for r in STALE_LR_RULES))
    return value


@dataclass(kw_only=True)
class PSConfig:
    """``[parallel.ps]``: parameter server (docs/parameter-server.md)."""

    APPLIES: ClassVar[dict] = {k: ("parallel.ps.mode", ("async",)) for k in ("staleness", "stale_lr")}

    servers: int = 1
    """S: the flat buffer's key space is split over S servers (shard rule)."""
    colocated: bool = True
    """Servers are also workers (true), or the last S ranks only serve."""
    mode: Literal["sync", "async"] = "sync"
    """"sync": a step completes when every worker's gradient is aggregated."""
    staleness: int | str = 0
    """Async bound k: an integer >= 0, or "none" (unbounded)."""
    update: Literal["server", "worker"] = "server"
    """Who applies the optimizer: the servers (state only there) or the workers."""
    aggregate: str = "sum"
    """"sum", "mean" or "module:function"."""
    stale_lr: Literal["relative", "inverse", "none"] = "relative"
    """Async: lr shares 1/max(1, staleness): "relative" | "inverse" | "none"."""

    def __post_init__(self):
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ConfigError(f"parallel.ps.servers: {self.servers!r} is out of range; allowed [1, inf)")
        _choices("parallel.ps.mode", self.mode, ("sync", "async"))
        _choices("parallel.ps.update", self.update, ("server", "worker"))
        try:
            k = parse_staleness(self.staleness)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.staleness = "none" if k is None else k  # one spelling in the resolved config
        if not isinstance(self.aggregate, str) or not self.aggregate:
            raise ConfigError("parallel.ps.aggregate: needs \"sum\", \"mean\" or \"module:function\"")
        try:
            check_stale_lr(self.stale_lr)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def k(self) -> int | None:
        return parse_staleness(self.staleness)


# -- zero --------------------------------------------------------------------------

ZeroAlgorithm = Literal["ring", "auto", "native", "recursive", "hierarchical"]
"""ZeRO's reduce-scatter / all-gather names (each one of hpcdp.comm.algorithms' for both),
for every group (stages 1-2) and unit (stage 3); each leaves a rank's shard at its ring
chunk. "recursive": recursive halving reduce-scatter and recursive doubling all-gather
(log2 N steps); "hierarchical": within the node, then across nodes on 1/L of the data
(hpcdp.comm.hier_shard); "auto": per group/unit by size, rank count and node layout (the
cost model with ``HPCDP_PROFILE``, which may also take Bruck's all-gather; else comm's
measured crossovers). docs/zero.md, "Which collective"."""


@dataclass(kw_only=True)
class ZeroConfig:
    """``[parallel.zero]``: ZeRO stages 1-3, state partitioned across the data-parallel
    ranks (docs/zero.md)."""

    APPLIES: ClassVar[dict] = {"prefetch": ("parallel.zero.stage", (3,)),
                               "bucket_mb": ("parallel.zero.stage", (1, 2))}

    stage: Literal[1, 2, 3] = 1
    """1: optimizer state sharded; 2: also gradients; 3: also parameters."""
    shard: Literal["world", "node"] = "world"
    """The sharding group. "world": the state is sharded over every rank. "node" (hybrid
    sharding): sharded over the ranks of one node (MPI.COMM_TYPE_SHARED, or blocks of
    HPCDP_RANKS_PER_NODE ranks) and replicated across nodes; gradients are reduce-scattered
    in the node and each shard allreduced across nodes, all-gathers stay in the node."""
    bucket_mb: float = 25.0
    """Stages 1 and 2: MiB per reduce-scatter group (whole units, merged up to this
    size; a larger unit is a group of its own). Stage 3 gathers unit by unit."""
    prefetch: int = 1
    """Stage 3: units whose all-gather starts ahead of use (forward and backward);
    0 gathers each unit only when it is needed."""
    overlap: bool = True
    """Start reduce-scatters during backward as groups become ready (false: after)."""
    algorithm: ZeroAlgorithm = "ring"
    """Reduce-scatter / all-gather algorithm of hpcdp.comm. "ring": a rank's shard is its
    ring chunk and the bytes are docs/zero.md's formula exactly; "auto" hands groups
    below comm's crossover to MPI's own collectives (lower latency for small units; the
    ledger then records the bytes handed to MPI)."""
    comm_dtype: CommDtype = "float32"
    """What the gradient reduce-scatters (and stage 3's parameter all-gathers) carry:
    "float32", or "float16" / "bfloat16": half the bytes, sums accumulated in float32
    inside the ring, master weights and optimizer state float32 on their owner
    (docs/zero.md); needs algorithm "ring" or "auto" (then the ring) and a float32 run."""

    def __post_init__(self):
        s = "parallel.zero"
        _choices(f"{s}.algorithm", self.algorithm, literal_values(ZeroAlgorithm))
        _check_comm_dtype(s, self.comm_dtype, self.algorithm)
        _choices(f"{s}.stage", self.stage, (1, 2, 3))
        if not self.bucket_mb > 0:
            raise ConfigError(f"{s}.bucket_mb: {self.bucket_mb!r} is out of range; a group must "
                              "be > 0 MiB (groups never split a unit)")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ConfigError(f"{s}.prefetch: {self.prefetch!r} is out of range; allowed [0, inf) "
                              "(units gathered ahead of use; 0: none)")
        _choices(f"{s}.shard", self.shard, ("world", "node"))


# -- diloco ------------------------------------------------------------------------

OuterDtype = Literal["float32", "bfloat16", "int8"]
"""What the outer gradients carry on the wire between replica groups
(hpcdp.strategies.diloco.wire)."""


@dataclass(kw_only=True)
class DiLoCoConfig:
    """``[parallel.diloco]``: replica groups that take ``sync_every`` local steps with the
    inner optimizer (``[optim]``) and then average their parameter change, applied by an
    outer SGD with Nesterov momentum (docs/diloco.md)."""

    # keys that apply only with some values of another (the config rule of hpcdp.config)
    APPLIES: ClassVar[dict] = {"outer_block": ("parallel.diloco.outer_dtype", ("int8",))}
    # the inner strategy's own table applies inside a group
    ALSO_READS: ClassVar[tuple] = ("ddp", "zero")

    groups: int | str = "node"
    """Replica groups: "node" (one per node, found as hybrid ZeRO finds nodes: the ranks
    that share memory or blocks of HPCDP_RANKS_PER_NODE), or an integer K dividing the
    ranks into K groups of consecutive ranks."""
    inner: Literal["none", "ddp", "zero"] = "ddp"
    """The strategy inside a group: "none" (one rank per group), "ddp" ([parallel.ddp])
    or "zero" ([parallel.zero], stages 1 and 2)."""
    sync_every: int = 100
    """H: inner steps between two synchronisations of a fragment (of the whole model
    with fragments = 1)."""
    outer_lr: float = 0.7
    """The outer SGD's learning rate (OpenDiLoCo's recipe: 0.7)."""
    outer_momentum: float = 0.9
    """The outer SGD's momentum (0: none)."""
    outer_nesterov: bool = True
    """Nesterov momentum for the outer SGD (needs outer_momentum > 0)."""
    outer_dtype: OuterDtype = "float32"
    """The outer gradients on the wire: "float32", "bfloat16" (16-bit messages, float32
    sums) or "int8" (8-bit integers with one float32 scale per block of outer_block
    values, the scale shared by every group so the integers add exactly)."""
    outer_block: int = 256
    """int8: values per scale (a scale costs 4 bytes: 1 + 4/outer_block bytes a value)."""
    fragments: int = 1
    """P: the model's units cut into P contiguous fragments synchronised in turn, each
    every sync_every steps, staggered by sync_every / P steps (Streaming DiLoCo)."""
    overlap: int = 0
    """tau: inner steps a fragment's exchange runs in the background before its result
    is applied (0: the exchange blocks at its step). Needs overlap < sync_every / fragments."""
    mixing: float = 0.0
    """alpha: when an averaged fragment lands, the replica keeps alpha x its own current
    values plus (1 - alpha) x the new outer values (Streaming DiLoCo's merge; 0: take
    the outer values, plain DiLoCo; the paper uses 0.5 with overlap)."""
    check_every: int = 0
    """Compare a hash of the outer parameters across groups every K outer steps (0: off)."""

    def __post_init__(self):
        s = "parallel.diloco"
        g = self.groups
        if isinstance(g, str):
            if g != "node":
                raise ConfigError(f"{s}.groups: {g!r} is not allowed; use \"node\" (one group per node) "
                                  "or an integer K >= 1 (K groups of consecutive ranks)")
        elif isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ConfigError(f"{s}.groups: {g!r} is out of range; use \"node\" or an integer K >= 1")
        _choices(f"{s}.inner", self.inner, ("none", "ddp", "zero"))
        _choices(f"{s}.outer_dtype", self.outer_dtype, literal_values(OuterDtype))
        for key in ("sync_every", "fragments", "outer_block"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{s}.{key}: {v!r} is out of range; allowed [1, inf)")
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, int) or self.overlap < 0:
            raise ConfigError(f"{s}.overlap: {self.overlap!r} is out of range; allowed [0, inf) "
                              "(inner steps an exchange runs in the background)")
        if self.sync_every % self.fragments:
            raise ConfigError(f"{s}.fragments: {self.fragments} does not divide {s}.sync_every = "
                              f"{self.sync_every}; the fragments sync every sync_every steps, staggered "
                              "by sync_every / fragments: choose a divisor")
        stagger = self.sync_every // self.fragments
        if self.overlap >= stagger:
            raise ConfigError(f"{s}.overlap: {self.overlap} inner steps must be < sync_every / fragments "
                              f"= {stagger} (a fragment's exchange lands before the next one starts)")
        if not self.outer_lr > 0:
            raise ConfigError(f"{s}.outer_lr: {self.outer_lr!r} is out of range; allowed (0, inf)")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ConfigError(f"{s}.outer_momentum: {self.outer_momentum!r} is out of range; allowed [0, 1)")
        if self.outer_nesterov and self.outer_momentum == 0.0:
            raise ConfigError(f"{s}.outer_nesterov: Nesterov momentum needs {s}.outer_momentum > 0; "
                              f"set {s}.outer_nesterov = false or an outer_momentum such as 0.9")
        if not 0.0 <= self.mixing < 1.0:
            raise ConfigError(f"{s}.mixing: {self.mixing!r} is out of range; allowed [0, 1) (the share "
                              "of the replica's own values kept when a fragment lands)")
        if isinstance(self.check_every, bool) or not isinstance(self.check_every, int) or self.check_every < 0:
            raise ConfigError(f"{s}.check_every: {self.check_every!r} is out of range; allowed [0, inf)")


# -- registry --------------------------------------------------------------------------

PARALLEL_OPTIONS: dict[str, type] = {"ddp": DDPConfig, "ps": PSConfig, "zero": ZeroConfig,
                                     "diloco": DiLoCoConfig}
"""Strategy name -> its options dataclass (``[parallel.<name>]``)."""


__all__ = ["DDPConfig", "PSConfig", "ZeroConfig", "DiLoCoConfig", "OuterDtype", "PARALLEL_OPTIONS", "MIB", "CommDtype",
           "parse_staleness", "check_stale_lr", "literal_values",
           "UNBOUNDED_SPELLINGS", "STALE_LR_RULES"]
