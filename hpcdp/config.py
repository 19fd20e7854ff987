"""Typed run configuration: dataclasses loaded from TOML, validated with clear errors.

A config has one table per section (``run``, ``model``, ``data``, ``train``,
``optim``, ``parallel``, ``comm``, ``checkpoint``). Every dataclass validates itself in
``__post_init__`` and every error names the dotted key and what is allowed::

    optim.kind: 'adam' is not allowed; choose one of 'sgd', 'adamw'

Loading: ``load_config(path, overrides)`` reads TOML with :mod:`tomllib`, applies
``--set section.key=value`` overrides (the value is parsed as TOML, falling back to a
plain string) and builds :class:`Config`. Unknown keys are errors, and so are keys
the chosen kind does not read (:mod:`hpcdp.config_applies`). ``dump_toml``
writes the resolved config back out (a small writer: no extra dependency).

Strategy options are plain typed data in :mod:`hpcdp.config_parallel` (one
dataclass per strategy, e.g. ``[parallel.ddp]``); parsing a config imports no
strategy code. A strategy from outside hpcdp may add its table with
:func:`register_parallel_config`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


from hpcdp.config_applies import check_keys_apply, unread_options
from hpcdp.config_error import ConfigError
from hpcdp.config_parallel import PARALLEL_OPTIONS, AllreduceAlgorithm, ZeroAlgorithm, literal_values


# ---------------------------------------------------------------------------
# validation helpers (used by every section's __post_init__)

def _choice(section: str, key: str, value, allowed) -> None:
    if value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{section}.{key}: {value!r} is not allowed; choose one of {options}")


def _finite(section: str, key: str, value) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{section}.{key}: {value!r} is out of range; must be a finite number")


def _range(section: str, key: str, value, lo=None, hi=None, lo_open=False, hi_open=False) -> None:
    bad = (
        (isinstance(value, float) and math.isnan(value))
        or (lo is not None and (value <= lo if lo_open else value < lo))
        or (hi is not None and (value >= hi if hi_open else value > hi))
    )
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ConfigError(f"{section}.{key}: {value!r} is out of range; allowed {left}{lo_s}, {hi_s}{right}")


# How long a rank may wait for its peers: below a second a busy machine trips it by
# itself; beyond a week it is no deadline at all (and inf overflows the timers).
WAIT_SECONDS = (1.0, 604800.0)


def _seconds(section: str, key: str, value) -> None:
    lo, hi = WAIT_SECONDS
    if isinstance(value, float) and math.isnan(value) or not lo <= value <= hi:
        raise ConfigError(f"{section}.{key}: {value!r} is out of range; allowed [{lo:g}, {hi:g}] seconds "
                          "(1 s to a week: how long a rank waits for its peers before it names the "
                          "missing ones and stops the job)")


# ---------------------------------------------------------------------------
# sections

@dataclass
class RunConfig:
    SECTION: ClassVar[str] = "run"
    name: str = "digits-mlp"
    out_dir: str = ""  # empty: runs/<name>-<timestamp>
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    log_every: int = 10  # print one log line every this many steps (and the last)
    eval_every: int = 0  # evaluate every this many steps; 0: only after the last step
    metrics_flush_s: float = 5.0  # every rank's figures reach metrics.jsonl at least this often
    tensorboard: bool = False  # also write TensorBoard events to <run dir>/tensorboard (hpcdp[tensorboard])
    # metrics.jsonl at scale: above this many ranks a step's record has the spread of each
    # figure (min/median/max, the slowest rank), and the per-rank lists only every N steps
    rank_lists_up_to: int = 64
    rank_lists_every: int = 100

    def __post_init__(self):
        s = self.SECTION
        _range(s, "metrics_flush_s", self.metrics_flush_s, 0.0, lo_open=True)
        _finite(s, "metrics_flush_s", self.metrics_flush_s)
        _range(s, "rank_lists_up_to", self.rank_lists_up_to, 1)
        _range(s, "rank_lists_every", self.rank_lists_every, 1)
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name):
            raise ConfigError(f"{s}.name: {self.name!r} must be non-empty and use only letters, digits, '.', '_', '-'")
        _range(s, "seed", self.seed, 0, 2**63 - 1)
        _choice(s, "dtype", self.dtype, ("float32", "float64"))
        _choice(s, "device", self.device, ("cpu", "cuda"))
        _range(s, "log_every", self.log_every, 1)
        _range(s, "eval_every", self.eval_every, 0)


@dataclass
class ModelConfig:
    SECTION: ClassVar[str] = "model"
    # when a key is read (hpcdp/config_applies.py): a key not listed always is
    APPLIES: ClassVar[dict] = {
        **{k: ("model.kind", ("mlp",)) for k in ("sizes", "activation")},
        **{k: ("model.kind", ("gpt",)) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd",
                                                 "tied_head", "dropout", "ignore_index")},
        "gelu": [("model.kind", ("gpt",)), ("model.activation", ("gelu",))],
    }
    kind: str = "mlp"
    seed: int = -1  # -1: use run.seed (resolved by Config)
    # mlp
    sizes: list[int] = field(default_factory=lambda: [64, 128, 10])
    activation: str = "relu"
    gelu: str = "tanh"  # GELU form (mlp with activation "gelu", gpt): "tanh" approximation or "exact" (erf)
    # gpt
    vocab_size: int = 16
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    tied_head: bool = True
    dropout: float = 0.0
    # Targets equal to this id are left out of the loss (padding), or "none"; the
    # loss is the mean over the other positions, as PyTorch's ignore_index.
    ignore_index: int | str = "none"
    # Start from these weights instead of the random init (hpcdp/io/interop/init_from.py): a
    # Hugging Face GPT-2 folder or an hpcdp .safetensors file; "" = random init.
    init_from: str = ""

    def __post_init__(self):
        s = self.SECTION
        _choice(s, "kind", self.kind, ("mlp", "gpt"))
        _range(s, "seed", self.seed, -1)
        if len(self.sizes) < 2:
            raise ConfigError(f"{s}.sizes: needs at least 2 entries (input, ..., classes), got {self.sizes!r}")
        for i, n in enumerate(self.sizes):
            _range(s, f"sizes[{i}]", n, 1)
        _choice(s, "activation", self.activation, ("relu", "tanh", "gelu"))
        _range(s, "vocab_size", self.vocab_size, 2)
        _range(s, "block_size", self.block_size, 1)
        _range(s, "n_layer", self.n_layer, 1)
        _range(s, "n_head", self.n_head, 1)
        _range(s, "n_embd", self.n_embd, 1)
        if self.n_embd % self.n_head:
            raise ConfigError(f"{s}.n_embd: {self.n_embd} must be divisible by {s}.n_head = {self.n_head}")
        _range(s, "dropout", self.dropout, 0.0, 1.0, hi_open=True)
        _choice(s, "gelu", self.gelu, ("tanh", "exact"))
        if isinstance(self.ignore_index, str) and self.ignore_index != "none":
            raise ConfigError(f"{s}.ignore_index: {self.ignore_index!r} is not allowed; give an integer "
                              "token id (e.g. -100 or a padding id) or \"none\"")

    @property
    def ignore(self) -> int | None:
        """``ignore_index`` as an int, or None for "none"."""
        return None if isinstance(self.ignore_index, str) else self.ignore_index


DATA_KINDS = ("digits", "synthetic_classification", "synthetic_sequence", "npz", "hdf5", "npy", "tokens")
FILE_KINDS = ("npz", "hdf5", "npy", "tokens")  # data.path names a file (npy: a directory of .npy files)
# [comm] engine: who runs hpcdp's schedules (hpcdp.comm's selectable registered engines; a
# unit test checks that the two agree)
COMM_ENGINES = ("compiled", "python")


@dataclass
class DataConfig:
    SECTION: ClassVar[str] = "data"
    # when a key is read (hpcdp/config_applies.py): a key not listed always is
    APPLIES: ClassVar[dict] = {
        **{k: ("data.kind", FILE_KINDS) for k in ("path", "storage", "prefetch")},
        **{k: ("data.kind", ("npz", "hdf5", "npy")) for k in ("test_path", "x_key", "y_key")},
        "allow_external": ("data.kind", ("hdf5",)),
        "test_fraction": ("data.kind", ("digits", "synthetic_classification", "synthetic_sequence",
                                        "npz", "hdf5", "npy")),
        **{k: ("data.kind", ("tokens",)) for k in ("eval_windows", "tokenizer")},
        "n_samples": ("data.kind", ("synthetic_classification", "synthetic_sequence")),
        **{k: ("data.kind", ("synthetic_classification",)) for k in ("n_features", "n_classes", "n_latent",
                                                                     "noise")},
        **{k: ("data.kind", ("synthetic_sequence",)) for k in ("vocab_size", "seq_len", "markov_order",
                                                               "concentration")},
    }
    kind: str = "digits"
    seed: int = -1  # -1: use run.seed (resolved by Config); decides generation and split
    test_fraction: float = 0.2  # share held out for evaluation (unless test_path is set)
    # npz / hdf5 / npy files, tokens corpora (hpcdp data prepare)
    path: str = ""
    test_path: str = ""  # optional separate test file (same keys)
    x_key: str = "x"
    y_key: str = "y"
    allow_external: bool = False  # hdf5: read datasets whose bytes live in other files (external / virtual)
    storage: str = "auto"  # disk: read each step's samples; memory: read whole; auto: disk unless npz
    prefetch: bool = True  # on-disk data: read the next step's batch while this step computes
    eval_windows: int = 256  # tokens: validation windows per evaluation; 0: every non-overlapping one
    tokenizer: str = ""  # tokens: the tokenizer.json data.path must have been made with ("": any)
    # synthetic datasets
    n_samples: int = 4096
    # synthetic_classification
    n_features: int = 32
    n_classes: int = 8
    n_latent: int = 8  # cluster centres live here before the nonlinear map
    noise: float = 1.5  # latent noise per unit of centre spread (2.0): larger = classes overlap more
    # synthetic_sequence (a fixed random Markov chain; its entropy is the loss floor)
    vocab_size: int = 16
    seq_len: int = 32
    markov_order: int = 2
    concentration: float = 0.2  # Dirichlet parameter of the transition rows: low = predictable

    def __post_init__(self):
        s = self.SECTION
        _choice(s, "kind", self.kind, DATA_KINDS)
        _range(s, "seed", self.seed, -1)
        _range(s, "test_fraction", self.test_fraction, 0.0, 1.0, hi_open=True)
        if self.kind in FILE_KINDS and not self.path:
            what = {"npz": "a .npz file", "hdf5": "an .h5 file", "npy": "a directory of .npy files",
                    "tokens": "a corpus .h5 from hpcdp data prepare"}[self.kind]
            raise ConfigError(f"{s}.path: required for data.kind = {self.kind!r} ({what})")
        _choice(s, "storage", self.storage, ("auto", "disk", "memory"))
        if self.storage == "disk" and self.kind not in ("hdf5", "npy", "tokens"):
            raise ConfigError(f"{s}.storage: 'disk' works for data.kind 'hdf5', 'npy' and 'tokens'; "
                              f"{self.kind!r} is read whole (use 'auto' or 'memory')")
        _range(s, "eval_windows", self.eval_windows, 0)
        if self.tokenizer and self.kind != "tokens":
            raise ConfigError(f"{s}.tokenizer: only a token corpus (data.kind = \"tokens\") has a tokenizer; "
                              f"data.kind is {self.kind!r}: leave data.tokenizer empty")
        for key in ("x_key", "y_key"):
            if not getattr(self, key):
                raise ConfigError(f"{s}.{key}: must be a non-empty dataset name")
        _range(s, "n_samples", self.n_samples, 2)
        _range(s, "n_features", self.n_features, 1)
        _range(s, "n_classes", self.n_classes, 2)
        _range(s, "n_latent", self.n_latent, 1)
        _range(s, "noise", self.noise, 0.0)
        _range(s, "vocab_size", self.vocab_size, 2, 4096)
        _range(s, "seq_len", self.seq_len, 1)
        _choice(s, "markov_order", self.markov_order, (1, 2))
        if self.markov_order == 2 and self.vocab_size > 256:
            raise ConfigError(f"{s}.vocab_size: {self.vocab_size} too large for markov_order = 2; allowed [2, 256]")
        _range(s, "concentration", self.concentration, 0.0, lo_open=True)


@dataclass
class SampleConfig:
    """Text generated at the end of training on a token corpus (data.kind = "tokens")."""
    SECTION: ClassVar[str] = "sample"
    # read by a GPT run's end (token corpora) and by hpcdp sample from its checkpoints
    APPLIES: ClassVar[dict] = {k: ("model.kind", ("gpt",)) for k in ("length", "prompt", "temperature", "top_k")}
    length: int = 200  # tokens to generate; 0: none
    prompt: str = ""  # "" starts from a newline
    temperature: float = 0.8  # 0: greedy (argmax)
    top_k: int = 0  # sample among the k most likely tokens; 0: all
    seed: int = -1  # -1: run.seed

    def __post_init__(self):
        s = self.SECTION
        _range(s, "length", self.length, 0)
        _range(s, "temperature", self.temperature, 0.0)
        _range(s, "top_k", self.top_k, 0)
        _range(s, "seed", self.seed, -1)


@dataclass
class TrainConfig:
    SECTION: ClassVar[str] = "train"
    APPLIES: ClassVar[dict] = {"exact_micro_batch": ("train.reproducible", ("exact",)),
                               "max_consecutive_skips": ("train.on_nonfinite", ("skip",))}
    steps: int = 0  # optimizer steps; exactly one of steps / epochs is > 0
    epochs: int = 20
    global_batch: int = 64  # samples per optimizer step, summed over all ranks
    grad_accum: int = 1  # micro-batches per step on each rank
    last_batch: str = "drop"  # short last batch of an epoch: drop it or keep it
    eval_batch: int = 512  # samples per forward pass during evaluation (per rank)
    on_nonfinite: str = "stop"  # non-finite loss / gradient norm: "stop" the run, or "skip" the update
    # "skip": this many steps in a row whose update was skipped stop the run (it is not training)
    max_consecutive_skips: int = 5
    # "fast": reduce in whatever order is quickest; "exact": weights bit-identical for
    # any rank count and strategy (hpcdp/exact/, docs/reproducibility.md)
    reproducible: str = "fast"
    # exact mode: samples per fixed micro-batch (a divisor of global_batch); 0: chosen
    # from global_batch (hpcdp.data.micro.choose_micro_batch, stated in the log)
    exact_micro_batch: int = 0

    def __post_init__(self):
        s = self.SECTION
        _range(s, "steps", self.steps, 0)
        _range(s, "epochs", self.epochs, 0)
        if (self.steps > 0) == (self.epochs > 0):
            raise ConfigError(
                f"{s}.steps / {s}.epochs: set exactly one of them > 0 (got steps = {self.steps}, "
                f"epochs = {self.epochs}); e.g. --set train.epochs=0 --set train.steps=100")
        _range(s, "global_batch", self.global_batch, 1)
        _range(s, "grad_accum", self.grad_accum, 1)
        if self.grad_accum > self.global_batch:
            raise ConfigError(f"{s}.grad_accum: {self.grad_accum} is larger than {s}.global_batch = {self.global_batch}")
        _choice(s, "last_batch", self.last_batch, ("drop", "keep"))
        _range(s, "eval_batch", self.eval_batch, 1)
        _choice(s, "on_nonfinite", self.on_nonfinite, ("stop", "skip"))
        _range(s, "max_consecutive_skips", self.max_consecutive_skips, 1)
        _choice(s, "reproducible", self.reproducible, ("fast", "exact"))
        _range(s, "exact_micro_batch", self.exact_micro_batch, 0)
        self.exact_micro_chosen = False  # True: exact_micro_batch was 0 and chosen here
        if self.reproducible == "exact":
            _check_exact_train(self)



# -- exact mode's rules (train.reproducible = "exact"): clear errors before training ----

def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_micro_batch(global_batch: int, rank_counts=(1,)) -> int:
    """The exact micro-batch when none is set: a divisor ``m`` of the global batch
    with at least ``max(rank_counts)`` micro-batches (every rank count holds one),
    at most a quarter of the batch (the size a 4-rank run computes per rank), and
    among those preferring a count of micro-batches every rank count divides (even
    load), then the largest. Depends only on its arguments: every job of one check
    (and a restart on another rank count) gets the same value."""
    if global_batch < 1:
        raise ValueError(f"train.global_batch: must be >= 1, got {global_batch}")
    top = max([int(n) for n in rank_counts] or [1])
    cap = max(global_batch // 4, 1)
    cands = [m for m in divisors(global_batch) if m <= cap and global_batch // m >= top] or [1]
    return max(cands, key=lambda m: (all((global_batch // m) % n == 0 for n in rank_counts), m))


def _check_exact_train(train) -> None:
    """``[train]`` on its own: a micro-batch size that divides the global batch (0:
    chosen here from the global batch), and no second way of cutting micro-batches."""
    m, g = train.exact_micro_batch, train.global_batch
    if m == 0:
        train.exact_micro_batch = m = choose_micro_batch(g)
        train.exact_micro_chosen = True
    if g % m:
        raise ConfigError(f"train.exact_micro_batch: {m} does not divide train.global_batch = {g}; exact "
                          f"mode cuts the global batch into equal micro-batches (divisors of {g}: "
                          f"{', '.join(map(str, divisors(g)))})")
    if train.grad_accum != 1:
        raise ConfigError(f"train.grad_accum: exact mode cuts the global batch into micro-batches of "
                          f"train.exact_micro_batch samples itself (a rank runs as many as it holds); "
                          f"leave grad_accum = 1, found {train.grad_accum}")


def _check_exact_config(cfg) -> None:
    """Across sections: strategies that cannot be exact."""
    strategy = cfg.parallel.strategy
    wire = getattr(cfg.parallel.sub(strategy), "comm_dtype", "float32")
    if wire != "float32":
        raise ConfigError(f"parallel.{strategy}.comm_dtype: {wire!r} cannot be exact (exact mode sums "
                          "int64 fixed-point gradients; a 16-bit wire rounds them); use "
                          f"parallel.{strategy}.comm_dtype = \"float32\" or train.reproducible = 'fast'")
    if strategy == "diloco":
        raise ConfigError("train.reproducible = 'exact' with parallel.strategy = 'diloco': DiLoCo's weights "
                          "depend on how many replica groups there are (each group trains alone between "
                          "syncs, on its own part of the batch), so they cannot be the same bits for every "
                          "rank count; use train.reproducible = 'fast' (docs/diloco.md, \"Exact mode\")")
    if strategy == "ps":
        ps = cfg.parallel.sub("ps")
        if ps is not None and getattr(ps, "mode", "sync") == "async":
            raise ConfigError("parallel.ps.mode: 'async' cannot be exact (which updates a gradient meets "
                              "depends on timing); use parallel.ps.mode = 'sync' or "
                              "train.reproducible = 'fast'")
        if ps is not None and getattr(ps, "aggregate", "sum") != "sum":
            raise ConfigError(f"parallel.ps.aggregate: exact mode sums integers on the server; "
                              f"{ps.aggregate!r} is not available in exact mode (use 'sum')")


@dataclass
class OptimConfig:
    SECTION: ClassVar[str] = "optim"
    APPLIES: ClassVar[dict] = {
        **{k: ("optim.kind", ("sgd",)) for k in ("momentum", "nesterov")},
        **{k: ("optim.kind", ("adamw",)) for k in ("betas", "eps")},
        "min_lr": ("optim.schedule", ("cosine",)),
    }
    kind: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9  # sgd
    nesterov: bool = False  # sgd
    weight_decay: float = 0.0  # sgd: L2 added to the gradient; adamw: decoupled
    # Parameters that get no weight decay (hpcdp.optim.decay): a rule without a dot
    # matches a part of the name, one with dots the whole name (fnmatch patterns).
    # Default: biases, LayerNorms and the GPT embeddings; [] decays everything.
    no_decay: list[str] = field(default_factory=lambda: ["bias", "ln_*", "wte", "wpe"])
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adamw
    eps: float = 1e-8  # adamw
    schedule: str = "constant"  # lr after warmup: constant or cosine decay to min_lr
    warmup_steps: int = 0  # linear warmup from lr/warmup_steps to lr
    min_lr: float = 0.0  # cosine's final lr
    clip_grad_norm: float = 0.0  # clip the global L2 norm of the gradient to this (0: off)

    def __post_init__(self):
        s = self.SECTION
        _choice(s, "kind", self.kind, ("sgd", "adamw"))
        _range(s, "lr", self.lr, 0.0, lo_open=True)
        _finite(s, "lr", self.lr)
        _range(s, "momentum", self.momentum, 0.0, 1.0, hi_open=True)
        if self.nesterov and self.momentum == 0.0:
            raise ConfigError(f"{s}.nesterov: needs {s}.momentum > 0")
        _range(s, "weight_decay", self.weight_decay, 0.0)
        _finite(s, "weight_decay", self.weight_decay)
        for i, rule in enumerate(self.no_decay):
            if not rule or rule.strip() != rule:
                raise ConfigError(f"{s}.no_decay[{i}]: {rule!r} must be a non-empty name pattern without spaces")
        if len(self.betas) != 2:
            raise ConfigError(f"{s}.betas: needs exactly 2 numbers [beta1, beta2], got {self.betas!r}")
        for i, b in enumerate(self.betas):
            _range(s, f"betas[{i}]", b, 0.0, 1.0, hi_open=True)
        _range(s, "eps", self.eps, 0.0, lo_open=True)
        _choice(s, "schedule", self.schedule, ("constant", "cosine"))
        _range(s, "warmup_steps", self.warmup_steps, 0)
        _range(s, "min_lr", self.min_lr, 0.0, self.lr)
        _range(s, "clip_grad_norm", self.clip_grad_norm, 0.0)


# Strategy options: name -> dataclass; hpcdp's own in config_parallel, others added
# by register_parallel_config.
_PARALLEL_CONFIGS: dict[str, type] = dict(PARALLEL_OPTIONS)


def register_parallel_config(name: str):
    """Class decorator: make ``[parallel.<name>]`` parse into this dataclass (for a
    strategy outside hpcdp; hpcdp's own options live in :mod:`hpcdp.config_parallel`)::

        @register_parallel_config("mine")
        @dataclass
        class MineConfig:
            width: int = 1
            def __post_init__(self): ...  # raise ConfigError("parallel.mine.width: ...")
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"strategy config name must be a lowercase identifier, got {name!r}")

    def deco(cls):
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"register_parallel_config({name!r}): {cls.__name__} is not a dataclass")
        _PARALLEL_CONFIGS[name] = cls
        return cls
    return deco


