"""The checkpoint format in one process: ranges, resharding N -> M, deterministic
bytes, atomic commit, corruption refused with the file and tensor named, and the
``hpcdp ckpt`` commands. Several writing ranks are emulated by writing one rank
file per rank (the multi-rank paths are in tests/mpi/test_ckpt_*.py)."""

from __future__ import annotations

import os
import time

import h5py
import numpy as np
import pytest

from hpcdp.io.format.commit import latest, list_checkpoints, prepare, prune, resolve
from hpcdp.io.errors import CheckpointError
from hpcdp.io.format.names import INDEX_FILE, MARKER_FILE, rank_file_name
from hpcdp.io.format.index import read_index
from hpcdp.io.restore.load import load
from hpcdp.io.protocol import Piece, ShardedCheckpoint, replicated_pieces
from hpcdp.io.format.ranges import Span, coverage_problems, intersect, split_by_layout
from hpcdp.io.format.runstate import expected_tensors
from hpcdp.io.save.save import SaveJob, _finish
from hpcdp.io.format.shardfile import write_rank_file
from hpcdp.io.save.snapshot import take_snapshot
from hpcdp.nn.params import FlatParams
from hpcdp.optim import AdamW, SGD
from hpcdp.ownership import owned_ranges
from hpcdp.shard import shard_range


# -- pure range arithmetic ---------------------------------------------------------

def test_intersect_closed_form():
    assert intersect([(0, 10)], [(3, 4)]) == [Span(3, 4)]
    assert intersect([(0, 3), (3, 3), (6, 4)], [(2, 5)]) == [Span(2, 1), Span(3, 3), Span(6, 1)]
    assert intersect([(0, 5)], [(5, 5)]) == []          # touching is not overlapping
    assert intersect([(0, 5)], [(2, 0)]) == []          # empty ranges never overlap
    assert intersect([(4, 4), (0, 4)], [(0, 8)]) == [Span(0, 4), Span(4, 4)]  # any input order
    # every N -> M pairing of the shard rule: overlaps tile the buffer exactly once
    for n in range(1, 6):
        for m in range(1, 6):
            a = [shard_range(17, n, r) for r in range(n)]
            b = [shard_range(17, m, r) for r in range(m)]
            assert coverage_problems(17, intersect(a, b)) is None


def test_split_by_layout_cuts_at_parameter_boundaries():
    flat = FlatParams.from_arrays([("a", np.zeros((2, 3))), ("b", np.zeros(4)), ("c", np.zeros(5))])
    assert split_by_layout(flat.layout, 4, 8) == [("a", Span(4, 2), 0), ("b", Span(0, 4), 2),
                                                  ("c", Span(0, 2), 6)]
    assert split_by_layout(flat.layout, 0, 0) == []


def test_coverage_problems_name_the_gap_or_overlap():
    assert coverage_problems(10, [(0, 4), (4, 6)]) is None
    assert "[4, 5)" in coverage_problems(10, [(0, 4), (5, 5)])
    assert "two pieces" in coverage_problems(10, [(0, 5), (4, 6)])
    assert "[8, 10)" in coverage_problems(10, [(0, 8)])


# -- a model + AdamW state, written as N ranks would ---------------------------------

def _state(shapes=((5, 7), (7,), (7, 3)), dtype="float32", seed=0, opt="adamw"):
    rng = np.random.default_rng(seed)
    flat = FlatParams.from_arrays([(f"p{i}", rng.standard_normal(s)) for i, s in enumerate(shapes)], dtype=dtype)
    o = AdamW(lr=0.1, dtype=dtype) if opt == "adamw" else SGD(lr=0.1, momentum=0.9, dtype=dtype)
    o.ensure_size(flat.numel)
    for arr in o.state_arrays().values():
        arr[...] = rng.standard_normal(flat.numel)
    o.steps = 4
    return flat, o


