"""``hpcdp ckpt``: list, describe, verify and export checkpoints (one process).

    hpcdp ckpt ls DIR                    checkpoints in DIR (a checkpoints folder or a run dir)
    hpcdp ckpt info CKPT [--config]      run state, tensors and where each piece lives
    hpcdp ckpt verify PATH...            every checksum (XXH3-128; format 1: SHA-256) of every checkpoint named
    hpcdp ckpt export CKPT OUT [--optimizer]   weights to one plain .h5 or .npz file
    hpcdp ckpt export CKPT OUT --format safetensors|hf-gpt2   for other tools (hpcdp/io/interop/export.py)

Exit status of ``verify``: 0 every checkpoint is sound, 1 a problem was found (each
is printed), 2 a path is not a checkpoint. The other commands: 0, or 2 on an error.
"""

from __future__ import annotations

import argparse
import sys

from hpcdp.io.errors import CheckpointError

OK, CORRUPT, USAGE = 0, 1, 2


def _mib(n) -> str:
    return f"{n / 2**20:.1f} MiB"


def cmd_ls(args) -> int:
    from hpcdp.io.interop.inspect import checkpoints_in, summary

    rows = [summary(p) for p in checkpoints_in(args.dir)]
    print(f"{'checkpoint':<24} {'status':<10} {'size':>10}  written by")
    for r in rows:
        name = r["path"].rstrip("/").rsplit("/", 1)[-1]
        if r["problem"]:
            print(f"{name:<24} {'INCOMPLETE':<10} {_mib(r['bytes']):>10}  ({r['problem']})")
        else:
            print(f"{name:<24} {'complete':<10} {_mib(r['bytes']):>10}  {r['world_size']} rank(s), "
                  f"{r['strategy']}, layout {r['layout']}, {r['files']} data file(s)")
    return OK


def cmd_info(args) -> int:
    from hpcdp.io.format.commit import marker_problem
    from hpcdp.io.format.index import read_index
    from hpcdp.io.interop.inspect import weights_sha256

    problem = marker_problem(args.ckpt)
    index = read_index(args.ckpt)
    digest = None if problem else weights_sha256(args.ckpt)  # reads every weight: errors before any output
    a, s = index.attrs, index.state
    print(f"checkpoint   {args.ckpt}" + (f"  (NOT LOADABLE: {problem})" if problem else ""))
    print(f"format       {a.get('format')} version {a.get('format_version')}, written by hpcdp "
          f"{a.get('hpcdp_version')}")
    print(f"written by   {a.get('world_size')} rank(s), strategy {a.get('strategy')!r}, layout {a.get('layout')}")
    print(f"step         {index.step} of {s.get('total_steps')}; next batch: epoch {s.get('next_epoch')}, "
          f"batch {s.get('next_batch')} of {s.get('batches_per_epoch')} (global batch {s.get('global_batch')})")
    print(f"optimizer    {s.get('optimizer_kind')}, {s.get('optimizer_steps')} steps, lr {s.get('lr')} "
          f"({s.get('lr_schedule')})")
    print(f"random       data seed {s.get('data_seed')}; dropout keyed by (seed, step, sample, layer)")
    for key, arr in sorted(index.arrays.items()):
        if key.startswith("rank_"):
            print(f"per rank     {key[5:]}: {arr.astype('int64').tolist()}")
    if digest:
        print(f"weights      sha256 {digest}")
    print(f"files        " + ", ".join(f"{f} ({_mib(b)})" for f, b in zip(index.files, index.file_bytes)))
    print(f"\n{'tensor':<44} {'shape':<16} {'dtype':<8} pieces (file[elements])")
    for tid, name in enumerate(index.tensors):
        rows = index.pieces_of(tid)
        where = ", ".join(f"{index.files[int(fi)]}[{int(o)}:{int(o) + int(n)}]" for _, fi, o, n in rows)
        print(f"{name:<44} {str(tuple(index.shapes[tid])):<16} {index.dtypes[tid]:<8} {where}")
    if args.config:
        print("\n# resolved config\n" + str(a.get("config", "")))
    return OK


def cmd_verify(args) -> int:
    from hpcdp.io.interop.inspect import checkpoints_in, verify

    status = OK
    for path in args.paths:
        try:
            found = checkpoints_in(path)
        except CheckpointError as e:
            print(f"hpcdp ckpt verify: {e}", file=sys.stderr)
            return USAGE
        for ckpt in found:
            problems, nbytes = verify(ckpt)
            if problems:
                status = CORRUPT
                print(f"FAILED {ckpt}:")
                for p in problems:
                    print(f"  {p}")
            else:
                print(f"OK     {ckpt} ({_mib(nbytes)} verified)")
    return status


def cmd_export(args) -> int:
    from hpcdp.io.interop.export import export_any

    print(export_any(args.ckpt, args.out, args.format, optimizer=args.optimizer, force=args.force))
    return OK


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp ckpt", description="Inspect, verify and export hpcdp checkpoints "
                                "(block checksums: XXH3-128 in format 2, SHA-256 in format 1; the weights' "
                                "digest printed by info is a SHA-256 of the weights).")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("ls", help="list the checkpoints in a folder or run directory")
    q.add_argument("dir")
    q = sub.add_parser("info", help="run state, tensors and where each piece lives")
    q.add_argument("ckpt")
    q.add_argument("--config", action="store_true", help="also print the resolved config")
    q = sub.add_parser("verify", help="check every block checksum: XXH3-128 (format 2) or SHA-256 (format 1); "
                                      "exit 0 sound, 1 corrupt, 2 not a checkpoint")
    q.add_argument("paths", nargs="+")
    q = sub.add_parser("export", help="weights to one .h5, .npz or .safetensors file, or a transformers folder")
    q.add_argument("ckpt")
    q.add_argument("out")
    from hpcdp.io.interop.export import FORMATS
    q.add_argument("--format", choices=FORMATS,
                   help="default: from OUT's suffix; hf-gpt2: a folder GPT2LMHeadModel.from_pretrained loads")
    q.add_argument("--optimizer", action="store_true", help="also export the optimizer state")
    q.add_argument("--force", action="store_true",
                   help="hf-gpt2: replace OUT even if it is a folder that is not an earlier export")
    args = p.parse_args(argv)
    try:
        return {"ls": cmd_ls, "info": cmd_info, "verify": cmd_verify, "export": cmd_export}[args.cmd](args)
    except CheckpointError as e:
        print(f"hpcdp ckpt {args.cmd}: error: {e}", file=sys.stderr)
        return USAGE


__all__ = ["main"]
