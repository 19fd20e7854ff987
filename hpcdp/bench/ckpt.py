"""``hpcdp bench ckpt``: checkpoint write/read bandwidth against ``dd``, and the
training stall of a save (synchronous and asynchronous).

Bandwidth. For each state size, rank count R and layout, ``mpiexec -n R`` runs a
worker that holds 1/R of the state (its ``shard_range`` of the parameters and of
AdamW's two moment buffers, like a ZeRO shard), saves it with hpcdp.io (pieces,
SHA-256 of every 4 MiB block, HDF5 structure, pwrite, fsync, index, rename, marker:
the whole commit), drops the files from the page cache (``posix_fadvise
DONTNEED``, per file: no effect on anyone else's cache), then restores its 1/R
(reads, checksums checked) and compares with what it wrote. In the same run, on the
same disk, R parallel ``dd conv=fsync`` copy those very data files (the same bytes)
and, after the same eviction, read the copies back. Bandwidth = total
bytes / wall time of the slowest rank. Sizes: the largest GPT config shipped
(``jobs/gpt_ddp.toml``; parameters + AdamW m and v) and a synthetic state of at
least 1 GiB.

Options: ``--io direct,buffered`` times the writer with O_DIRECT (where the file
system takes it) and through the page cache (``HPCDP_CKPT_DIRECT=0``) in the same
run; ``--restore replica`` restores the whole state on every rank (DDP's restore:
1/M read per rank and shared, io/restore/spread.py) and reports the bytes read over all
ranks (the readers' counters and /proc/self/io); ``--dcp-python`` times PyTorch DCP
(dcp_contender.py, with the Python of a venv that has torch) on the same state
interleaved with ours; ``--sizes gpt25m`` is the 25 M-parameter GPT (8 blocks, 512
wide).

Stall. A real training loop (jobs/gpt_ddp.toml, DDP on ``--stall-ranks`` ranks, default 2:
on a 2-core node that is every core, so the writer competes with training for CPU; 1
leaves it a core; hpcdp.step.train_step)
saving every K steps: the time of each save call (synchronous: the whole save;
asynchronous: the host copy, the rest runs in the background: ``--stall-modes``
thread and/or process, checkpoint.writer), and the steps that ran while a background
write was in flight, against the median step without any save.

Layout "shared" needs h5py with MPI (``bash .ci/parallel-hdf5.sh``): run the bench
from that venv for both layouts; from the main venv the shared rows say why they
are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hpcdp.io.disk.direct import ENV as DIRECT_ENV  # "0": the writer goes through the page cache
from hpcdp.jobs import config_path

GIB = 1 << 30
OMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
             "OMPI_MCA_rmaps_base_oversubscribe": "1"}


# -- the state being saved -------------------------------------------------------------

# GPT states: jobs/gpt_ddp.toml as shipped, and widened to 25 M parameters (8 blocks of
# width 512: 290 MiB with AdamW's m and v), the size the DCP comparison uses
GPTS = {"gpt": {}, "gpt25m": {"n_layer": 8, "n_embd": 512, "n_head": 8}}

def state_layout(size: str):
    """(layout: list of ParamSpec, dtype) of the state named ``size``."""
    from hpcdp.nn.params import ParamSpec

    if size in GPTS:
        import tomllib

        from hpcdp.config import config_from_dict
        from hpcdp.nn import build_model
        raw = tomllib.loads(config_path("gpt_ddp.toml").read_text())
        raw["model"].update(GPTS[size])
        cfg = config_from_dict(raw)
        return list(build_model(cfg.model, dtype="float32").flat.layout), "float32"
    gib = float(size.removesuffix("GiB"))
    # 24 weight matrices of equal size, 3 buffers (param, m, v): >= gib GiB in all
    per = int(np.ceil(gib * GIB / 4 / 3 / 24))
    cols = 1024
    rows = -(-per // cols)
    layout, off = [], 0
    for i in range(24):
        layout.append(ParamSpec(f"w{i}", off, (rows, cols), rows * cols))
        off += rows * cols
    return layout, "float32"


def _numel(layout) -> int:
    return layout[-1].offset + layout[-1].size


def _my_pieces(layout, dtype, rank, size):
    from hpcdp.io.protocol import Piece
    from hpcdp.shard import shard_range

    off, n = shard_range(_numel(layout), size, rank)
    rng = np.random.default_rng([rank, 7])
    return [Piece(buf, off, rng.standard_normal(n, dtype=np.float32).astype(dtype, copy=False))
            for buf in ("param", "optim/m", "optim/v")]


def _evict(paths) -> None:
    """Drop these files' pages from the page cache (clean pages: fsynced before)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the MPI worker (one bandwidth point) --------------------------------------------------

