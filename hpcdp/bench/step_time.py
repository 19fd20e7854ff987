"""``hpcdp bench step``: time one training step (forward + backward + optimizer).

Contenders, measured IN THE SAME PROCESS, interleaved round by round (so load
drift on a shared machine hits all of them alike), all in float32 from the same
initial weights and the same batch:

- MLP 784-1024-1024-10, batch 256, SGD with momentum:
  ``hpcdp`` (autograd + cpu backend), ``numpy`` (a hand-written NumPy
  forward/backward/update of the same network: the floor hpcdp aims at, ratio
  target <= 1.2) and ``torch`` (PyTorch's CPU build, when importable).
- small GPT (vocab 64, block 64, 2 layers, 4 heads, 128 wide, batch 16, AdamW):
  ``hpcdp`` and ``torch``.

Each thread count runs in a child process whose environment sets
``OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = NUMBA_NUM_THREADS``
(and ``torch.set_num_threads``) and UNSETS ``OPENBLAS_CORETYPE`` and
``OPENBLAS_L2_SIZE``: when set (some images set them), they make OpenBLAS pick a
generic kernel and halve GEMM speed. Every contender runs under that same setting.
Reported: median step time over the repeats (after warmup) and the interquartile
range. hpcdp imports torch only here, for comparison.

``--profile`` adds, for the GPT, a per-op profile of ``--repeats`` more steps of each
contender, grouped by what the op does (matmul, layer norm, attention, GELU, residual
add, embedding, loss, optimizer, shapes, other), forward and backward apart, with
Python overhead = step time - the sum of the ops: hpcdp's from its autograd's op
profiler (:mod:`hpcdp.autograd.profile`), PyTorch's from ``torch.profiler`` (self
CPU time of each ATen op; the profilers' own cost lands in each one's overhead).
``--gpt-config FILE`` takes the GPT (``[model]``) and its batch (``[train]
global_batch``) from a job file; ``--torch-python PY`` runs the PyTorch contender in
that interpreter (a venv with torch) when this one has none.

``--ranks N`` (N >= 2) times the GPT step on N ranks instead: hpcdp's DDP and ZeRO-3
under mpiexec beside PyTorch DDP and FSDP2 on gloo (``--strategies``, ``--rounds``;
:mod:`hpcdp.bench.step_ranks`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime

import numpy as np

from hpcdp.launch import CLEARED_ENV, THREAD_VARS

MLP_SIZES = [784, 1024, 1024, 10]
MLP_BATCH = 256
GPT = dict(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=128)
GPT_BATCH = 16
LR = 0.01


# -- contenders ------------------------------------------------------------------------

def _mlp_batch(rng):
    x = rng.normal(size=(MLP_BATCH, MLP_SIZES[0])).astype(np.float32)
    y = rng.integers(0, MLP_SIZES[-1], size=MLP_BATCH).astype(np.int64)
    return x, y


def _train_step(model, opt, x, y):
    """One hpcdp training step on a fixed batch: hpcdp.step.train_step on one rank
    (strategy "none": zero grads, loss, backward, update)."""
    from hpcdp.autograd import Tensor
    from hpcdp.step import LocalBatch, micro_pass, train_step
    from hpcdp.strategies.base import SingleRank
    from hpcdp.world import World

    xt, yt = Tensor(x), Tensor(y)
    single = SingleRank()
    single.setup(model.flat, opt, World(comm=None, rank=0, size=1))
    batch = LocalBatch([np.arange(len(x))], len(x), filler=np.arange(1))

    def step():
        return train_step(model, single, batch, lambda _idx: (xt, yt)).loss

    def profiled(prof):
        """The same step (train_step's calls for one micro-batch), ``prof`` recording."""
        with prof:
            prof.time_region("zero_grad", single.zero_grad)
            single.begin_backward(last_micro=True)
            loss = micro_pass(model, batch, 0, lambda _idx: (xt, yt))
            single.finish_gradients()
            prof.time_region("optimizer", single.step)
        return loss

    step.profiled = profiled
    return step


def hpcdp_mlp(x, y):
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD

    model = build_model({"kind": "mlp", "sizes": MLP_SIZES, "seed": 0}, dtype="float32", device="cpu")
    flat = model.flat
    opt = SGD(flat.numel, lr=LR, momentum=0.9, dtype="float32")
    step = _train_step(model, opt, x, y)
    weights = [flat.params[f"fc{i}.{k}"].numpy().copy() for i in range(len(MLP_SIZES) - 1)
               for k in ("weight", "bias")]
    return step, weights


def numpy_mlp(x, y, weights):
    """The same MLP by hand: ReLU hidden layers, softmax cross-entropy, SGD momentum.

    Written the way one would for speed: GEMMs through BLAS, in-place bias/ReLU and
    updates, no gradient for the input.
    """
    params = [w.copy() for w in weights]
    bufs = [np.zeros_like(p) for p in params]
    n_layers = len(params) // 2
    rows = np.arange(len(y))

    def step():
        acts = [x]
        h = x
        for i in range(n_layers):
            z = h @ params[2 * i]
            z += params[2 * i + 1]
            if i < n_layers - 1:
                np.maximum(z, 0.0, out=z)
            acts.append(z)
            h = z
        logits = acts[-1]
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) - logits[rows, y]))
        g = e
        g /= s
        g[rows, y] -= 1.0
        g *= 1.0 / len(y)
        grads = [None] * len(params)
        for i in reversed(range(n_layers)):
            grads[2 * i] = acts[i].T @ g
            grads[2 * i + 1] = g.sum(axis=0)
            if i > 0:
                g = g @ params[2 * i].T
                g *= acts[i] > 0
        for p, gr, b in zip(params, grads, bufs):
            b *= 0.9
            b += gr
            p -= LR * b
        return loss

    return step


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_mlp(x, y, weights, threads):
    torch = _torch()
    torch.set_num_threads(threads)
    layers = []
    for i in range(len(MLP_SIZES) - 1):
        lin = torch.nn.Linear(MLP_SIZES[i], MLP_SIZES[i + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(weights[2 * i].T.copy()))
            lin.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
        layers.append(lin)
        if i < len(MLP_SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def set_gpt(config: str) -> None:
    """Take the GPT and its batch from a job file's [model] and [train] global_batch."""
    import tomllib

    try:
        with open(config, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"--gpt-config {config}: cannot read it ({e.strerror}); pass a job file "
                         f"such as jobs/gpt_ddp.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--gpt-config {config}: not valid TOML ({e})") from None
    model = raw.get("model", {})
    if model.get("kind") != "gpt":
        raise ValueError(f"--gpt-config {config}: [model] kind must be \"gpt\", got {model.get('kind')!r}")
    if not model.get("tied_head", True) or model.get("dropout", 0.0):
        raise ValueError(f"--gpt-config {config}: the compared GPT has a tied head and no dropout; "
                         f"set [model] tied_head = true and dropout = 0.0")
    for k in GPT:
        if k in model:
            GPT[k] = int(model[k])
    global GPT_BATCH
    GPT_BATCH = int(raw.get("train", {}).get("global_batch", GPT_BATCH))


def _gpt_batch(rng):
    ids = rng.integers(0, GPT["vocab_size"], size=(GPT_BATCH, GPT["block_size"] + 1)).astype(np.int64)
    return ids[:, :-1].copy(), ids[:, 1:].copy()


def hpcdp_gpt(x, y):
    from hpcdp.nn import build_model
    from hpcdp.optim import AdamW

    model = build_model({"kind": "gpt", **GPT, "seed": 0}, dtype="float32", device="cpu")
    flat = model.flat
    opt = AdamW(flat.numel, lr=1e-3, weight_decay=0.01, dtype="float32")
    step = _train_step(model, opt, x, y)
    return step, flat.numel


def torch_gpt_model(threads: int):
    """nanoGPT-style model of GPT's shape (pre-LN, tanh GELU, tied head, SDPA attention),
    seed 0; its blocks are ``model.h`` (what FSDP2 shards one by one)."""
    torch = _torch()
    torch.set_num_threads(threads)
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    c, h, v, t = GPT["n_embd"], GPT["n_head"], GPT["vocab_size"], GPT["block_size"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.fc, self.proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            b, tt, _ = x.shape
            q, k, vv = self.c_attn(self.ln_1(x)).split(c, dim=2)
            q, k, vv = (a.view(b, tt, h, c // h).transpose(1, 2) for a in (q, k, vv))
            a = F.scaled_dot_product_attention(q, k, vv, is_causal=True)
            x = x + self.c_proj(a.transpose(1, 2).contiguous().view(b, tt, c))
            return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(v, c), nn.Embedding(t, c)
            self.h = nn.ModuleList(Block() for _ in range(GPT["n_layer"]))
            self.ln_f = nn.LayerNorm(c)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for blk in self.h:
                x = blk(x)
            return self.ln_f(x) @ self.wte.weight.T

    return Net()


def torch_step(model, x, y):
    """One PyTorch training step of ``model`` (maybe DDP- or FSDP2-wrapped) on a fixed
    batch (AdamW as hpcdp's contender)."""
    torch = _torch()
    F = torch.nn.functional
    v = GPT["vocab_size"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(xt)
        loss = F.cross_entropy(logits.view(-1, v), yt.view(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return step


def torch_gpt(x, y, threads):
    """The one-rank PyTorch contender: (step, parameter count)."""
    model = torch_gpt_model(threads)
    return torch_step(model, x, y), sum(p.numel() for p in model.parameters())


# -- per-op profiles ----------------------------------------------------------------------

GROUPS = ("matmul", "layer norm", "attention", "GELU", "residual add", "embedding", "loss",
          "optimizer", "shapes", "other")
_HPCDP_GROUP = {"matmul": "matmul", "linear": "matmul", "layer_norm": "layer norm", "gelu": "GELU",
                "add": "residual add", "embedding": "embedding", "cross_entropy": "loss",
                "log_softmax": "loss", "reshape": "shapes", "transpose": "shapes", "getitem": "shapes",
                "concatenate": "shapes", "optimizer": "optimizer", "zero_grad": "optimizer"}


def hpcdp_group(op: str, within: str) -> str:
    """The group of an hpcdp op (``within``: the op it ran inside, e.g. attention's matmuls)."""
    if within.startswith("causal_self_attention") or op.startswith("causal_self_attention") or op in (
            "softmax", "causal_mask_fill"):
        return "attention"
    return _HPCDP_GROUP.get(op, "other")


def torch_group(name: str) -> str:
    n = name.removeprefix("aten::").lower()
    if "scaled_dot_product" in n or "softmax" in n and "log_softmax" not in n or "flash_attention" in n:
        return "attention"
    if "layer_norm" in n:
        return "layer norm"
    if "gelu" in n:
        return "GELU"
    if "embedding" in n:
        return "embedding"
    if "nll_loss" in n or "log_softmax" in n or "cross_entropy" in n:
        return "loss"
    if n in ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm"):
        return "matmul"
    if n in ("add", "add_"):
        return "residual add"
    if n in ("view", "reshape", "transpose", "t", "permute", "split", "contiguous", "clone", "copy_",
             "as_strided", "unsafe_view", "_unsafe_view", "expand", "narrow", "slice", "select",
             "_reshape_alias", "unsqueeze", "squeeze", "detach", "empty_like", "empty"):
        return "shapes"
    return "other"


def _grouped(rows, group_of) -> dict:
    """rows: (phase, group-able op, within, seconds, bytes) -> {group: {phase: [s, bytes]}}."""
    out = {}
    for phase, op, within, seconds, nbytes in rows:
        g = group_of(op, within)
        if g == "optimizer":
            phase = "optimizer"
        cell = out.setdefault(g, {}).setdefault(phase, [0.0, 0])
        cell[0] += seconds
        cell[1] += nbytes
    return out


def profile_hpcdp(step, steps: int) -> dict:
    """Per-op profile of ``steps`` calls of the profiled hpcdp step: per-step means."""
    from hpcdp.autograd.profile import OpProfile

    prof = OpProfile()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(prof)
    wall = time.perf_counter() - t0
    rows = [(r["phase"], r["op"], r["within"], r["seconds"] / steps, r["bytes"] // steps) for r in prof.rows()]
    return {"step_s": wall / steps, "groups": _grouped(rows, hpcdp_group),
            "ops": [{**r, "seconds": r["seconds"] / steps, "calls": r["calls"] / steps} for r in prof.rows()]}


def profile_torch(step, steps: int) -> dict:
    """Per-op profile of ``steps`` PyTorch steps (torch.profiler, self CPU time per ATen op;
    an op below ``Optimizer.*`` counts as optimizer, below the autograd engine as backward)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
    rows = []
    for ev in prof.events():
        phase, top, opt = "forward", ev, False
        p = ev
        while p is not None:
            if p.name.startswith("Optimizer."):
                opt = True
            if p.name.startswith("autograd::engine") or "Backward" in p.name:
                phase = "backward"
            top, p = p, p.cpu_parent
        if ev.name.startswith(("Optimizer.", "autograd::engine")) or "Backward" in ev.name:
            continue  # wrappers: their children carry the time (their own self time is small)
        name = "optimizer" if opt else ev.name
        rows.append((phase, name, "", ev.self_cpu_time_total * 1e-6 / steps, 0))
    ops = {}
    for phase, name, _w, seconds, _b in rows:
        ops[(phase, name)] = ops.get((phase, name), 0.0) + seconds
    return {"step_s": wall / steps,
            "groups": _grouped(rows, lambda op, _w: "optimizer" if op == "optimizer" else torch_group(op)),
            "ops": [{"phase": k[0], "op": k[1], "seconds": v}
                    for k, v in sorted(ops.items(), key=lambda kv: -kv[1])]}


def top_ops(hp: dict, th: dict | None, n: int = 10) -> str:
    """The ``n`` costliest ops of each contender, side by side (ms per step)."""
    def names(prof, within):
        return [((f"{r['phase'][:3]} {r['op']}" + (f" in {r['within']}" if within and r.get("within") else ""))[:44],
                 r["seconds"]) for r in prof["ops"][:n]]
    left = names(hp, True)
    right = names(th, False) if th else []
    lines = [f"{'hpcdp op':<44} {'ms':>6}" + (f" | {'PyTorch op':<44} {'ms':>6}" if th else "")]
    for i in range(max(len(left), len(right))):
        a = f"{left[i][0]:<44} {1e3 * left[i][1]:>6.2f}" if i < len(left) else " " * 51
        b = f" | {right[i][0]:<44} {1e3 * right[i][1]:>6.2f}" if i < len(right) else ""
        lines.append(a + b)
    return "\n".join(lines)


def profile_table(hp: dict, th: dict | None) -> str:
    """Group by group: forward / backward / total ms of hpcdp and PyTorch, and MB touched."""
    cols = ("forward", "backward", "optimizer")
    lines = [f"{'group':<13} {'hpcdp fwd':>9} {'bwd':>7} {'total':>7} {'MB':>7}"
             + (f" | {'torch fwd':>9} {'bwd':>7} {'total':>7} {'ratio':>6}" if th else "")]

    def cell(prof, g, phase):
        return prof["groups"].get(g, {}).get(phase, [0.0, 0])

    sums = {"hp": 0.0, "th": 0.0}
    for g in GROUPS:
        hf, hb = (cell(hp, g, "forward")[0] + cell(hp, g, "optimizer")[0], cell(hp, g, "backward")[0])
        ht = hf + hb
        mb = sum(cell(hp, g, ph)[1] for ph in cols) / 1e6
        sums["hp"] += ht
        line = f"{g:<13} {1e3 * hf:>9.2f} {1e3 * hb:>7.2f} {1e3 * ht:>7.2f} {mb:>7.1f}"
        if th:
            tf, tb = (cell(th, g, "forward")[0] + cell(th, g, "optimizer")[0], cell(th, g, "backward")[0])
            sums["th"] += tf + tb
            ratio = f"{ht / (tf + tb):.2f}x" if tf + tb > 0 else "-"
            line += f" | {1e3 * tf:>9.2f} {1e3 * tb:>7.2f} {1e3 * (tf + tb):>7.2f} {ratio:>6}"
        lines.append(line)
    over_h = hp["step_s"] - sums["hp"]
    line = f"{'Python/other':<13} {'':>9} {'':>7} {1e3 * over_h:>7.2f} {'':>7}"
    if th:
        over_t = th["step_s"] - sums["th"]
        line += f" | {'':>9} {'':>7} {1e3 * over_t:>7.2f} {(over_h / over_t if over_t > 0 else 0):>5.2f}x"
    lines.append(line)
    line = f"{'step':<13} {'':>9} {'':>7} {1e3 * hp['step_s']:>7.2f} {'':>7}"
    if th:
        line += f" | {'':>9} {'':>7} {1e3 * th['step_s']:>7.2f} {hp['step_s'] / th['step_s']:>5.2f}x"
    lines.append(line)
    return "\n".join(lines)


# -- measurement ------------------------------------------------------------------------

def _interleaved(contenders: dict, warmup: int, repeats: int) -> dict:
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        out[name] = {"median_s": statistics.median(ts), "q1_s": q[0], "q3_s": q[2], "min_s": min(ts),
                     "repeats": len(ts)}
    return out


def measure_torch_profile(threads: int, warmup: int, repeats: int) -> dict:
    """The PyTorch GPT's profile alone (run in an interpreter that has torch)."""
    torch = _torch()
    if torch is None:
        raise RuntimeError(f"bench step: --torch-python {sys.executable} cannot import torch")
    x, y = _gpt_batch(np.random.default_rng(0))
    step, _n = torch_gpt(x, y, threads)
    plain = _interleaved({"torch": step}, warmup, repeats)["torch"]  # without the profiler
    return {"torch": torch.__version__, "times": plain, "profile": profile_torch(step, repeats)}


def measure(threads: int, models, warmup: int, repeats: int, profile: bool = False) -> dict:
    """Run in the child process (thread env already set)."""
    rng = np.random.default_rng(0)
    torch = _torch()
    result = {"threads": threads, "torch": torch.__version__ if torch else None, "models": {}}
    if "mlp" in models:
        x, y = _mlp_batch(rng)
        h_step, weights = hpcdp_mlp(x, y)
        contenders = {"hpcdp": h_step, "numpy": numpy_mlp(x, y, weights)}
        if torch:
            contenders["torch"] = torch_mlp(x, y, weights, threads)
        # Same weights, same batch: the first losses must agree (they do the same work).
        first = {name: fn() for name, fn in contenders.items()}
        spread = max(first.values()) - min(first.values())
        if spread > 1e-4:
            raise RuntimeError(f"bench step: MLP contenders disagree on the first loss: {first}")
        result["models"]["mlp"] = {"desc": f"MLP {'-'.join(map(str, MLP_SIZES))}, batch {MLP_BATCH}, SGD momentum",
                                   "first_loss": first, "times": _interleaved(contenders, warmup, repeats)}
    if "gpt" in models:
        x, y = _gpt_batch(rng)
        h_step, n_h = hpcdp_gpt(x, y)
        contenders = {"hpcdp": h_step}
        n_params = {"hpcdp": n_h}
        if torch:
            contenders["torch"], n_params["torch"] = torch_gpt(x, y, threads)
        g = GPT
        result["models"]["gpt"] = {
            "desc": (f"GPT vocab {g['vocab_size']}, block {g['block_size']}, {g['n_layer']} layers, "
                     f"{g['n_head']} heads, {g['n_embd']} wide, batch {GPT_BATCH}, AdamW"),
            "params": n_params, "times": _interleaved(contenders, warmup, repeats)}
        if profile:
            result["models"]["gpt"]["profile"] = {"hpcdp": profile_hpcdp(h_step.profiled, repeats)}
            if torch:
                result["models"]["gpt"]["profile"]["torch"] = profile_torch(contenders["torch"], repeats)
    return result


def _child_env(threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update({v: str(threads) for v in THREAD_VARS})
    return env


def _table(results: list[dict]) -> str:
    lines = [f"{'model':<10} {'threads':>7} {'contender':<19} {'median ms':>10} {'IQR ms':>14} "
             f"{'/ numpy':>8} {'/ torch':>8}"]
    for res in results:
        for key, m in res["models"].items():
            times = m["times"]
            for name, t in times.items():
                ratio = lambda ref: (f"{t['median_s'] / times[ref]['median_s']:.2f}x" if ref in times else "-")
                if "torch" not in times and "torch (own process)" in times:
                    ratio = (lambda ref, r=ratio: r("torch (own process)" if ref == "torch" else ref))
                lines.append(f"{key:<10} {res['threads']:>7} {name:<19} {1e3 * t['median_s']:>10.2f} "
                             f"{1e3 * t['q1_s']:>6.2f}-{1e3 * t['q3_s']:<7.2f} {ratio('numpy'):>8} {ratio('torch'):>8}")
    return "\n".join(lines)


def torch_note(results: list[dict]) -> str:
    """Why the torch column shows "-": PyTorch was not importable here."""
    if all(r.get("torch") or r.get("torch_profile_version") for r in results):
        return ""
    return ("\n/ torch \"-\": PyTorch is not installed in this Python, so it was not measured; to compare, "
            "run from a venv that has it (pip install torch)")


def _run_child(cmd, threads: int, what: str) -> dict:
    env = _child_env(threads)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"bench step: {what} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ranks_child(args) -> int:
    from hpcdp.bench import step_ranks

    args.threads = int(args.threads)
    x, y = _gpt_batch(np.random.default_rng(0))
    if args.ranks_child == "hpcdp":
        step_ranks.hpcdp_child(args, dict(GPT), x, y)
    else:
        step_ranks.torch_child(args, torch_gpt_model, torch_step, x, y)
    return 0


def _main_ranks(args, argv) -> int:
    """``--ranks N`` (N >= 2): the GPT step under hpcdp's strategies beside PyTorch's
    (hpcdp.bench.step_ranks); checks the options that mode reads."""
    from hpcdp.bench import step_ranks

    if args.ranks < 2:
        raise ValueError(f"--strategies and --rounds apply to --ranks >= 2 (got --ranks {args.ranks}); "
                         f"add --ranks 2")
    if args.models not in (None, "gpt"):
        raise ValueError(f"--ranks {args.ranks} times the GPT only: drop --models {args.models} or pass --models gpt")
    if args.profile:
        raise ValueError(f"--profile profiles the one-rank step: drop it with --ranks {args.ranks}")
    try:
        threads = int(args.threads)
    except ValueError:
        raise ValueError(f"--threads {args.threads!r}: with --ranks {args.ranks}, one thread count per rank, "
                         f"e.g. 1") from None
    if threads < 1:
        raise ValueError("--threads: thread counts must be >= 1")
    if args.torch_python and not (os.path.isfile(args.torch_python) and os.access(args.torch_python, os.X_OK)):
        raise ValueError(f"--torch-python {args.torch_python}: not an executable file; pass the python "
                         f"of a venv that has torch, e.g. .venv-torch/bin/python")
    if args.warmup < 0 or args.repeats < 2:
        raise ValueError("--warmup must be >= 0 and --repeats >= 2")
    rounds = 2 if args.rounds is None else args.rounds
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: at least 1")
    strategies = step_ranks.parse_strategies(args.strategies or "ddp,zero3")
    step_ranks.per_rank_batch(GPT_BATCH, args.ranks)  # the global batch must split evenly
    step_ranks.find_mpiexec("hpcdp bench step")
    ns = argparse.Namespace(ranks=args.ranks, threads=threads, warmup=args.warmup, repeats=args.repeats,
                            gpt_config=args.gpt_config, torch_python=args.torch_python, rounds=rounds,
                            strategies=strategies, gpt=dict(GPT), global_batch=GPT_BATCH,
                            env=_child_env(threads))
    cleared = [k for k in CLEARED_ENV if k in os.environ]
    print(f"hpcdp bench step: float32, {args.ranks} ranks, {threads} thread(s) per rank; "
          f"{' and '.join(CLEARED_ENV)} unset for every contender"
          + (f" (were set: {', '.join(cleared)})" if cleared else " (were not set)"), flush=True)
    record = step_ranks.run(ns)
    return _write_json(args.json, argv, cleared, "ranks", record)


def _write_json(path, argv, cleared, key, value) -> int:
    """The bench's JSON file: the command, date, machine, the cleared variables and ``key``."""
    doc = {
        "command": "hpcdp bench step " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.machine(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "loadavg_at_end": os.getloadavg()},
        "env_cleared": list(CLEARED_ENV), "env_cleared_were_set": cleared,
        key: value,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench step", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2 (default 1)")
    p.add_argument("--models", default=None, help="mlp, gpt or both (default mlp,gpt; gpt with --ranks >= 2)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per contender (default 5)")
    p.add_argument("--repeats", type=int, default=30, help="timed steps per contender (default 30)")
    p.add_argument("--json", default="bench-step.json", help="where to write the results (default bench-step.json)")
    p.add_argument("--profile", action="store_true",
                   help="also print a per-op profile of the GPT step, hpcdp beside PyTorch")
    p.add_argument("--gpt-config", default=None, metavar="FILE",
                   help="take the GPT ([model]) and its batch ([train] global_batch) from this job file")
    p.add_argument("--torch-python", default=None, metavar="PY",
                   help="run the PyTorch GPT profile (with --ranks >= 2: PyTorch DDP / FSDP2) in this "
                        "interpreter (a venv with torch)")
    p.add_argument("--ranks", type=int, default=1,
                   help="ranks of the GPT step (default 1); >= 2: hpcdp's strategies under mpiexec beside "
                        "PyTorch's on gloo (hpcdp.bench.step_ranks)")
    p.add_argument("--strategies", default=None,
                   help="with --ranks >= 2: ddp (against PyTorch DDP), zero3 (against FSDP2) or both "
                        "(default ddp,zero3)")
    p.add_argument("--rounds", type=int, default=None,
                   help="with --ranks >= 2: interleaved rounds of every contender's job (default 2)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ranks-child", choices=("hpcdp", "torch"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-strategy", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_strategy is not None and not args.ranks_child:
        raise ValueError("--child-strategy is internal to --ranks N; choose strategies with --strategies")
    if args.gpt_config:
        set_gpt(args.gpt_config)
    if args.ranks_child:  # one rank of --ranks N's contenders (hpcdp.bench.step_ranks)
        return _ranks_child(args)
    if args.torch_child:  # PyTorch profile in another interpreter: one JSON line
        print(json.dumps(measure_torch_profile(args.child, args.warmup, args.repeats)), flush=True)
        return 0
    if args.ranks != 1 or args.strategies is not None or args.rounds is not None:
        return _main_ranks(args, argv)
    models = [m.strip() for m in (args.models or "mlp,gpt").split(",") if m.strip()]
    bad = sorted(set(models) - {"mlp", "gpt"})
    if bad or not models:
        raise ValueError(f"--models: {','.join(bad) or args.models!r} not known; choose from mlp, gpt")
    if (args.profile or args.gpt_config or args.torch_python) and "gpt" not in models:
        raise ValueError("--profile, --gpt-config and --torch-python apply to the GPT: add gpt to --models")
    if args.torch_python and not (os.path.isfile(args.torch_python) and os.access(args.torch_python, os.X_OK)):
        raise ValueError(f"--torch-python {args.torch_python}: not an executable file; pass the python "
                         f"of a venv that has torch, e.g. .venv-torch/bin/python")
    if args.torch_python and not args.profile:
        raise ValueError("--torch-python runs PyTorch's profile: add --profile")
    if args.warmup < 0 or args.repeats < 2:
        raise ValueError("--warmup must be >= 0 and --repeats >= 2")
    if args.child is not None:  # measuring process: print one JSON line
        print(json.dumps(measure(args.child, models, args.warmup, args.repeats, args.profile)), flush=True)
        return 0
    try:
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        raise ValueError(f"--threads {args.threads!r}: expected comma-separated integers, e.g. 1,2") from None
    if min(threads) < 1:
        raise ValueError("--threads: thread counts must be >= 1")

    cleared = [k for k in CLEARED_ENV if k in os.environ]
    print(f"hpcdp bench step: float32; each thread count in a fresh process with "
          f"{'/'.join(THREAD_VARS)} = threads; {' and '.join(CLEARED_ENV)} unset for the benchmark"
          + (f" (were set: {', '.join(cleared)})" if cleared else " (were not set)"), flush=True)
    results = []
    for t in threads:
        common = ["--warmup", str(args.warmup), "--repeats", str(args.repeats),
                  *(["--gpt-config", args.gpt_config] if args.gpt_config else [])]
        cmd = [sys.executable, "-m", "hpcdp.bench.step_time", "--child", str(t), "--models", ",".join(models),
               *common, *(["--profile"] if args.profile else [])]
        results.append(_run_child(cmd, t, f"the {t}-thread measurement"))
        gpt = results[-1]["models"].get("gpt")
        if args.profile and gpt and args.torch_python and "torch" not in gpt["profile"]:
            cmd = [args.torch_python, "-m", "hpcdp.bench.step_time", "--child", str(t), "--torch-child", *common]
            out = _run_child(cmd, t, f"the {t}-thread PyTorch profile ({args.torch_python})")
            gpt["profile"]["torch"] = out["profile"]
            gpt["times"]["torch (own process)"] = out["times"]
            results[-1]["torch_profile_version"] = out["torch"]
    print(_table(results) + torch_note(results))
    for res in results:
        gpt = res["models"].get("gpt")
        if gpt and "profile" in gpt:
            prof = gpt["profile"]
            print(f"\nper-op profile, GPT, {res['threads']} thread(s), ms per step "
                  f"(hpcdp{', PyTorch ' + (res.get('torch') or res.get('torch_profile_version', '')) if 'torch' in prof else ''}; "
                  f"{gpt['desc']}):")
            print(profile_table(prof["hpcdp"], prof.get("torch")))
            print("hpcdp's linear is x @ W + b with its activation fused (the MLP's GELU is in matmul); "
                  "MB: arrays each op reads and writes, counted once\n")
            print(top_ops(prof["hpcdp"], prof.get("torch")))
    return _write_json(args.json, argv, cleared, "results", results)


if __name__ == "__main__":
    sys.exit(main())