def _save_as(root, step, flat, opt, n, layout_attrs=None, arrays=None):
    """Write a checkpoint as ``n`` replicated ranks would (rank r: shard_range r of n);
    ``arrays``: extra /state datasets."""
    tmp = prepare(root, step)
    files = [rank_file_name(r) for r in range(n)]
    for r in range(n):
        snap = take_snapshot(replicated_pieces(flat, opt, r, n), flat.layout, copy=False)
        write_rank_file(tmp / files[r], snap, {"rank": r, "world_size": n}, step=step, rank=r)
    job = SaveJob(root, step, None, expected_tensors(flat, opt), {"world_size": n, "strategy": "ddp"},
                  {"step": step, "optimizer_kind": opt.kind, "optimizer_steps": opt.steps},
                  {"rank_optimizer_steps": np.full(n, opt.steps, np.int64), **(arrays or {})})
    return _finish(job, tmp, files)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_written_by_n_restored_by_m_exactly(tmp_path, n, m):
    flat, opt = _state(seed=n)
    ckpt = _save_as(tmp_path / "ck", 7, flat, opt, n)
    for r in range(m):
        off, size = shard_range(flat.numel, m, r)
        targets = [Piece("param", off, np.empty(size, np.float32)),
                   Piece("optim/m", off, np.empty(size, np.float32)),
                   Piece("optim/v", off, np.empty(size, np.float32))]
        load(ckpt, targets, flat.layout, expected_tensors(flat, opt), "adamw", None)
        assert np.array_equal(targets[0].array, flat.data[off:off + size])
        for t in targets[1:]:
            assert np.array_equal(t.array, opt.state[t.buffer.split("/")[1]][off:off + size])


def test_a_rank_reads_only_the_blocks_of_its_range(tmp_path):
    """8 Mi float32 elements = 8 checksum blocks of 4 MiB; rank r of 8 reads about 1/8."""
    flat = FlatParams.from_arrays([("big", np.arange(8 << 20, dtype=np.float32))])
    opt = SGD(lr=0.1)  # no state: only the weights
    ckpt = _save_as(tmp_path / "ck", 1, flat, opt, 2)
    from hpcdp.io.restore.load import fill_targets
    index = read_index(ckpt)
    for r in range(8):
        off, size = shard_range(flat.numel, 8, r)
        out = np.empty(size, np.float32)
        got = fill_targets(ckpt, index, [Piece("param", off, out)], flat.layout)
        assert np.array_equal(out, flat.data[off:off + size])
        assert got <= 2 * out.nbytes  # the blocks touched, never the whole 32 MiB
    assert flat.nbytes == 32 << 20


def test_same_state_saved_twice_gives_identical_bytes(tmp_path):
    flat, opt = _state()
    a = _save_as(tmp_path / "a", 3, flat, opt, 3)
    time.sleep(1.1)  # a timestamp would now differ
    b = _save_as(tmp_path / "b", 3, flat, opt, 3)
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b)) == sorted([INDEX_FILE, MARKER_FILE] + [rank_file_name(r) for r in range(3)])
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


# -- atomic commit -------------------------------------------------------------------

def test_latest_skips_a_checkpoint_without_marker_and_resolve_refuses_it(tmp_path):
    flat, opt = _state()
    root = tmp_path / "ck"
    _save_as(root, 1, flat, opt, 2)
    two = _save_as(root, 2, flat, opt, 2)
    (two / MARKER_FILE).unlink()              # as if the save was killed before the marker
    prepare(root, 3)                          # and a save killed while writing
    assert [s for s, _, ok in list_checkpoints(root) if ok] == [1]
    assert latest(root).name == "step-00000001"
    assert resolve("latest", root).name == "step-00000001"
    assert resolve(str(root), None).name == "step-00000001"
    with pytest.raises(CheckpointError, match="no COMMITTED marker"):
        resolve(str(two), None)
    with pytest.raises(CheckpointError, match="checkpoint.dir"):
        resolve("latest", None)


def test_a_marker_that_does_not_match_the_index_is_refused(tmp_path):
    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 1, flat, opt, 1)
    with h5py.File(ckpt / INDEX_FILE, "r+") as f:
        f.attrs["step"] = 99
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        resolve(str(ckpt), None)


def test_prune_keeps_the_newest(tmp_path):
    flat, opt = _state()
    root = tmp_path / "ck"
    for s in (1, 2, 3, 4):
        _save_as(root, s, flat, opt, 1)
    prune(root, 2)
    assert [s for s, _, _ in list_checkpoints(root)] == [3, 4]


# -- corruption: refused, naming file and tensor ----------------------------------------

