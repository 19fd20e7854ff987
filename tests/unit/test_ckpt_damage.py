"""Every way a checkpoint's files can be damaged gives one line, never a traceback.

Many offsets of every file kind (``COMMITTED``, ``index.h5``, a rank file) are
flipped, zeroed or cut, one damage at a time, in place (restored after each), and
``hpcdp ckpt verify``'s check (:func:`hpcdp.io.interop.inspect.verify`) must either report
the damage as lines that name the checkpoint and the file and say "use an earlier
checkpoint" (the SHA-256 mismatch's wording), or, for a byte HDF5 left unused
(free space inside its metadata blocks and heaps), leave every object, attribute
and data byte of the file as h5py reads it unchanged: nothing was damaged. A tiny
GPT's damaged checkpoint then goes through ``ckpt info``, ``sample`` and ``train
--resume``: one error line each (exit 2), naming the file. (The shared layout's
file is not swept: on Debian's parallel HDF5 1.10.8 a damaged shared.h5 made h5py
crash with a segmentation fault inside an attribute read, which no Python code
can turn into a line.)
Wall time: about 15 s on 2 loaded cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.io.interop.inspect import verify

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from test_ckpt_format import _save_as, _state  # noqa: E402

EARLIER = "use an earlier checkpoint"


def content(path) -> list:
    """Everything h5py reads from a file: every object, its attributes, its data."""
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            out.append((name, type(obj).__name__,
                        sorted((k, np.asarray(obj.attrs[k]).tobytes()) for k in obj.attrs)))
            if isinstance(obj, h5py.Dataset):
                out.append((obj.dtype.str, obj.shape, obj[()].tobytes()))
        visit("/", f)
        f.visititems(visit)
    return out


def damages(size: int, offsets: int) -> list:
    """``(how, offset, length)``: ``offsets`` flips spread over the file plus one in
    each of its last 64 bytes' quarters, zeroed 8-byte runs, and cuts."""
    spread = sorted(set(np.linspace(0, size - 1, offsets).astype(int).tolist()
                        + [size - 1 - k for k in (0, 16, 32, 48)]))
    zeros = sorted(set(np.linspace(0, size - 8, max(4, offsets // 4)).astype(int).tolist()))
    cuts = sorted({0, 1, size // 3, size // 2, size - 64, size - 1} - {size})
    return ([("flip", o, 1) for o in spread] + [("zero", o, 8) for o in zeros]
            + [("cut", c, 0) for c in cuts])


def damaged(path: Path, how: str, offset: int, length: int):
    """Apply one damage to ``path`` in place; returns the original bytes."""
    data = path.read_bytes()
    if how == "cut":
        path.write_bytes(data[:offset])
    else:
        raw = bytearray(data)
        raw[offset:offset + length] = bytes(length) if how == "zero" else bytes(b ^ 0xFF for b in
                                                                               raw[offset:offset + length])
        path.write_bytes(bytes(raw))
    return data


def sweep(ckpt: Path, name: str, offsets: int) -> dict:
    """Damage file ``name`` of ``ckpt`` at many places; assert each outcome; returns
    counts of how each was seen."""
    path = ckpt / name
    before = content(path) if name.endswith(".h5") else None
    seen = {"reported": 0, "unused byte": 0}
    for how, offset, length in damages(path.stat().st_size, offsets):
        data = damaged(path, how, offset, length)
        try:
            if data == path.read_bytes():  # zeroing zeros: not a damage
                continue
            problems, _ = verify(ckpt)  # must not raise
            what = f"{name}: {how} at byte {offset}"
            if problems:
                seen["reported"] += 1
                for line in problems:
                    assert "\n" not in line and str(ckpt) in line and EARLIER in line, (what, line)
                    assert name in line or name == "COMMITTED" and "marker" in line, (what, line)
            else:
                assert how != "cut" and before is not None, f"{what}: not reported"
                assert content(path) == before, f"{what}: not reported, yet the file reads differently"
                seen["unused byte"] += 1
        finally:
            path.write_bytes(data)
    assert verify(ckpt)[0] == []  # restored
    return seen


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    flat, opt = _state()
    return _save_as(tmp_path_factory.mktemp("damage") / "ck", 3, flat, opt, 2)


@pytest.mark.parametrize("name, offsets", [("COMMITTED", 120), ("index.h5", 24), ("rank-00001.h5", 48)])
def test_every_damage_of_every_file_kind_is_one_line_or_touches_nothing(ckpt, name, offsets):
    seen = sweep(ckpt, name, offsets)
    assert seen["reported"] >= offsets // 2, seen  # most bytes matter; the rest were shown unused


def test_the_marker_must_name_the_directorys_step(ckpt):
    marker = ckpt / "COMMITTED"
    text = marker.read_text()
    try:
        marker.write_text(text.replace("step 3", "step 4"))
        assert "says step 4, the directory step 3" in verify(ckpt)[0][0]
    finally:
        marker.write_text(text)


def test_a_missing_or_truncated_rank_file_is_named_once(ckpt, capsys):
    from hpcdp.commands.ckpt import main

    path = ckpt / "rank-00000.h5"
    data = damaged(path, "cut", 4000, 0)
    try:
        assert main(["verify", str(ckpt)]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 and lines[0].startswith("FAILED") and "rank-00000.h5 has 4000 bytes" in lines[1]
        path.unlink()
        assert main(["verify", str(ckpt)]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 and "data file rank-00000.h5 is missing" in lines[1], lines
    finally:
        path.write_bytes(data)


# -- the commands, on a real GPT's checkpoint ----------------------------------------

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
n_samples = 80
vocab_size = 12
seq_len = 8
[train]
steps = 2
epochs = 0
global_batch = 8
[sample]
length = 4
[checkpoint]
dir = "ck"
"""


def _hpcdp(cwd, *args):
    from hpcdp.launch import THREAD_ENV

    return subprocess.run([sys.executable, "-m", "hpcdp.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, timeout=300)


def _metadata_offsets(ckpt: Path, name: str, count: int) -> list:
    """``count`` offsets of ``name`` whose flip verify reports as damaged HDF5 metadata
    (object headers, B-trees, heaps: the structures h5py itself raised on) of a
    weight or of the whole file."""
    path, found = ckpt / name, []
    size = path.stat().st_size
    for offset in range(size - 1, 0, -97):  # from the end: the last-written headers
        data = damaged(path, "flip", offset, 1)
        try:
            problems, _ = verify(ckpt)
        finally:
            path.write_bytes(data)
        # a weight's header or the file's own (what info and sample read, too)
        if any("HDF5 metadata is damaged" in p and ("object /param" in p or "tensor param/" in p or f"file {name}: HDF5" in p)
               for p in problems):
            found.append(offset)
            if len(found) == count:
                return found
    raise AssertionError(f"no metadata byte found in {name}")


def test_damaged_metadata_is_one_line_in_every_command(tmp_path, capsys):
    from hpcdp.cli import main

    (tmp_path / "job.toml").write_text(GPT)
    proc = _hpcdp(tmp_path, "train", "--config", "job.toml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = tmp_path / "ck" / "step-00000002"
    path = ckpt / "rank-00000.h5"
    for offset in _metadata_offsets(ckpt, "rank-00000.h5", 2):
        data = damaged(path, "flip", offset, 1)
        try:
            assert main(["ckpt", "verify", str(ckpt)]) == 1
            out = capsys.readouterr().out.splitlines()
            assert out[0].startswith("FAILED") and "rank-00000.h5" in out[1] and EARLIER in out[1], out
            for args in (["ckpt", "info", str(ckpt)], ["sample", "--resume", str(ckpt)]):
                assert main(args) == 2, args
                cap = capsys.readouterr()
                err = cap.err.strip().splitlines()
                assert len(err) == 1 and "rank-00000.h5" in err[0] and EARLIER in err[0], (args, cap.err)
                assert "Traceback" not in cap.err and cap.out == "", args
        finally:
            path.write_bytes(data)
    data = damaged(path, "flip", offset, 1)
    shutil.rmtree(tmp_path / "run")
    proc = _hpcdp(tmp_path, "train", "--config", "job.toml", "--set", "train.steps=3", "--resume", "latest")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "rank-00000.h5" in proc.stderr and EARLIER in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    path.write_bytes(data)


def test_the_metadata_walk_in_a_child_process_turns_a_crash_into_one_line(ckpt, monkeypatch):
    """probe.py (the shared layout's readers call it first): a sound file passes, a
    damage h5py reports comes back as its line, a child that dies (here killed at its
    first object, as a segfaulting HDF5 would die) is one line naming file and object."""
    from hpcdp.io.errors import CheckpointError
    from hpcdp.io.failpoint import ENV
    from hpcdp.io.format.probe import check_in_child

    path = ckpt / "rank-00001.h5"
    where = f"checkpoint {ckpt}: file {path.name}"
    check_in_child(path, where)
    monkeypatch.setenv(ENV, "ckpt-probe@0:0")
    data = path.read_bytes()
    try:
        path.write_bytes(data + b"\0")  # another (size, mtime): probed again
        with pytest.raises(CheckpointError) as e:
            check_in_child(path, where)
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"{where}, object /: HDF5 crashed") and "SIGKILL" in line
        assert line.endswith(EARLIER)
        monkeypatch.delenv(ENV)
        path.write_bytes(data[:2000])  # cut: h5py's own error, as the child's line
        with pytest.raises(CheckpointError) as e:
            check_in_child(path, where)
        assert str(e.value).startswith(where) and EARLIER in str(e.value) and "\n" not in str(e.value)
    finally:
        path.write_bytes(data)
