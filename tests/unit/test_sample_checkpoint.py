"""``hpcdp sample --resume``: a tiny GPT trained by a real 2-rank ``mpiexec`` job
saves a checkpoint; one process samples from it. The text equals what the training
run sampled from its final weights (ddp and ZeRO 1-3, dropout on), and the ids equal
``hpcdp.generate`` on the weights of ``hpcdp ckpt export``. Bad input: exit 2 with
one line saying what to fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
GPT = """
[run]
seed = 4
out_dir = "run"
eval_every = 0
[model]
kind = "gpt"
vocab_size = 256
block_size = 16
n_layer = 1
n_head = 2
n_embd = 16
dropout = 0.1
[data]
kind = "tokens"
path = "corpus.h5"
eval_windows = 4
[train]
steps = 4
epochs = 0
global_batch = 4
[optim]
kind = "adamw"
lr = 0.01
[sample]
length = 30
prompt = "def "
temperature = 0.8
seed = 7
[checkpoint]
dir = "ck"
"""
STRATEGIES = {"ddp": ['parallel.strategy="ddp"'],
              **{f"zero{k}": ['parallel.strategy="zero"', f"parallel.zero.stage={k}"] for k in (1, 2, 3)}}


def _env():
    return {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}


def _hpcdp(cwd, *args, ranks=1):
    cmd = [sys.executable, "-m", "hpcdp.cli", *args]
    if ranks > 1:
        cmd = [find_mpiexec(), "-n", str(ranks)] + cmd
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _train(cwd, ranks, *sets):
    args = ["train", "--config", "job.toml"]
    for s in sets:
        args += ["--set", s]
    proc = _hpcdp(cwd, *args, ranks=ranks)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A byte corpus of hpcdp's own checkpoint code (~100 k tokens)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.h5"
    proc = _hpcdp(path.parent, "data", "prepare", "--text", str(ROOT / "hpcdp" / "io"), "--glob", "*.py",
                  "--out", str(path))
    assert proc.returncode == 0, proc.stderr
    return path


def _job(tmp_path, corpus, text=GPT) -> Path:
    shutil.copy(corpus, tmp_path / "corpus.h5")
    (tmp_path / "job.toml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_sample_from_a_checkpoint_equals_the_runs_own_sample(tmp_path, corpus, strategy):
    cwd = _job(tmp_path, corpus)
    _train(cwd, 2, *STRATEGIES[strategy])
    ran = (cwd / "run" / "sample.txt").read_text(encoding="utf-8")
    assert ran.startswith("def ") and len(ran.encode()) >= 30  # 30 byte tokens after the prompt
    proc = _hpcdp(cwd, "sample", "--resume", "ck", "--out", "s.txt")
    assert proc.returncode == 0, proc.stderr
    assert (cwd / "s.txt").read_text(encoding="utf-8") == ran  # same weights, same draws, 1 process
    assert proc.stdout.startswith(ran) and "ck/step-00000004" in proc.stderr


SYNTHETIC = """
[run]
seed = 2
out_dir = "run"
eval_every = 0
[model]
kind = "gpt"
vocab_size = 11
block_size = 8
n_layer = 2
n_head = 2
n_embd = 8
dropout = 0.2
[data]
kind = "synthetic_sequence"
vocab_size = 11
seq_len = 8
n_samples = 128
[train]
steps = 3
epochs = 0
global_batch = 8
[optim]
kind = "adamw"
lr = 0.02
[checkpoint]
dir = "ck"
"""


def test_sample_equals_generate_on_the_exported_weights(tmp_path):
    from hpcdp.config import load_config
    from hpcdp.generate import generate
    from hpcdp.nn import build_model

    (tmp_path / "job.toml").write_text(SYNTHETIC)
    _train(tmp_path, 2, *STRATEGIES["zero3"])
    proc = _hpcdp(tmp_path, "sample", "--resume", "latest", "--config", "job.toml", "--prompt", "3,1,4",
                  "--length", "20", "--temperature", "1.0", "--top-k", "5", "--seed", "11")
    assert proc.returncode == 0, proc.stderr
    got = [int(x) for x in proc.stdout.split()]
    exp = _hpcdp(tmp_path, "ckpt", "export", "ck/step-00000003", "w.npz")
    assert exp.returncode == 0, exp.stderr
    cfg = load_config(tmp_path / "job.toml")
    model = build_model(cfg.model, dtype=cfg.run.dtype, seed=99)  # another init: overwritten below
    with np.load(tmp_path / "w.npz") as w:
        assert sorted(w.files) == sorted(s.name for s in model.flat.layout)
        for s in model.flat.layout:
            model.flat.data[s.offset:s.offset + s.size] = w[s.name].reshape(-1)
    want = generate(model, [3, 1, 4], 20, temperature=1.0, top_k=5, seed=11).tolist()
    assert got == want and len(got) == 23 and max(got) < 11
    # another seed, other draws (the flags reach generate)
    other = _hpcdp(tmp_path, "sample", "--resume", "ck", "--prompt", "3,1,4", "--length", "20", "--seed", "12")
    assert other.returncode == 0 and other.stdout.split()[:3] == ["3", "1", "4"] and other.stdout != proc.stdout
    # under mpiexec: one process generates, the text is printed once, and a line says so
    two = _hpcdp(tmp_path, "sample", "--resume", "latest", "--config", "job.toml", "--prompt", "3,1,4",
                 "--length", "20", "--temperature", "1.0", "--top-k", "5", "--seed", "11", ranks=2)
    assert two.returncode == 0 and two.stdout == proc.stdout, two.stdout + two.stderr
    assert "hpcdp sample: runs in one process; launched on 2 ranks, rank 0 generates alone" in two.stderr


def test_bad_input_is_one_clear_error(tmp_path, corpus):
    # a model that cannot generate: the MLP
    mlp = ["train", "--set", 'data.kind="synthetic_classification"', "--set", "data.n_samples=64", "--set", "train.global_batch=8",
           "--set", "model.sizes=[32, 8, 8]", "--set", "train.steps=1", "--set", "train.epochs=0",
           "--set", 'checkpoint.dir="mlp"', "--set", 'run.out_dir="mrun"', "--set", "run.eval_every=0"]
    assert _hpcdp(tmp_path, *mlp).returncode == 0
    proc = _hpcdp(tmp_path, "sample", "--resume", "mlp")
    assert proc.returncode == 2 and "model.kind = 'mlp'" in proc.stderr and "GPT" in proc.stderr
    # no complete checkpoint: a folder with none, one without its COMMITTED marker, a missing path
    (tmp_path / "gpt").mkdir()
    cwd = _job(tmp_path / "gpt", corpus)
    _train(cwd, 1, "train.steps=2")
    (cwd / "empty").mkdir()
    proc = _hpcdp(cwd, "sample", "--resume", "empty")
    assert proc.returncode == 2 and "no complete checkpoint: empty holds no step-* checkpoint" in proc.stderr
    shutil.copytree(cwd / "ck", cwd / "half")
    (cwd / "half" / "step-00000002" / "COMMITTED").unlink()
    proc = _hpcdp(cwd, "sample", "--resume", "half")
    assert proc.returncode == 2 and "half holds only 1 incomplete checkpoint(s)" in proc.stderr
    proc = _hpcdp(cwd, "sample", "--resume", "half/step-00000002")
    assert proc.returncode == 2 and "must not be loaded" in proc.stderr
    assert "no such file" in _hpcdp(cwd, "sample", "--resume", "nowhere").stderr
    proc = _hpcdp(cwd, "sample", "--resume", "latest")
    assert proc.returncode == 2 and "set checkpoint.dir" in proc.stderr
    # the corpus (its tokenizer) is gone: name data.path
    (cwd / "corpus.h5").rename(cwd / "moved.h5")
    proc = _hpcdp(cwd, "sample", "--resume", "ck")
    assert proc.returncode == 2 and "--set data.path=" in proc.stderr and "corpus.h5" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _hpcdp(cwd, "sample", "--resume", "ck", "--set", 'data.path="moved.h5"').returncode == 0
    # sample flags are checked as [sample] keys
    proc = _hpcdp(cwd, "sample", "--resume", "ck", "--set", 'data.path="moved.h5"', "--length", "-1")
    assert proc.returncode == 2 and "sample.length" in proc.stderr
    assert all(line.startswith("hpcdp: error:") for line in proc.stderr.splitlines())