def _restore_all(ckpt, flat, opt):
    targets = [Piece("param", 0, np.empty(flat.numel, flat.dtype))]
    targets += [Piece(f"optim/{k}", 0, np.empty(flat.numel, flat.dtype)) for k in opt.names]
    load(ckpt, targets, flat.layout, expected_tensors(flat, opt), opt.kind, None)


def _piece_offset(path, dataset):
    with h5py.File(path, "r") as f:
        return f[dataset].id.get_offset()


def test_a_flipped_byte_is_refused_naming_file_and_tensor(tmp_path):
    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 1, flat, opt, 2)
    path = ckpt / "rank-00001.h5"
    with h5py.File(path, "r") as f:
        name = sorted(k for k in f["optim/v"])[0]          # a parameter's group
        piece = sorted(k for k in f[f"optim/v/{name}"])[0]  # its piece in this file
        ds = f[f"optim/v/{name}/{piece}"]
        dataset, where = ds.name, ds.id.get_offset() + 5
    raw = bytearray(path.read_bytes())
    raw[where] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as e:
        _restore_all(ckpt, flat, opt)
    assert "rank-00001.h5" in str(e.value) and dataset.rpartition("/")[0].lstrip("/") in str(e.value)
    assert "XXH3-128 checksum mismatch" in str(e.value)


# A format-1 checkpoint (SHA-256 data blocks), written by the hpcdp of 2026-12-01 before
# the switch to XXH3-128: _save_as(root, 4, *_state(seed=3), 2), 30 KB, kept as it was.
FORMAT1 = os.path.join(os.path.dirname(__file__), "data", "ckpt-format1", "step-00000004")


def test_new_checkpoints_carry_xxh3_and_say_format_2(tmp_path):
    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 1, flat, opt, 1)
    with h5py.File(ckpt / "rank-00000.h5", "r") as f:
        assert int(f.attrs["format_version"]) == 2
        ds = f[f"param/p0/0"]
        assert "sha256" not in ds.attrs and ds.attrs["xxh3_128"].shape == (1, 16)
        import xxhash
        assert ds.attrs["xxh3_128"][0].tobytes() == xxhash.xxh3_128_digest(ds[()].tobytes())


def test_a_format_1_checkpoint_restores_and_its_damage_is_refused(tmp_path):
    import shutil
    flat, opt = _state(seed=3)
    ckpt = tmp_path / "step-00000004"
    shutil.copytree(FORMAT1, ckpt)
    with h5py.File(ckpt / "rank-00001.h5", "r") as f:
        assert int(f.attrs["format_version"]) == 1 and "sha256" in f["param/p0/" + sorted(f["param/p0"])[0]].attrs
    for m in (1, 2, 3):  # any rank count reads it, bit for bit
        for r in range(m):
            off, size = shard_range(flat.numel, m, r)
            targets = [Piece("param", off, np.empty(size, np.float32))]
            targets += [Piece(f"optim/{k}", off, np.empty(size, np.float32)) for k in opt.names]
            load(ckpt, targets, flat.layout, expected_tensors(flat, opt), "adamw", None)
            assert np.array_equal(targets[0].array, flat.data[off:off + size])
            for t in targets[1:]:
                assert np.array_equal(t.array, opt.state[t.buffer.split("/")[1]][off:off + size])
    path = ckpt / "rank-00001.h5"
    with h5py.File(path, "r") as f:
        where = f["optim/v/p2/" + sorted(f["optim/v/p2"])[0]].id.get_offset() + 2
    raw = bytearray(path.read_bytes())
    raw[where] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"rank-00001.h5, tensor optim/v/p2 .*SHA-256 checksum mismatch"):
        _restore_all(ckpt, flat, opt)


def test_a_truncated_or_missing_file_is_refused(tmp_path):
    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 1, flat, opt, 3)
    path = ckpt / "rank-00002.h5"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    with pytest.raises(CheckpointError, match=r"rank-00002.h5 has \d+ bytes, the index says \d+: the file is truncated"):
        _restore_all(ckpt, flat, opt)
    path.unlink()
    with pytest.raises(CheckpointError, match="data file rank-00002.h5 is missing"):
        _restore_all(ckpt, flat, opt)


