"""PyTorch Distributed Checkpoint (DCP) as ``hpcdp bench ckpt``'s contender.

Run by the bench with the Python of a venv that has torch (``--dcp-python``; torch is
never a dependency of hpcdp), this script imports only torch, NumPy and the standard
library. R processes (``torch.multiprocessing``, gloo on loopback) each hold the
whole state of the given shapes (parameters and AdamW's two moments, float32: what
a DDP replica holds), save it with ``torch.distributed.checkpoint.save`` (its
planner writes each replicated tensor once, spread over the ranks; the file system
writer fsyncs its files), drop the files from the page cache, load into live
tensors (``dcp.load``: every rank reads its whole state) and compare. Prints one
JSON line: bytes of state, the slowest rank's save and load seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time


def _evict(root) -> None:
    for dirpath, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _state(shapes, torch, fill=None):
    out = {}
    for i, (name, shape) in enumerate(shapes):
        for k, buf in enumerate(("param", "m", "v")):
            if fill is None:
                g = torch.Generator().manual_seed(1000 * i + k)
                out[f"{buf}.{name}"] = torch.randn(*shape, generator=g, dtype=torch.float32)
            else:
                out[f"{buf}.{name}"] = torch.full(shape, fill, dtype=torch.float32)
    return out


def _rank(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    shapes = json.loads(open(args.shapes).read())
    state = _state(shapes, torch)
    dist.barrier()
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=args.dir)
    dist.barrier()
    write_s = time.perf_counter() - t0
    if rank == 0:
        _evict(args.dir)
    target = _state(shapes, torch, fill=float("nan"))
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(target, checkpoint_id=args.dir)
    dist.barrier()
    read_s = time.perf_counter() - t0
    same = all(torch.equal(state[k], target[k]) for k in state)
    if rank == 0:
        nbytes = sum(t.numel() * 4 for t in state.values())
        queue.put({"bytes": nbytes, "write_s": write_s, "read_s": read_s, "same": same})
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", required=True, help="JSON file: [[name, shape], ...]")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--dir", required=True, help="checkpoint folder (made new)")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(args, port, queue), nprocs=args.ranks, join=True, start_method="spawn")
    result = queue.get()
    if not result.pop("same"):
        print("dcp contender: the loaded state differs from the saved one", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