def parallel_config_class(name: str) -> type | None:
    """The options dataclass of strategy ``name``, or None (no import of strategy code)."""
    return _PARALLEL_CONFIGS.get(name)


@dataclass
class ParallelConfig:
    SECTION: ClassVar[str] = "parallel"
    strategy: str = "none"
    # Strategy option tables, e.g. {"ddp": DDPConfig(...)}; see register_parallel_config.
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.strategy):
            raise ConfigError(f"parallel.strategy: {self.strategy!r} is not a strategy name")
        # Tables of other strategies (e.g. [parallel.ps] under ZeRO): load_config's
        # rule (hpcdp/config_applies.py) warns about them, or refuses them from --set.
        # The chosen strategy's options appear in the resolved config even if unset.
        if self.strategy not in self.options:
            cls = parallel_config_class(self.strategy)
            if cls is not None:
                self.options[self.strategy] = cls()

    def sub(self, name: str | None = None):
        """Options of strategy ``name`` (default: the chosen one), or None if it has none."""
        return self.options.get(name or self.strategy)


@dataclass
class CommConfig:
    SECTION: ClassVar[str] = "comm"
    # what ``algorithm="auto"`` runs (hpcdp.comm.select): "auto" (the measured size rule, or
    # the cost model with a profile) or an algorithm name; per collective where one is set
    algorithm: str = "auto"
    allreduce: str = ""  # "": ``algorithm``
    reduce_scatter: str = ""
    all_gather: str = ""
    engine: str = "compiled"  # who runs hpcdp's ring: "compiled" (Numba) or "python"
    lean: str = "compiled"  # MPI's own small blocking calls: "compiled" or "mpi4py"
    progress: str = "auto"  # compiled non-blocking collectives: "auto", "thread", "calls"
    profile: str = ""  # a machine profile (name or file): "auto" asks the cost model
    ranks_per_node: int = 0  # nodes are blocks of this many ranks; 0: ranks sharing memory
    allreduce_crossover: int = 0  # bytes from which "auto" runs the ring; 0: the measured table
    reduce_scatter_crossover: int = 0
    all_gather_crossover: int = 0
    cuda_aware: str = "auto"  # device buffers straight to MPI: "auto" (ask MPI), "true", "false"
    debug: bool = False  # check that ranks agree on every collective (costs a message each)
    timeout: float = 300.0  # seconds a rank waits for its peers before raising
    setup_timeout: float = 600.0  # seconds ranks wait for each other before training (loading data)

    def __post_init__(self):
        s = self.SECTION
        every = tuple(a for a in literal_values(AllreduceAlgorithm) if a in literal_values(ZeroAlgorithm))
        allowed = {"algorithm": every, "allreduce": literal_values(AllreduceAlgorithm),
                   "reduce_scatter": literal_values(ZeroAlgorithm),
                   "all_gather": literal_values(ZeroAlgorithm) + ("bruck",)}
        for key, names in allowed.items():  # (hpcdp.comm's registered names: a unit test
            value = getattr(self, key)      # checks that the two agree)
            if key != "algorithm" and value == "":
                continue
            if value not in names:
                raise ConfigError(f"{s}.{key}: {value!r} is not allowed; choose one of "
                                  + ", ".join(repr(a) for a in names))
        _choice(s, "engine", self.engine, COMM_ENGINES)
        _choice(s, "lean", self.lean, ("compiled", "mpi4py"))
        _choice(s, "progress", self.progress, ("auto", "thread", "calls"))
        _choice(s, "cuda_aware", self.cuda_aware, ("auto", "true", "false"))
        _range(s, "ranks_per_node", self.ranks_per_node, 0)
        for c in ("allreduce", "reduce_scatter", "all_gather"):
            _range(s, f"{c}_crossover", getattr(self, f"{c}_crossover"), 0)
        for key in ("timeout", "setup_timeout"):
            _seconds(s, key, getattr(self, key))


