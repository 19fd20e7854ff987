"""``hpcdp sample``: generate from the weights of a checkpoint, in one process.

    hpcdp sample --resume DIR|latest [--config FILE] [--prompt TEXT] [--length N]
                 [--temperature T] [--top-k K] [--seed S] [--device cpu|cuda]
                 [--set section.key=value ...] [--out FILE]

The model is rebuilt from the config stored in the checkpoint and its weights are
read whatever wrote them (any rank count; ddp, ps, ZeRO 1-3; either layout):
hpcdp.io.restore.weights. Generation is hpcdp.generate's, with the checkpoint's
``[sample]`` settings as defaults, so with the same settings it prints what the
training run would have sampled from those weights.

- A GPT trained on a token corpus (``data.kind = "tokens"``): the prompt is text,
  encoded with the corpus's tokenizer (read from ``data.path``; if the corpus has
  moved, ``--set data.path=...``); the output is text.
- A GPT trained on other sequences (e.g. ``synthetic_sequence``): no tokenizer; the
  prompt is token ids (``--prompt 0,3,1``; default ``0``) and the output is the ids.

``--resume latest`` takes the newest complete checkpoint of ``checkpoint.dir``
(from ``--config`` or ``--set``). Errors (exit status 2): no complete checkpoint
there, a model that cannot generate (e.g. the digits MLP), a damaged checkpoint.
The text goes to stdout (and, exactly, to ``--out``); one line about what was
loaded goes to stderr.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcdp sample", description=__doc__.split("\n\n")[0])
    p.add_argument("--resume", required=True, metavar="DIR|latest",
                   help="a step-* checkpoint, a folder of them (its newest complete one), a run "
                        "directory, or 'latest' (the newest in checkpoint.dir)")
    p.add_argument("--config", help="TOML config whose checkpoint.dir 'latest' searches")
    p.add_argument("--prompt", help="start text (token ids for a model without a tokenizer, e.g. 0,3,1); "
                   "default: the checkpoint's sample.prompt")
    p.add_argument("--length", type=int, help="tokens to generate (default: the checkpoint's sample.length)")
    p.add_argument("--temperature", type=float, help="0: greedy (default: the checkpoint's sample.temperature)")
    p.add_argument("--top-k", type=int, help="draw among the k most likely tokens; 0: all")
    p.add_argument("--seed", type=int, help="seed of the draws (default: the checkpoint's sample.seed)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to run the model (default cpu)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of the checkpoint's config (e.g. data.path=\"corpus.h5\")")
    p.add_argument("--out", help="also write the generated text to this file, exactly")
    return p


def _sample_sets(args) -> list[str]:
    """The sample flags as overrides of [sample], validated there (one set of rules)."""
    import json

    sets = []
    for key, value in (("length", args.length), ("temperature", args.temperature),
                       ("top_k", args.top_k), ("seed", args.seed)):
        if value is not None:
            sets.append(f"sample.{key}={value}")
    if args.prompt is not None:
        sets.append(f"sample.prompt={json.dumps(args.prompt)}")  # a TOML basic string
    return sets


def _ids(text: str) -> list[int]:
    parts = text.replace(",", " ").split() or ["0"]
    try:
        ids = [int(x) for x in parts]
    except ValueError:
        ids = []
    if not ids:
        raise ValueError(f"--prompt {text!r}: this model has no tokenizer (its data.kind is not \"tokens\"): "
                         "give the prompt as token ids, e.g. --prompt 0,3,1")
    return ids


def generate_from(cfg, model) -> str:
    """The sample of ``cfg.sample`` from ``model``: text with a corpus's tokenizer,
    else the token ids separated by spaces."""
    from hpcdp.generate import generate, sample_text

    s = cfg.sample
    if s.length == 0:
        raise ValueError("sample.length is 0 in the checkpoint's config: pass --length N")
    if cfg.data.kind == "tokens":
        from pathlib import Path

        from hpcdp.data.corpus import open_corpus

        if not Path(cfg.data.path).is_file():
            raise ValueError(f"data.path: the checkpoint's corpus {cfg.data.path!r} (its tokenizer) is not there "
                             "(moved, or a relative path from another folder?): pass where it is now with "
                             "--set data.path=\"PATH/corpus.h5\"")
        f, tokenizer = open_corpus(cfg.data.path)
        f.close()
        if tokenizer.vocab_size > cfg.model.vocab_size:
            raise ValueError(f"data.path: {cfg.data.path} has a vocabulary of {tokenizer.vocab_size}, the "
                             f"checkpoint's model {cfg.model.vocab_size}: it is not the corpus it was trained on")
        return sample_text(model, tokenizer, s.prompt, s.length, temperature=s.temperature,
                           top_k=s.top_k, seed=s.seed)
    ids = _ids(s.prompt)
    if max(ids) >= cfg.model.vocab_size or min(ids) < 0:
        raise ValueError(f"--prompt: token ids must be in [0, {cfg.model.vocab_size}) (model.vocab_size)")
    out = generate(model, ids, s.length, temperature=s.temperature, top_k=s.top_k, seed=s.seed)
    return " ".join(str(int(i)) for i in out)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from hpcdp.launch import launched_rank

    rank, size = launched_rank()
    if rank > 0:  # under mpiexec: one process generates (rank 0), the others print nothing
        return 0
    if size > 1:
        print(f"hpcdp sample: runs in one process; launched on {size} ranks, rank 0 generates alone "
              "(no mpiexec needed)", file=sys.stderr, flush=True)
    from hpcdp.config import load_config
    from hpcdp.io.restore.weights import model_from_checkpoint

    sets = list(args.set) + _sample_sets(args)
    root = None
    if args.resume == "latest":
        root = load_config(args.config, args.set).checkpoint.dir or None
    path, cfg, model = model_from_checkpoint(args.resume, sets, latest_root=root, device=args.device,
                                             kinds=("gpt",))
    text = generate_from(cfg, model)
    s = cfg.sample
    print(f"hpcdp sample: {path} ({model.flat.numel:,} parameters), {s.length} tokens, temperature "
          f"{s.temperature:g}, top_k {s.top_k}, seed {s.seed}", file=sys.stderr, flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0


__all__ = ["main", "generate_from"]
