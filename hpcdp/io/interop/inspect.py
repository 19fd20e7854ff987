"""Looking at checkpoints without training: verify, export, digests, summaries.

One process, no MPI: these read a checkpoint the way any rank would (index, then
pieces with their checksums) and are what ``hpcdp ckpt`` runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..format.commit import list_checkpoints, marker_problem, run_dir_hint
from ..errors import EARLIER, CheckpointError, damaged_file
from ..format.names import FORMAT_NAME, INDEX_FILE, PARAM, STEP_DIR_RE
from ..format.index import read_index
from ..format.probe import walk
from ..format.ranges import coverage_problems
from ..restore.reader import Reader


def read_tensor(reader, index, tid: int) -> np.ndarray:
    out = np.empty(index.numel(tid), dtype=np.dtype(index.dtypes[tid]))
    reader.read(tid, 0, out)
    return out.reshape(index.shapes[tid])


def verify(ckpt_dir) -> tuple[list[str], int]:
    """Every check a load makes, on every byte: ``(problems, bytes verified)``, one
    line per problem (a missing or damaged file is named once, not once per tensor
    it holds). An empty list means the checkpoint is sound."""
    ckpt_dir = Path(ckpt_dir)
    problem = marker_problem(ckpt_dir)
    if problem:
        return [f"checkpoint {ckpt_dir}: {problem}; {EARLIER}"], 0
    try:
        index = read_index(ckpt_dir)
    except CheckpointError as e:
        return [str(e)], 0
    problems = []
    for tid, name in enumerate(index.tensors):
        rows = index.pieces_of(tid)
        gap = coverage_problems(index.numel(tid), [(int(o), int(s)) for _, _, o, s in rows])
        if gap:
            problems.append(f"{ckpt_dir}: tensor {name}: {gap}")
    with Reader(ckpt_dir, index) as reader:
        bad_files = set()
        for fi in range(len(index.files)):
            problem = reader.open_file(fi) or file_header_problem(reader, fi)
            if problem:
                problems.append(problem)
                bad_files.add(fi)
        for tid, name in enumerate(index.tensors):
            if bad_files.intersection(int(fi) for fi in index.pieces_of(tid)[:, 1]):
                continue  # its file's problem is already named
            try:
                read_tensor(reader, index, tid)
            except CheckpointError as e:
                problems.append(str(e))
        return problems, reader.bytes_read


def file_header_problem(reader, fi: int) -> str | None:
    """What a load never reads but ``verify`` checks: every object and attribute of
    data file ``fi`` can be read (HDF5 checks its own metadata checksums as it
    goes) and the file's root attributes agree with the index."""
    index, h5 = reader.index, reader.h5_file(fi)
    name = index.files[fi]
    where = f"checkpoint {reader.dir}: file {name}"
    want = {"format": FORMAT_NAME, "step": index.step}
    if index.attrs.get("layout", "split") == "split":
        want.update(kind="rank", rank=fi, world_size=len(index.files))

    try:
        walk(h5, where)
        with damaged_file(where):
            found = {k: h5.attrs.get(k) for k in want}
    except CheckpointError as e:
        return str(e)
    for key, value in want.items():  # format always; the others where the writer put them
        got = found[key].decode() if isinstance(found[key], bytes) else found[key]
        if (got is None and key == "format") or (got is not None and str(got) != str(value)):
            return (f"{where}: root attribute {key} is {got!r}, the index says {value!r}: the file is damaged "
                    f"or not this checkpoint's; {EARLIER}")
    return None


def weights_sha256(ckpt_dir) -> str:
    """SHA-256 over every parameter's bytes in index order: equal for the same
    weights whatever the rank count, strategy or layout that wrote them."""
    index = read_index(ckpt_dir)
    h = hashlib.sha256()
    with Reader(ckpt_dir, index) as reader:
        for tid, name in enumerate(index.tensors):
            if name.startswith(PARAM + "/"):
                h.update(name.encode())
                h.update(np.ascontiguousarray(read_tensor(reader, index, tid)).tobytes())
    return h.hexdigest()


def export(ckpt_dir, out, *, optimizer: bool = False) -> int:
    """Write the weights (and with ``optimizer`` the optimizer state) to one plain
    file: ``.h5`` (one dataset per tensor, named as in the model) or ``.npz``.
    Returns the number of tensors written."""
    ckpt_dir, out = Path(ckpt_dir), Path(out)
    if out.suffix not in (".h5", ".hdf5", ".npz"):
        raise CheckpointError(f"export: {out} must end in .h5, .hdf5 or .npz")
    index = read_index(ckpt_dir)
    wanted = [(tid, n) for tid, n in enumerate(index.tensors) if optimizer or n.startswith(PARAM + "/")]
    # weights keep their model names; optimizer state keeps its buffer prefix
    key = (lambda n: n[len(PARAM) + 1:] if n.startswith(PARAM + "/") else n)
    with Reader(ckpt_dir, index) as reader:
        arrays = {key(n): read_tensor(reader, index, tid) for tid, n in wanted}
    if out.suffix == ".npz":
        np.savez(out, **arrays)
    else:
        from ..format.h5 import create, group_at
        from ..format.shardfile import set_attrs
        with create(out) as f:
            set_attrs(f, {"step": index.step, "source": str(ckpt_dir), "config": index.attrs.get("config", "")})
            for name, arr in arrays.items():
                parent, _, base = name.rpartition("/")
                group_at(f, parent).create_dataset(base, data=arr, track_times=False)
    return len(arrays)


def summary(ckpt_dir) -> dict:
    """Header facts of a checkpoint (complete ones: from the index)."""
    ckpt_dir = Path(ckpt_dir)
    files = [p for p in ckpt_dir.iterdir() if p.is_file()] if ckpt_dir.is_dir() else []
    out = {"path": str(ckpt_dir), "bytes": sum(p.stat().st_size for p in files),
           "problem": marker_problem(ckpt_dir)}
    if out["problem"] is None:
        index = read_index(ckpt_dir)
        out.update(step=index.step, layout=index.attrs.get("layout"), strategy=index.attrs.get("strategy"),
                   world_size=index.attrs.get("world_size"), files=len(index.files),
                   tensors=len(index.tensors))
    return out


def checkpoints_in(path) -> list[Path]:
    """The checkpoints a path names: itself, or the step-* directories in it (or in
    its ``checkpoints/``)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if STEP_DIR_RE.fullmatch(path.name) or (path / INDEX_FILE).exists():
        return [path]
    items = list_checkpoints(path) or list_checkpoints(path / "checkpoints")
    if not items:
        raise CheckpointError(f"{path}: not a checkpoint and holds no step-* checkpoints{run_dir_hint(path)}")
    return [p for _, p, _ in items]


__all__ = ["verify", "weights_sha256", "export", "summary", "checkpoints_in", "read_tensor"]