def worker(args) -> None:
    from mpi4py import MPI

    from hpcdp.io.format.checksum import hash_threads
    from hpcdp.io.restore.load import load
    from hpcdp.io.protocol import Piece
    from hpcdp.io.format.runstate import expected_tensors
    from hpcdp.io.save.save import SaveJob, save
    from hpcdp.io.save.snapshot import take_snapshot

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    layout, dtype = state_layout(args.size)

    class _Flat:  # what expected_tensors needs of a model's FlatParams
        pass
    flat = _Flat()
    flat.layout, flat.dtype = layout, np.dtype(dtype)

    class _Opt:
        names = ("m", "v")
    expected = expected_tensors(flat, _Opt())
    pieces = _my_pieces(layout, dtype, rank, size)
    snap = take_snapshot(pieces, layout, copy=False)
    root = Path(args.dir) / f"hpcdp-{args.size}-{args.layout}-{size}"
    nbytes = np.array([snap.nbytes], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, nbytes)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    threads = hash_threads(local.Get_size())  # as the Checkpointer sizes it
    local.Free()
    job = SaveJob(root, 1, snap, expected, {"strategy": "bench", "world_size": size},
                  {"step": 1, "optimizer_kind": "adamw", "optimizer_steps": 1}, {}, layout=args.layout,
                  threads=threads)
    comm.Barrier()
    t0 = time.perf_counter()
    ckpt = save(job, comm)
    t_write = time.perf_counter() - t0
    write_s = comm.allreduce(t_write, op=MPI.MAX)
    files = [ckpt / f for f in os.listdir(ckpt)]
    if rank == 0:
        _evict(files)
    comm.Barrier()
    # restore into live buffers, as a resumed run does (model and optimizer built):
    # touched memory, so the page faults of fresh allocations are not counted as reading
    # --restore replica: every rank restores the whole state (none, DDP, PS workers),
    # which reads 1/M each and shares (io/restore/spread.py); shard: each its own 1/R (ZeRO)
    if args.restore == "replica":
        numel = _numel(layout)
        wanted = [Piece(p.buffer, 0, np.concatenate(comm.allgather(p.array))) for p in pieces]
        assert all(w.size == numel for w in wanted)
    else:
        wanted = pieces
    targets = [Piece(p.buffer, p.offset, np.full_like(p.array, np.nan)) for p in wanted]
    comm.Barrier()
    io0 = _proc_read_bytes()
    t0 = time.perf_counter()
    _, got = load(ckpt, targets, layout, expected, "adamw", comm, threads=threads)
    t_read = time.perf_counter() - t0
    read_s = comm.allreduce(t_read, op=MPI.MAX)
    counted = comm.allreduce(int(got))
    from_disk = comm.allreduce(_proc_read_bytes() - io0)
    same = all(np.array_equal(a.array, b.array) for a, b in zip(wanted, targets))
    if not comm.allreduce(same, op=MPI.LAND):
        raise SystemExit("bench ckpt: the restored state differs from the saved one")
    comm.Barrier()
    if rank == 0:  # the driver copies the data files with dd, then removes the checkpoint
        data = sorted(str(f) for f in files if f.name.endswith(".h5") and f.name != "index.h5")
        print(json.dumps({"bytes": int(nbytes[0]), "write_s": write_s, "read_s": read_s, "root": str(root),
                          "files": data, "read_counted": counted, "read_from_disk": from_disk}), flush=True)