def test_another_model_optimizer_or_dtype_is_refused(tmp_path):
    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 1, flat, opt, 2)
    other, o2 = _state(shapes=((5, 7), (7,), (7, 4)))
    with pytest.raises(CheckpointError, match=r"param/p2 has shape \(7, 3\) in the checkpoint, \(7, 4\)"):
        _restore_all(ckpt, other, o2)
    fewer, o3 = _state(shapes=((5, 7), (7,)))
    with pytest.raises(CheckpointError, match="param/p2 is in the checkpoint but not in this model"):
        _restore_all(ckpt, fewer, o3)
    same, sgd = _state(opt="sgd")
    with pytest.raises(CheckpointError, match="optim.kind"):
        _restore_all(ckpt, same, sgd)
    wide, o4 = _state(dtype="float64")
    with pytest.raises(CheckpointError, match='float32 in the checkpoint, float64 in this run: set run.dtype'):
        _restore_all(ckpt, wide, o4)


def test_a_piece_of_the_wrong_dtype_or_length_is_refused(tmp_path):
    """Rewrite one piece as float64 (and make index and marker agree with the new
    file sizes, as a tool that rewrote the file would): the reader still refuses."""
    from hpcdp.io.format.commit import commit, tmp_dir
    from hpcdp.io.format.index import write_index

    flat, opt = _state()
    root = tmp_path / "ck"
    ckpt = _save_as(root, 1, flat, opt, 1)
    path = ckpt / "rank-00000.h5"
    with h5py.File(path, "r+") as f:
        ds = f["param/p1/0"]
        attrs, data = dict(ds.attrs), ds[()]
        del f["param/p1/0"]
        new = f.create_dataset("param/p1/0", data=data.astype(np.float64))
        for k, v in attrs.items():
            new.attrs[k] = v
    index = read_index(ckpt)
    os.rename(ckpt, tmp_dir(root, 1))
    tmp = tmp_dir(root, 1)
    (tmp / MARKER_FILE).unlink()
    expected = {t: (s, d) for t, s, d in zip(index.tensors, index.shapes, index.dtypes)}
    write_index(tmp, {k: v for k, v in index.attrs.items() if k not in ("format", "format_version", "kind")},
                expected, index.pieces, index.files, index.state, index.arrays)
    ckpt = commit(tmp, 1)
    with pytest.raises(CheckpointError, match=r"tensor param/p1 .*float64 \(7,\), the index says float32"):
        _restore_all(ckpt, flat, opt)


# -- hpcdp ckpt ----------------------------------------------------------------------

def test_ckpt_verify_exit_codes_and_export(tmp_path, capsys):
    from hpcdp.commands.ckpt import main

    flat, opt = _state()
    root = tmp_path / "ck"
    _save_as(root, 1, flat, opt, 2)
    bad = _save_as(root, 2, flat, opt, 2)
    assert main(["verify", str(root)]) == 0
    assert main(["ls", str(root)]) == 0
    assert "complete" in capsys.readouterr().out
    assert main(["export", str(bad), str(tmp_path / "w.npz")]) == 0
    w = np.load(tmp_path / "w.npz")
    assert sorted(w.files) == ["p0", "p1", "p2"] and w["p0"].shape == (5, 7)
    assert np.array_equal(w["p2"].reshape(-1), flat.data[flat.spec("p2").offset:])
    assert main(["export", str(bad), str(tmp_path / "w.h5"), "--optimizer"]) == 0
    with h5py.File(tmp_path / "w.h5") as f:
        assert np.array_equal(f["p1"][()], w["p1"]) and f["optim/m/p0"].shape == (5, 7)
    off = _piece_offset(bad / "rank-00000.h5", "param/p0/0")
    raw = bytearray((bad / "rank-00000.h5").read_bytes())
    raw[off] ^= 1
    (bad / "rank-00000.h5").write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert "OK     " in out and "FAILED" in out and "rank-00000.h5, tensor param/p0" in out
    assert main(["verify", str(tmp_path / "nothing-here")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["verify", str(tmp_path / "empty")]) == 2


def test_a_checkpoint_with_the_old_dropout_counters_still_loads(tmp_path, capsys):
    """Checkpoints written before the keyed dropout streams hold /state/random_streams
    (the old dropout's per-layer draw counters): read and ignored."""
    from hpcdp.commands.ckpt import main

    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 4, flat, opt, 2, arrays={"random_streams": np.array([12], np.int64)})
    assert "random_streams" in read_index(ckpt).arrays
    target = Piece("param", 0, np.empty(flat.numel, np.float32))
    load(ckpt, [target], flat.layout, expected_tensors(flat, opt), "adamw", None)
    assert np.array_equal(target.array, flat.data)
    assert main(["info", str(ckpt)]) == 0
    assert "dropout keyed by (seed, step, sample, layer)" in capsys.readouterr().out
    # new checkpoints do not write it
    assert "random_streams" not in read_index(_save_as(tmp_path / "new", 4, flat, opt, 2)).arrays


