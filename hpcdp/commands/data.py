"""``hpcdp data``: make and inspect token corpora.

    hpcdp data prepare --text FILE_OR_DIR [...] --out corpus.h5 [--glob '*.py'] [--exclude NAME]
                       [--tokenizer byte|char|tokenizer.json] [--val-fraction 0.1] [--seed 0]
    hpcdp data prepare --python-stdlib --out pysource.h5     the standard library's .py files
    hpcdp data train-tokenizer --text FILE_OR_DIR [...] --vocab-size V --out tokenizer.json
                       [--glob '*.py'] [--exclude NAME] [--min-frequency 2]   a byte-level BPE
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
    p.add_argument("--tokenizer", default="byte", metavar="byte|char|FILE.json",
                   help="byte: 256 byte values (default, any file); char: the corpus's characters (UTF-8); "
                   "a Hugging Face tokenizer.json (hpcdp[tokenizer]; hpcdp data train-tokenizer makes one)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of tokens held out for validation (whole files while they fit, then the end of one)")
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
    print(f"wrote {s['out']}: {s['files']} file(s)"
          + (f" ({s['empty_files']} empty one(s) left out: no tokens)" if s["empty_files"] else "")
          + f", {s['tokenizer']} tokenizer, vocabulary {s['vocab_size']}, "
          f"{s['train_tokens']:,} train / {s['val_tokens']:,} val tokens "
          f"({100 * s['val_tokens'] / max(s['train_tokens'] + s['val_tokens'], 1):.1f}% val"
          + (", one file cut between the splits" if s["cut_files"] else "") + f") in {s['seconds']:.1f} s\n"
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


def _train_tokenizer(argv) -> int:
    from hpcdp.data.bpe import train_bpe
    from hpcdp.data.prepare import collect_files

    p = argparse.ArgumentParser(prog="hpcdp data train-tokenizer",
                                description="Train a byte-level BPE tokenizer.json on text files (offline).")
    p.add_argument("--text", nargs="+", required=True, metavar="PATH", help="text files and/or folders (walked)")
    p.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary (>= 257)")
    p.add_argument("--out", required=True, help="the tokenizer.json to write")
    p.add_argument("--glob", default="*", help="file name pattern inside folders (default '*')")
    p.add_argument("--exclude", action="append", default=[], metavar="NAME",
                   help="skip files and folders matching this name pattern (repeatable)")
    p.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen this often")
    args = p.parse_args(argv)
    files = collect_files(args.text, args.glob, args.exclude)

    def texts():
        for path, name in files:
            try:
                yield path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"--text: {name} is not UTF-8 ({e}); leave it out with --exclude") from None

    tok = train_bpe(texts(), args.vocab_size, args.out, min_frequency=args.min_frequency)
    print(f"wrote {args.out}: byte-level BPE, vocabulary {tok.vocab_size}, trained on {len(files)} file(s)\n"
          f"use it: hpcdp data prepare --text ... --tokenizer {args.out} --out corpus.h5", flush=True)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"prepare": _prepare, "info": _info, "train-tokenizer": _train_tokenizer}
    if not argv or argv[0] not in commands:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])