def _proc_read_bytes() -> int:
    """This process's bytes fetched from storage so far (/proc/self/io read_bytes)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


# -- dd of the same bytes ----------------------------------------------------------------

def dd_point(files, ranks: int, directory: Path, direct: bool = False) -> dict:
    """``dd`` of the same bytes: R parallel ``dd conv=fsync`` copy the checkpoint's data
    files (one file each; the one shared file in R byte ranges) to new files on the
    same disk (the sources were just read: page cache), then, after eviction, R
    parallel ``dd`` read the copies. Not /dev/zero: the development VM's disk wrote
    zeros several times faster than data, which would flatter dd."""
    sizes = [os.path.getsize(f) for f in files]
    jobs = []  # (source, skip bytes, count bytes)
    if len(files) == ranks:
        jobs = [(f, 0, n) for f, n in zip(files, sizes)]
    else:
        total = sum(sizes)
        for f, n in zip(files, sizes):
            for r in range(ranks):
                lo, hi = n * r // ranks, n * (r + 1) // ranks
                jobs.append((f, lo, hi - lo))
        del total
    outs = [directory / f"dd-{ranks}-{i}" for i in range(len(jobs))]

    def run_all(cmds):
        t0 = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
        errors = [p.communicate()[1] for p in procs if p.wait()]
        if errors:
            raise SystemExit(f"bench ckpt: dd failed: {errors[0].decode()[-500:]}")
        return time.perf_counter() - t0

    write_s = run_all([["dd", f"if={f}", f"of={o}", "bs=4M", "iflag=skip_bytes,count_bytes", f"skip={lo}",
                        f"count={n}", "conv=fsync"] for (f, lo, n), o in zip(jobs, outs)])
    _evict(outs)
    read_s = run_all([["dd", f"if={o}", "of=/dev/null", "bs=4M"] for o in outs])
    nbytes = sum(n for _, _, n in jobs)
    out = {"bytes": nbytes, "write_s": write_s, "read_s": read_s}
    if direct:  # the disk without the page cache: dd oflag=direct (whole 4 MiB blocks; a tail is dropped)
        for o in outs:
            o.unlink()
        counts = [n // (4 << 20) for _, _, n in jobs]
        out["direct_bytes"] = sum(counts) * (4 << 20)
        out["direct_write_s"] = run_all([["dd", f"if={f}", f"of={o}", "bs=4M", "iflag=skip_bytes", f"skip={lo}",
                                          f"count={c}", "oflag=direct", "conv=fsync"]
                                         for (f, lo, _), o, c in zip(jobs, outs, counts)])
    for o in outs:
        o.unlink()
    return out


def _mpiexec(ranks: int, argv, extra_env=None) -> dict:
    from hpcdp.launch import child_env, hpcdp_command, mpiexec_command, run_child

    cmd = mpiexec_command(ranks, "hpcdp bench ckpt") + hpcdp_command("hpcdp.bench.ckpt") + list(argv)
    proc = run_child(cmd, "hpcdp bench ckpt", 1800, child_env({**OMPI_ROOT, **(extra_env or {})}), tail=4000)
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


def bandwidth(args) -> list:
    import h5py

    rows = []
    directory = Path(args.dir)
    for size in args.sizes:
        for layout in args.layouts:
            if layout == "shared" and not h5py.get_config().mpi:
                print(f"# layout shared skipped: this h5py has no MPI (run from .venv-phdf5, see "
                      f"docs/checkpoints.md)", flush=True)
                continue
            for ranks in args.ranks:
                ours = {io: [] for io in args.io}
                dds, dcps = [], []
                for _ in range(args.repeat):  # interleaved: load drift hits every contender alike
                    for io in args.io:
                        ours[io].append(_mpiexec(ranks, ["--worker", "--size", size, "--layout", layout,
                                                         "--dir", str(directory), "--restore", args.restore],
                                                 {DIRECT_ENV: "1" if io == "direct" else "0"}))
                        if io == args.io[0]:
                            dds.append(dd_point(ours[io][-1]["files"], ranks, directory, args.dd_direct))
                        shutil.rmtree(ours[io][-1]["root"], ignore_errors=True)
                    if args.dcp_python:
                        dcps.append(dcp_point(args.dcp_python, size, ranks, directory))
                for io in args.io:
                    rows.append(_row(size, layout, ranks, io, ours[io], dds, dcps, args.restore))
    return rows


def _row(size, layout, ranks, io, ours, dds, dcps, restore) -> dict:
    row = {"size": size, "layout": layout, "ranks": ranks, "io": io, "restore": restore, "bytes": ours[0]["bytes"],
           "read_counted": ours[0].get("read_counted"), "read_from_disk": ours[0].get("read_from_disk")}
    for what in ("write", "read"):
        t = statistics.median(o[f"{what}_s"] for o in ours)
        d = statistics.median(o[f"{what}_s"] for o in dds)
        row[f"{what}_s"] = t
        row[f"{what}_MBps"] = row["bytes"] / t / 1e6
        row[f"dd_{what}_MBps"] = statistics.median(o["bytes"] for o in dds) / d / 1e6
        row[f"{what}_vs_dd"] = row[f"{what}_MBps"] / row[f"dd_{what}_MBps"]
        if what == "write" and "direct_write_s" in dds[0]:
            row["dd_direct_write_MBps"] = statistics.median(o["direct_bytes"] / o["direct_write_s"] for o in dds) / 1e6
            row["write_vs_dd_direct"] = row["write_MBps"] / row["dd_direct_write_MBps"]
        if dcps:
            row[f"dcp_{what}_s"] = statistics.median(o[f"{what}_s"] for o in dcps)
            row[f"{what}_vs_dcp"] = t / row[f"dcp_{what}_s"]
    print(f"{size:>7} {layout:>6} {ranks:>2} ranks {io:>8} {row['bytes'] / 2**20:9.1f} MiB   write "
          f"{row['write_MBps']:7.1f} MB/s (dd {row['dd_write_MBps']:7.1f}, {row['write_vs_dd']:.2f}x)   "
          f"read {row['read_MBps']:7.1f} MB/s (dd {row['dd_read_MBps']:7.1f}, {row['read_vs_dd']:.2f}x); "
          f"{restore} restore read {row['read_counted'] / 2**20:.1f} MiB (counted), "
          f"{row['read_from_disk'] / 2**20:.1f} MiB (/proc/self/io)", flush=True)
    if "dd_direct_write_MBps" in row:
        print(f"{'':>7} {'':>6} {ranks:>2} ranks: dd oflag=direct writes {row['dd_direct_write_MBps']:7.1f} MB/s "
              f"(ours {row['write_vs_dd_direct']:.2f}x that)", flush=True)
    if dcps:
        print(f"{'':>7} {'dcp':>6} {ranks:>2} ranks: save {row['dcp_write_s']:.3f} s (ours {row['write_s']:.3f} s, "
              f"{row['write_vs_dcp']:.2f}x its time), load {row['dcp_read_s']:.3f} s (ours {row['read_s']:.3f} s, "
              f"{row['read_vs_dcp']:.2f}x)", flush=True)
    return row


def dcp_point(python: str, size: str, ranks: int, directory: Path) -> dict:
    """PyTorch DCP saving and loading the same state (dcp_contender.py, its own venv)."""
    layout, _ = state_layout(size)
    shapes = directory / "dcp-shapes.json"
    shapes.write_text(json.dumps([[p.name, list(p.shape)] for p in layout]))
    out = directory / f"dcp-{size}-{ranks}"
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "MPI", "HYDRA", "OMPI"))}
    proc = subprocess.run([python, str(Path(__file__).with_name("dcp_contender.py")), "--shapes", str(shapes),
                           "--ranks", str(ranks), "--dir", str(out)], env={**env, **_thread_env()},
                          capture_output=True, text=True, timeout=1800)
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench ckpt: the DCP contender failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


def _thread_env() -> dict:
    from hpcdp.launch import THREAD_ENV
    return dict(THREAD_ENV)


# -- the training stall --------------------------------------------------------------------

def stall_worker(args) -> None:
    """DDP on this job's ranks, jobs/gpt_ddp.toml, saving every ``--every`` steps."""
    import io
    import tomllib

    from mpi4py import MPI

    from hpcdp.config import config_from_dict
    from hpcdp.data import load_dataset
    from hpcdp.data.sampler import GlobalSampler, micro_batches
    from hpcdp.io.checkpointer import Checkpointer
    from hpcdp.nn import build_model
    from hpcdp.optim import build_optimizer, lr_at
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies import build_strategy
    from hpcdp.train import task_of
    from hpcdp.world import World
    from hpcdp.autograd import Tensor

    raw = tomllib.loads(config_path("gpt_ddp.toml").read_text())
    raw["train"]["steps"] = args.steps
    raw["checkpoint"] = {"dir": str(Path(args.dir) / f"stall-{args.mode}"), "every": args.every,
                         "asynchronous": args.mode != "sync", "final": False, "keep": 2}
    if args.mode != "sync":
        raw["checkpoint"]["writer"] = args.mode  # "thread" or "process"
    cfg = config_from_dict(raw)
    world = World.from_mpi()
    ds = load_dataset(cfg.data, task_of(cfg.model), cfg.run.dtype)
    model = build_model(cfg.model, dtype="float32")
    opt = build_optimizer(cfg.optim, layout=model.flat.layout, dtype="float32")
    strategy = build_strategy(cfg.parallel, world, cfg.comm)
    strategy.setup(model.flat, opt, world)
    sampler = GlobalSampler(ds.n_train, cfg.train.global_batch, cfg.data.seed, cfg.train.last_batch)
    ck = Checkpointer(cfg, world=world, strategy=strategy, model=model, optimizer=opt, sampler=sampler,
                      total=args.steps, run_dir=Path(args.dir))
    be = model.flat.backend

    def fetch(idx):
        return Tensor(ds.x_train[idx], backend=be), Tensor(ds.y_train[idx], backend=be)

    steps, saves, busy = [], [], []
    for step in range(1, args.steps + 1):
        opt.lr = lr_at(cfg.optim, step, args.steps)
        local, n = sampler.local_indices(step - 1, strategy.dp_size, strategy.dp_rank)
        t0 = time.perf_counter()
        train_step(model, strategy, LocalBatch(micro_batches(local, 1), n, sampler.global_indices(step - 1)[:1]),
                   fetch)
        t1 = time.perf_counter()
        writing = ck.background is not None and ck.background.busy()
        ck.after_step(step)
        t2 = time.perf_counter()
        steps.append(t1 - t0)
        busy.append(writing)
        if step % args.every == 0:
            saves.append(t2 - t1)
    ck.close()
    strategy.close()
    if world.rank == 0:
        quiet = [s for s, b in zip(steps[5:], busy[5:]) if not b]  # no write in flight, warm
        loud = [s for s, b in zip(steps[5:], busy[5:]) if b]
        base = statistics.median(quiet)
        print(json.dumps({"mode": args.mode, "step_s": base, "save_call_s": statistics.median(saves),
                          "steps_during_write": len(loud), "extra_s_per_save": (sum(loud) - base * len(loud))
                          / max(1, len(saves)),
                          "speed_during_write": base / statistics.median(loud) if loud else None}), flush=True)