@dataclass
class CheckpointConfig:
    """``[checkpoint]``: sharded HDF5 checkpoints (hpcdp/io/, docs/checkpoints.md).
    On when ``every > 0`` or ``dir`` is set."""
    SECTION: ClassVar[str] = "checkpoint"
    APPLIES: ClassVar[dict] = {
        **{k: ("checkpoint.enabled", (True,)) for k in ("keep", "final", "on_signal", "layout", "asynchronous",
                                                        "on_save_error")},
        "writer": ("checkpoint.asynchronous", (True,)),
    }
    dir: str = ""            # folder of step-* checkpoints; "": <run dir>/checkpoints
    every: int = 0           # save every K optimizer steps (0: not periodically)
    keep: int = 0            # keep the L newest complete checkpoints (0: all)
    final: bool = True       # also save after the last step
    on_signal: bool = True   # SIGTERM / SIGUSR1: finish the step, save, exit 0
    layout: str = "split"    # "split": one file per rank; "shared": one file (parallel HDF5)
    asynchronous: bool = False  # copy to host memory, write in the background
    writer: str = "process"  # asynchronous, layout "split": "process" (a helper process writes
    #                          the rank file, off the training GIL) or "thread" (a thread of the rank)
    on_save_error: str = "stop"  # a periodic save fails (disk full, a file-size limit...): "stop" the
    #                              run at once (exit 1), or "continue" training and save at the next due step

    def __post_init__(self):
        s = self.SECTION
        _range(s, "every", self.every, 0)
        _range(s, "keep", self.keep, 0)
        _choice(s, "layout", self.layout, ("split", "shared"))
        _choice(s, "writer", self.writer, ("process", "thread"))
        _choice(s, "on_save_error", self.on_save_error, ("stop", "continue"))

    @property
    def enabled(self) -> bool:
        return self.every > 0 or bool(self.dir)