# -- ZeRO-style shards (owned_ranges), emulated: the protocol's ShardedCheckpoint ----------

class _FakeZero(ShardedCheckpoint):
    """Holds what ZeRO stage ``stage`` rank ``rank`` of ``size`` holds: the optimizer
    state of its owned ranges concatenated, and at stage 3 its parameter shard."""

    def __init__(self, flat, full_opt, stage, groups, rank, size):
        self.stage, self.groups, self.dp_rank, self.dp_size = stage, groups, rank, size
        self.flat = FlatParams.from_arrays([(s.name, np.zeros(s.shape)) for s in flat.layout],
                                           dtype=flat.dtype)
        ranges = owned_ranges("optim", stage, groups, size, rank)
        self.optimizer = AdamW(lr=0.1, dtype=flat.dtype.name)
        self.optimizer.ensure_size(sum(s for _, s in ranges))
        if full_opt is not None:  # the writing side holds the real state
            self.flat.data[...] = full_opt["param"]
            for name in ("m", "v"):
                self.optimizer.state[name][...] = np.concatenate(
                    [full_opt[name][o:o + s] for o, s in ranges]) if ranges else []
        pr = owned_ranges("params", stage, groups, size, rank)
        self._shard = np.concatenate([self.flat.data[o:o + s] for o, s in pr]) if pr else np.zeros(0, flat.dtype)

    def owned_ranges(self, kind):
        return owned_ranges(kind, self.stage, self.groups, self.dp_size, self.dp_rank)

    def param_shard(self):
        return self._shard


def _save_pieces_as(root, step, flat, opt, per_rank_pieces):
    tmp = prepare(root, step)
    files = [rank_file_name(r) for r in range(len(per_rank_pieces))]
    for r, pieces in enumerate(per_rank_pieces):
        snap = take_snapshot(pieces, flat.layout, copy=False)
        write_rank_file(tmp / files[r], snap, {"rank": r}, step=step, rank=r)
    job = SaveJob(root, step, None, expected_tensors(flat, opt), {}, {"step": step}, {})
    return _finish(job, tmp, files)


@pytest.mark.parametrize("n,stage_a,m,stage_b", [(3, 1, 2, 3), (2, 3, 4, 1), (4, 3, 3, 3), (1, 2, 3, 3)])
def test_zero_shards_written_by_n_restored_by_m(tmp_path, n, stage_a, m, stage_b):
    flat, opt = _state(shapes=((6, 5), (5,), (5, 9), (9,)))
    full = {"param": np.array(flat.data), "m": opt.state["m"], "v": opt.state["v"]}
    groups = [(0, 30), (30, 5), (35, 45), (80, 9)]  # units/buckets: every rank owns a piece of each
    writers = [_FakeZero(flat, full, stage_a, groups, r, n) for r in range(n)]
    if stage_a == 3:  # at stage 3 the replica buffer is not what is written: blank it
        for w in writers:
            w.flat.data[...] = np.nan
    ckpt = _save_pieces_as(tmp_path / "ck", 5, flat, opt, [w.checkpoint_pieces() for w in writers])
    for r in range(m):
        z = _FakeZero(flat, None, stage_b, groups, r, m)
        load(ckpt, z.checkpoint_targets(), flat.layout, expected_tensors(flat, opt), "adamw", None)
        for p in z.checkpoint_targets():
            buf = "param" if p.buffer == "param" else p.buffer.split("/")[1]
            assert np.array_equal(p.array, full[buf][p.offset:p.offset + p.size]), (p.buffer, p.offset)