def stall(args) -> list:
    rows = []
    for mode in args.stall_modes:
        r = _mpiexec(args.stall_ranks, ["--stall-worker", "--mode", mode, "--steps", str(args.stall_steps), "--every",
                         str(args.every), "--dir", str(args.dir)])
        r["stall_s"] = r["save_call_s"] + max(0.0, r["extra_s_per_save"])
        rows.append(r)
        print(f"stall {mode:>5}: step {r['step_s'] * 1e3:7.1f} ms; save call {r['save_call_s'] * 1e3:8.1f} ms; "
              f"{r['steps_during_write']} steps overlapped a background write, "
              f"{r['extra_s_per_save'] * 1e3:+7.1f} ms per save; stall per save {r['stall_s'] * 1e3:8.1f} ms"
              + (f"; steps during a write at {r['speed_during_write']:.2f}x the speed of the others"
                 if r.get("speed_during_write") else ""), flush=True)
    return rows


# -- command line ------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench ckpt", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--sizes", default="gpt,1GiB", help="states: gpt (jobs/gpt_ddp.toml + AdamW) and/or <x>GiB")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--layouts", default="split,shared")
    p.add_argument("--repeat", type=int, default=3, help="runs per point (median)")
    p.add_argument("--dir", default=None, help="folder on the disk to measure (default: a new temporary one)")
    p.add_argument("--stall-steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="stall: save every K steps")
    p.add_argument("--stall-ranks", type=int, default=2, help="stall: ranks of the training loop (2: every "
                   "core of a 2-core node busy with training; 1 leaves the writer a core)")
    p.add_argument("--no-stall", action="store_true")
    p.add_argument("--stall-modes", default="sync,thread,process",
                   help="stall: sync, and/or asynchronous with checkpoint.writer thread / process")
    p.add_argument("--io", default="direct", help="writer paths to compare: direct (O_DIRECT where the file system "
                   "takes it) and/or buffered (the page cache)")
    p.add_argument("--restore", default="shard", choices=("shard", "replica"),
                   help="shard: each rank restores its 1/R (ZeRO); replica: the whole state on every rank (DDP)")
    p.add_argument("--dd-direct", action="store_true", help="also time dd oflag=direct (the disk past the page "
                   "cache) on the same bytes")
    p.add_argument("--dcp-python", help="the Python of a venv with torch: also time PyTorch DCP on the same state")
    p.add_argument("--json", help="write the rows to this file")
    # worker modes (launched under mpiexec by the above)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stall-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", help=argparse.SUPPRESS)
    p.add_argument("--layout", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.stall_worker:
        stall_worker(args)
        return 0
    if args.repeat < 1 or args.every < 1:
        p.error("--repeat and --every must be at least 1")
    if args.stall_ranks < 1:
        p.error(f"--stall-ranks {args.stall_ranks}: the training loop needs at least 1 rank")
    if not args.no_stall and args.stall_steps <= args.every:
        p.error(f"--stall-steps {args.stall_steps} must exceed --every {args.every} (the stall "
                "study needs saves to time), or pass --no-stall")
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.ranks = [int(r) for r in args.ranks.split(",")]
    args.layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    args.io = [s.strip() for s in args.io.split(",") if s.strip()]
    args.stall_modes = [s.strip() for s in args.stall_modes.split(",") if s.strip()]
    bad = [x for x in args.io if x not in ("direct", "buffered")] + \
        [x for x in args.stall_modes if x not in ("sync", "thread", "process")]
    if bad:
        p.error(f"unknown --io or --stall-modes value {bad[0]!r} (--io: direct, buffered; --stall-modes: sync, "
                "thread, process)")
    own = args.dir is None
    args.dir = tempfile.mkdtemp(prefix="hpcdp-bench-ckpt-", dir=".") if own else args.dir
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    try:
        print(f"# hpcdp bench ckpt in {Path(args.dir).resolve()}; {args.repeat} run(s) per point, median", flush=True)
        out = {"bandwidth": bandwidth(args)}
        if not args.no_stall:
            out["stall"] = stall(args)
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