@dataclass
class FailureConfig:
    """``[failure]``: what a job does when a rank dies (docs/fault-tolerance.md).
    ``on_rank_loss = "stop"`` (default): every rank ends within seconds with one line, the
    job resumes from its last checkpoint. ``"continue"``: the survivors repair the job
    with MPI's fault-tolerance interface (ULFM: Open MPI 5 under ``mpirun --with-ft ulfm``)
    and keep training: DDP (every rank holds the whole state) and hybrid ZeRO
    (``parallel.zero.shard = "node"``: a node that loses a rank leaves as a whole, the other
    nodes hold the same shards). ``batch``: after a repair, ``"keep"`` the global batch
    (each survivor takes more samples) or ``"scale"`` it with the world size (each survivor
    keeps its per-rank batch; the rest of the epoch is re-split at the new global batch:
    hpcdp.data.rescale)."""
    SECTION: ClassVar[str] = "failure"
    APPLIES: ClassVar[dict] = {"min_world": ("failure.on_rank_loss", ("continue",)),
                               "batch": ("failure.on_rank_loss", ("continue",))}
    on_rank_loss: str = "stop"  # "stop" | "continue"
    min_world: int = 1          # continue: fewer ranks left than this ends the job
    batch: str = "keep"         # continue: "keep" the global batch after a repair, or "scale" it

    def __post_init__(self):
        s = self.SECTION
        _choice(s, "on_rank_loss", self.on_rank_loss, ("stop", "continue"))
        _range(s, "min_world", self.min_world, 1)
        _choice(s, "batch", self.batch, ("keep", "scale"))


