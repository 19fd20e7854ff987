"""A checkpoint whose index or stored config was altered (its checksums and the
COMMITTED marker recomputed, as anyone who can write the folder can) is refused in one
line before anything is allocated: ``ckpt info`` / ``export`` exit 2, ``ckpt verify``
prints FAILED and exits 1, ``sample`` exits 2. Every allocation a reader makes is
bounded by what the files hold (hpcdp.io.format.index.check_sizes); a model built from
a stored config is checked against the stored weights and the node's memory before its
buffer exists. Each command runs as a real process under an address-space limit of
3 GiB, so a regression fails fast instead of allocating what the index says.
Wall time: about 10 s on 2 loaded cores.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcdp.io.format.checksum import sha256_file
from hpcdp.io.format.commit import marker_text
from hpcdp.io.format.index import read_index, write_index
from hpcdp.io.format.names import INDEX_FILE, MARKER_FILE
from hpcdp.launch import THREAD_ENV

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from test_ckpt_format import _save_as, _state  # noqa: E402

EARLIER = "use an earlier checkpoint"
LIMIT = 3 << 30  # bytes of address space per command: far below any lie below


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _hpcdp(cwd, *args):
    return subprocess.run([sys.executable, "-m", "hpcdp.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, timeout=300,
                          preexec_fn=_limit)


def alter(ckpt: Path, *, shapes=None, sizes=None, config=None) -> None:
    """Rewrite ``ckpt``'s index with other tensor shapes (``{name: shape}``), piece sizes
    (``{name: size}``, the tensor's first piece) or config text, valid checksums and a
    matching COMMITTED marker: the checkpoint is internally consistent, and lies."""
    ix = read_index(ckpt)
    expected = {n: (tuple((shapes or {}).get(n, s)), d) for n, s, d in zip(ix.tensors, ix.shapes, ix.dtypes)}
    pieces = ix.pieces.copy()
    for name, size in (sizes or {}).items():
        pieces[np.flatnonzero(pieces[:, 0] == ix.tensors.index(name))[0], 3] = size
    attrs = {k: v for k, v in ix.attrs.items() if k not in ("format", "format_version", "kind")}
    if config is not None:
        attrs["config"] = config
    (ckpt / INDEX_FILE).unlink()
    write_index(ckpt, attrs, expected, pieces, ix.files, ix.state, ix.arrays)
    (ckpt / MARKER_FILE).write_text(marker_text(ix.step, sha256_file(ckpt / INDEX_FILE)))


def _one_line(proc, *words):
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(err) == 1, proc.stderr[-3000:]
    for w in words:
        assert w in err[0], (w, err[0])
    return err[0]


@pytest.mark.parametrize("lie", ["shape", "shape-and-piece"])
def test_an_altered_index_is_refused_before_any_allocation(tmp_path, lie):
    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 7, flat, opt, 2)
    if lie == "shape":  # 4 TiB of float32 that no piece holds
        alter(ckpt, shapes={"param/p0": (1 << 20, 1 << 20)})
        words = ("index.h5", "param/p0", "(1048576, 1048576)", EARLIER)
    else:  # 8 GiB, and the piece says so too: only the file's real size tells
        alter(ckpt, shapes={"param/p1": (1 << 31,)}, sizes={"param/p1": 1 << 31})
        words = ("index.h5", "rank-00001.h5", "bytes on disk", EARLIER)
    for cmd in (["ckpt", "info", str(ckpt)], ["ckpt", "export", str(ckpt), "w.npz"]):
        proc = _hpcdp(tmp_path, *cmd)
        assert proc.returncode == 2, (cmd, proc.stderr[-3000:])
        _one_line(proc, *words)
        assert not (tmp_path / "w.npz").exists()
    proc = _hpcdp(tmp_path, "ckpt", "verify", str(ckpt))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0] == f"FAILED {ckpt}:" and all(w in out[1] for w in words), proc.stdout


GPT = """
[run]
out_dir = "run"
eval_every = 0
[model]
kind = "gpt"
vocab_size = 12
block_size = 8
n_layer = 1
n_head = 2
n_embd = 8
[data]
kind = "synthetic_sequence"
n_samples = 40
vocab_size = 12
seq_len = 8
[train]
steps = 1
epochs = 0
global_batch = 8
[sample]
length = 4
[checkpoint]
dir = "ck"
"""


def test_sample_refuses_a_stored_config_larger_than_the_stored_weights(tmp_path):
    (tmp_path / "job.toml").write_text(GPT)
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "train", "--config", "job.toml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = tmp_path / "ck" / "step-00000001"
    config = read_index(ckpt).attrs["config"]
    assert "n_embd = 8\n" in config
    alter(ckpt, config=config.replace("n_embd = 8\n", "n_embd = 32768\n"))  # ~52 GB of float32
    proc = _hpcdp(tmp_path, "sample", "--resume", str(ckpt))
    assert proc.returncode == 2, proc.stderr[-3000:]
    _one_line(proc, str(ckpt), "stored config", "weights", EARLIER)
    assert proc.stdout == ""
