"""``hpcdp data``: make and inspect token corpora.

    hpcdp data prepare --text FILE_OR_DIR [...] --out corpus.h5 [--glob '*.py'] [--exclude NAME]
                       [--tokenizer byte|char] [--val-fraction 0.1] [--seed 0]
    hpcdp data prepare --python-stdlib --out pysource.h5     the standard library's .py files
    hpcdp data info corpus.h5
"""

from __future__ import annotations

import argparse
import sys

from hpcdp.data import DataError


def _prepare(argv) -> int:
    from hpcdp.data.prepare import collect_files, prepare_corpus, stdlib_dir

    p = argparse.ArgumentParser(prog="hpcdp data prepare",
                                description="Tokenize text files into an HDF5 corpus for data.kind = 'tokens'.")
    p.add_argument("--text", nargs="+", default=[], metavar="PATH", help="text files and/or folders (walked)")
    p.add_argument("--python-stdlib", action="store_true",
                   help="add the Python standard library's folder (with --glob '*.py', site-packages excluded)")
    p.add_argument("--out", required=True, help="the corpus file to write (.h5)")
    p.add_argument("--glob", default=None, help="file name pattern inside folders (default '*', "
                   "'*.py' with --python-stdlib)")
    p.add_argument("--exclude", action="append", default=[], metavar="NAME",
                   help="skip files and folders matching this name pattern (repeatable); names starting "
                   "with '.' are always skipped")
    p.add_argument("--tokenizer", default="byte", choices=("byte", "char"),
                   help="byte: 256 byte values (default, any file); char: the corpus's characters (UTF-8)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of tokens held out for validation")
    p.add_argument("--seed", type=int, default=0, help="seed of the file split")
    args = p.parse_args(argv)
    texts, pattern, exclude = list(args.text), args.glob, list(args.exclude)
    if args.python_stdlib:
        texts.append(str(stdlib_dir()))
        pattern = pattern or "*.py"
        exclude += ["site-packages", "dist-packages", "__pycache__"]
    if not texts:
        raise DataError("hpcdp data prepare: give --text FILE_OR_DIR ... or --python-stdlib")
    files = collect_files(texts, pattern or "*", exclude)
    print(f"{len(files)} file(s) from {', '.join(texts)}", flush=True)
    s = prepare_corpus(files, args.out, args.tokenizer, args.val_fraction, args.seed,
                       log=lambda line: print(line, flush=True))
    print(f"wrote {s['out']}: {s['tokenizer']} tokenizer, vocabulary {s['vocab_size']}, "
          f"{s['train_tokens']:,} train / {s['val_tokens']:,} val tokens in {s['seconds']:.1f} s\n"
          f"train on it: hpcdp train --set data.kind=tokens --set data.path={s['out']} "
          f"--set model.kind=gpt --set model.vocab_size={s['vocab_size']} ...", flush=True)
    return 0


def _info(argv) -> int:
    from pathlib import Path

    from hpcdp.data.corpus import open_corpus

    p = argparse.ArgumentParser(prog="hpcdp data info", description="Describe a token corpus.")
    p.add_argument("corpus")
    args = p.parse_args(argv)
    path = Path(args.corpus)
    if not path.is_file():
        raise DataError(f"hpcdp data info: file not found: {args.corpus!r}")
    f, tok = open_corpus(path)
    with f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else getattr(v, "item", lambda: v)())
                 for k, v in f.attrs.items()}
        print(f"{path}: " + ", ".join(f"{k} = {v!r}" for k, v in sorted(attrs.items())))
        for split in ("train", "val"):
            t = f[f"{split}/tokens"]
            names = f[f"{split}/doc_names"]
            head = tok.decode(t[:min(len(t), 60)]) if len(t) else ""
            print(f"{split}: {len(t):,} tokens ({t.dtype}), {len(names)} file(s); starts with {head!r}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"prepare": _prepare, "info": _info}
    if not argv or argv[0] not in commands:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])