SECTIONS: dict[str, type] = {
    "run": RunConfig, "model": ModelConfig, "data": DataConfig, "train": TrainConfig,
    "optim": OptimConfig, "parallel": ParallelConfig, "comm": CommConfig, "sample": SampleConfig,
    "checkpoint": CheckpointConfig, "failure": FailureConfig,
}


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)

    def __post_init__(self):
        self.warnings: list[str] = []  # load_config's lines about keys not read (config_applies)
        self.unread_options: list[str] = []  # strategy options given but not read (load_config)
        # Seeds left at -1 follow run.seed, so one number reproduces a run.
        if self.model.seed < 0:
            self.model.seed = self.run.seed
        if self.data.seed < 0:
            self.data.seed = self.run.seed
        if self.sample.seed < 0:
            self.sample.seed = self.run.seed
        if self.model.kind == "gpt" and self.data.kind in ("digits", "synthetic_classification"):
            raise ConfigError(f"data.kind: {self.data.kind!r} is a classification set; model.kind = 'gpt' "
                              "needs 'synthetic_sequence', 'tokens', 'npz', 'hdf5' or 'npy' (token sequences)")
        if self.model.kind == "mlp" and self.data.kind in ("synthetic_sequence", "tokens"):
            raise ConfigError(f"data.kind: {self.data.kind!r} needs model.kind = 'gpt'")
        if self.train.reproducible == "exact":
            _check_exact_config(self)
        if self.failure.on_rank_loss == "continue":
            _check_continue_config(self)
        wire = getattr(self.parallel.sub(), "comm_dtype", "float32")
        if wire != "float32" and self.run.dtype != "float32":
            raise ConfigError(f"parallel.{self.parallel.strategy}.comm_dtype: {wire!r} carries float32 "
                              f"gradients; run.dtype is {self.run.dtype!r}: set run.dtype = \"float32\" "
                              f"or parallel.{self.parallel.strategy}.comm_dtype = \"float32\"")

    def to_dict(self) -> dict:
        return {name: _section_to_dict(getattr(self, name)) for name in SECTIONS}


