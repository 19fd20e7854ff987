"""Helpers of the model export/import tests (tests/unit/test_interop.py and the
transformers group, tests/hf): a tiny GPT job on a small corpus, run as the user
runs it (``python -m hpcdp.cli`` in a subprocess, ``mpiexec`` for several ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "hpcdp" / "io"  # ~100 kB of text every checkout has

GPT = """
[run]
seed = 4
out_dir = "{out}"
eval_every = 0
dtype = "{dtype}"
[model]
kind = "gpt"
vocab_size = {vocab}
block_size = 16
n_layer = 2
n_head = 2
n_embd = 16
tied_head = {tied}
gelu = "{gelu}"
[data]
kind = "tokens"
path = "{corpus}"
eval_windows = 4
[train]
steps = {steps}
epochs = 0
global_batch = 4
[optim]
kind = "adamw"
lr = 0.01
[sample]
length = 20
prompt = "def "
[checkpoint]
dir = "{ckpt}"
"""


def job_text(*, out="run", dtype="float32", vocab=256, tied=True, gelu="tanh", corpus="corpus.h5", steps=2,
             ckpt="ck") -> str:
    return GPT.format(out=out, dtype=dtype, vocab=vocab, tied=str(tied).lower(), gelu=gelu, corpus=corpus,
                      steps=steps, ckpt=ckpt)


def hpcdp(cwd, *args, ranks: int = 1, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hpcdp.cli", *map(str, args)]
    if ranks > 1:
        cmd = [find_mpiexec(), "-n", str(ranks)] + cmd
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def byte_corpus(folder: Path) -> Path:
    out = folder / "corpus.h5"
    ok(hpcdp(folder, "data", "prepare", "--text", SOURCES, "--glob", "*.py", "--out", out))
    return out