def _check_continue_config(cfg) -> None:
    """``failure.on_rank_loss = "continue"``: what the repair supports today, else one line."""
    why = "failure.on_rank_loss: 'continue'"
    strategy = cfg.parallel.strategy
    hybrid = strategy == "zero" and getattr(cfg.parallel.sub(), "shard", "world") == "node"
    if strategy != "ddp" and not hybrid:
        held = ("shards the state once over all ranks" if strategy == "zero"
                else "holds parts of the state once")
        raise ConfigError(f"{why} keeps training only with parallel.strategy = 'ddp' (every rank holds "
                          "the whole state, so any rank can be lost) or 'zero' with parallel.zero.shard = "
                          "'node' (each node holds the whole sharded state, so a node can be lost); "
                          f"{strategy!r}{' with shard = ' + repr(cfg.parallel.sub().shard) if strategy == 'zero' else ''} "
                          f"{held}: set failure.on_rank_loss = 'stop' (a lost rank ends the job; resume it "
                          "from its checkpoint with --resume latest)"
                          + (" or parallel.zero.shard = 'node'" if strategy == "zero" else ""))
    others = [(cfg.run.device != "cpu", f"run.device = {cfg.run.device!r}"),
              (getattr(cfg.parallel.sub(), "comm_dtype", "float32") != "float32",
               f"parallel.{strategy}.comm_dtype other than 'float32'")]
    for on, what in others:
        if on:
            raise ConfigError(f"{why} does not yet combine with {what}: remove it, or set "
                              "failure.on_rank_loss = 'stop'")


def _section_to_dict(obj) -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name == "options" and isinstance(obj, ParallelConfig):
            for name, sub in sorted(v.items()):
                out[name] = _section_to_dict(sub)
        elif dataclasses.is_dataclass(v):
            out[f.name] = _section_to_dict(v)
        else:
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


# ---------------------------------------------------------------------------
# dict -> dataclasses, with type checks that name the key

def _check_type(path: str, value, tp):
    """Return ``value`` converted to annotation ``tp`` or raise ConfigError naming ``path``."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = literal_values(tp)
        if isinstance(value, bool) or value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not allowed; choose one of "
                              + ", ".join(repr(a) for a in allowed))
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, found {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, found {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, found {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, found {value!r}")
        return value
    if origin is typing.Union or isinstance(tp, types.UnionType):
        # e.g. ``int | str`` (a number or a keyword such as "none"): the first that fits
        for member in typing.get_args(tp):
            try:
                return _check_type(path, value, member)
            except ConfigError:
                continue
        names = " or ".join(getattr(m, "__name__", str(m)) for m in typing.get_args(tp))
        raise ConfigError(f"{path}: expected {names}, found {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, found {value!r}")
        return [_check_type(f"{path}[{i}]", v, item_tp) for i, v in enumerate(value)]
    raise TypeError(f"{path}: unsupported config annotation {tp!r}")  # a bug in hpcdp, not user input


def _build(cls, table, path: str):
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: expected a table ([{path}]), found {table!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown key; {path} accepts {', '.join(names)}")
    kwargs = {k: _check_type(f"{path}.{k}", v, hints[k]) for k, v in table.items()}
    return cls(**kwargs)


def section_from_dict(cls, table, path: str | None = None):
    """One section (``cls``, e.g. :class:`ModelConfig`) from a table, checked as a
    config file's section is (types, ranges); errors name ``path.key``."""
    return _build(cls, table, path or cls.SECTION)


def _build_parallel(table) -> ParallelConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"parallel: expected a table, found {table!r}")
    strategy = table.get("strategy", "none")
    strategy = _check_type("parallel.strategy", strategy, str)
    options = {}
    for key, value in table.items():
        if key == "strategy":
            continue
        cls = parallel_config_class(key) if isinstance(value, dict) else None
        if cls is None:
            known = ", ".join(["strategy"] + [f"[parallel.{n}]" for n in sorted(_PARALLEL_CONFIGS)])
            raise ConfigError(f"parallel.{key}: unknown key; parallel accepts {known}")
        options[key] = _build(cls, value, f"parallel.{key}")
    return ParallelConfig(strategy=strategy, options=options)


def config_from_dict(raw: dict) -> Config:
    """Build a validated :class:`Config` from a nested dict (as TOML gives it)."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; sections are {', '.join(SECTIONS)}")
    train = raw.get("train")
    if isinstance(train, dict):
        # Setting one of steps / epochs switches the other off, so
        # `--set train.steps=100` works on a config that counts epochs.
        if "steps" in train and "epochs" not in train:
            train = {**train, "epochs": 0}
        elif "epochs" in train and "steps" not in train:
            train = {**train, "steps": 0}
        raw = {**raw, "train": train}
    kwargs = {}
    for name, cls in SECTIONS.items():
        table = raw.get(name, {})
        kwargs[name] = _build_parallel(table) if cls is ParallelConfig else _build(cls, table, name)
    return Config(**kwargs)


# ---------------------------------------------------------------------------
# overrides and files

def parse_override(text: str) -> tuple[list[str], Any]:
    """``"optim.lr=0.05"`` -> (["optim", "lr"], 0.05). The value is TOML, else a string."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", key):
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. --set optim.lr=0.05")
    value = value.strip()
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.split("."), parsed


def apply_overrides(raw: dict, overrides) -> dict:
    parsed = [(text, *parse_override(text)) for text in overrides or ()]
    touched = {".".join(keys) for _, keys, _ in parsed}
    # Overriding one of train.steps / train.epochs switches the file's other one off.
    for key, other in (("train.steps", "train.epochs"), ("train.epochs", "train.steps")):
        if key in touched and other not in touched and isinstance(raw.get("train"), dict):
            raw["train"].pop(other.split(".")[1], None)
    for text, keys, value in parsed:
        node = raw
        for i, k in enumerate(keys[:-1]):
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {'.'.join(keys[:i + 1])} is a value, not a table")
        node[keys[-1]] = value
    return raw


def load_config(path: str | Path | None = None, overrides=(), *, shared_options: bool = False) -> Config:
    """Read ``path`` (TOML; None: the built-in default job), apply overrides.

    Keys the run does not read are refused (:mod:`hpcdp.config_applies`); strategy
    options of the file it does not read are named in ``cfg.warnings``.
    ``shared_options``: the overrides may carry options of several strategies (a
    study's or a check's common ``--set``, for whichever strategy each job runs): the
    strategy options among them that this run does not read are treated as the file's,
    and ``cfg.unread_options`` lists them (hpcdp.launch.sets_for_job drops them).

    The built-in default job is the digits MLP under DDP: on one rank DDP moves no
    bytes, so ``hpcdp train`` and ``mpiexec -n 4 hpcdp train`` train the same model
    on the same global batches. A file that names no strategy gets "none", which
    refuses to run on several ranks rather than train independent copies.
    """
    raw: dict = {}
    if path is None:
        raw = {"parallel": {"strategy": "ddp"}}
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config {str(p)!r}: no such file")
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
    raw = apply_overrides(raw, overrides)
    cfg = config_from_dict(raw)
    # keys the run does not read: an error, or one warning line for strategy options of the file
    set_keys = [".".join(parse_override(t)[0]) for t in overrides or ()]
    cfg.warnings = check_keys_apply(cfg, raw, set_keys, set_keys if shared_options else ())
    cfg.unread_options = [path for path, _ in unread_options(cfg, raw, set_keys)]
    return cfg


# ---------------------------------------------------------------------------
# a small TOML writer for the resolved config (tables of scalars and lists)

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # shortest repr that reads back to the same float
    if isinstance(v, str):
        out = ['"']
        for ch in v:
            if ch == '"':
                out.append('\\"')
            elif ch == "\\":
                out.append("\\\\")
            elif ch in "\b\t\n\f\r":
                out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def dump_toml(data: dict) -> str:
    """Nested dict of scalars / lists -> TOML text (tables after the plain keys)."""
    lines: list[str] = []

    def table(d: dict, prefix: list[str]):
        plain = [(k, v) for k, v in d.items() if not isinstance(v, dict)]
        subs = [(k, v) for k, v in d.items() if isinstance(v, dict)]
        if prefix and (plain or not subs):
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_toml_key(p) for p in prefix) + "]")
        for k, v in plain:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in subs:
            table(v, prefix + [k])

    table(data, [])
    return "\n".join(lines) + "\n"
