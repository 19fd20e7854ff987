"""Atomic checkpoints on a POSIX file system: temporary name, fsync, rename, marker.

One save of step S into ``<root>``:

1. rank 0 makes ``<root>/.step-SSSSSSSS.tmp/`` (a leftover from a killed save is
   removed first); every rank writes and fsyncs its file there;
2. rank 0 writes and fsyncs ``index.h5``, fsyncs the directory, renames it to
   ``<root>/step-SSSSSSSS`` (one rename) and fsyncs ``<root>``;
3. rank 0 writes the marker ``COMMITTED`` (to a temporary name, fsync, rename): it
   holds the SHA-256 of ``index.h5``. Only then is the checkpoint complete.

A directory without a valid marker is never loaded and ``latest`` skips it, so
killing any rank at any moment leaves the previous checkpoint as the latest one.
Older checkpoints are removed (``keep``) only after the new one is complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .checksum import sha256_file
from ..errors import CheckpointError
from ..failpoint import failpoint
from .names import FORMAT_NAME, INDEX_FILE, MARKER_FILE, STEP_DIR_RE, step_dir_name
from .h5 import fsync_dir


def tmp_dir(root, step: int) -> Path:
    return Path(root) / f".{step_dir_name(step)}.tmp"


def prepare(root, step: int) -> Path:
    """Rank 0: an empty temporary directory for the save of ``step``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir(root, step)
    if tmp.exists():
        shutil.rmtree(tmp)  # a save that was killed: never committed, never read
    tmp.mkdir()
    return tmp


def marker_text(step: int, index_sha256: str) -> str:
    return f"{FORMAT_NAME} step {step}\nindex.h5 sha256 {index_sha256}\n"


def lineage_of(ckpt) -> str | None:
    """The job lineage recorded in checkpoint ``ckpt`` (attribute ``lineage`` of its
    index: the id of the job that started the training run; a ``--resume`` carries it
    on), or None (none recorded: an older hpcdp, or unreadable)."""
    import h5py
    try:
        with h5py.File(Path(ckpt) / INDEX_FILE, "r") as f:
            value = f.attrs.get("lineage")
    except (OSError, ValueError):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value) if value is not None else None


def job_of(ckpt) -> str:
    """Who wrote checkpoint ``ckpt``, for a message: its run directory, else "?"."""
    import h5py
    try:
        with h5py.File(Path(ckpt) / INDEX_FILE, "r") as f:
            value = f.attrs.get("run_dir", "?")
    except (OSError, ValueError):
        return "?"
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def foreign_problem(ckpt, lineage: str | None, doing: str) -> str | None:
    """None if a job of ``lineage`` may replace or write beside complete checkpoint
    ``ckpt``; else one line saying it belongs to another training run. A checkpoint
    that records no lineage (an older hpcdp) and a job without one (a tool) pass."""
    if lineage is None or not (Path(ckpt) / MARKER_FILE).is_file():
        return None
    theirs = lineage_of(ckpt)
    if theirs is None or theirs == lineage:
        return None
    root = Path(ckpt).parent
    return (f"checkpoint.dir = {str(root)!r}: {Path(ckpt).name} there was written by another training run "
            f"(run directory {job_of(ckpt)}), and this job {doing}; a save never replaces another run's "
            f"checkpoint: give this job its own --set checkpoint.dir=..., or continue that run with "
            f"--resume {root} (or remove its checkpoints: hpcdp ckpt ls {root})")


def commit(tmp: Path, step: int, *, lineage: str | None = None) -> Path:
    """Rank 0: make the save in ``tmp`` the checkpoint of ``step`` (steps 2 and 3).
    ``lineage``: this job's (:func:`lineage_of`); a complete checkpoint of ``step``
    of another lineage is refused (CheckpointError), never replaced."""
    tmp = Path(tmp)
    root = tmp.parent
    final = root / step_dir_name(step)
    fsync_dir(tmp)
    old = None
    problem = foreign_problem(final, lineage, f"would replace it with its step {step}") if final.exists() else None
    if problem:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(problem)
    if final.exists():  # the same step saved again by this run (a resume): replace it, the old one goes last
        old = root / f".{final.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(root)
    failpoint("ckpt-before-marker", step=step, rank=0)
    text = marker_text(step, sha256_file(final / INDEX_FILE))
    part = final / f".{MARKER_FILE}.tmp"
    with open(part, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(part, final / MARKER_FILE)
    fsync_dir(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def marker_problem(ckpt: Path) -> str | None:
    """None if ``ckpt`` has a marker that matches its index; else why not."""
    marker = Path(ckpt) / MARKER_FILE
    if not marker.is_file():
        return "it has no COMMITTED marker (the save did not finish)"
    text = marker.read_text(errors="replace")
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if (len(lines) < 2 or len(head) != 3 or head[:2] != [FORMAT_NAME, "step"] or not head[2].isdigit()
            or text != marker_text(int(head[2]), (lines[1].split() or [""])[-1])):
        return "its COMMITTED marker is damaged"
    named = STEP_DIR_RE.fullmatch(Path(ckpt).name)
    if named and int(named.group(1)) != int(head[2]):
        return f"its COMMITTED marker says step {head[2]}, the directory step {int(named.group(1))}: it is damaged"
    index = Path(ckpt) / INDEX_FILE
    if not index.is_file():
        return "index.h5 is missing"
    if sha256_file(index) != lines[1].split()[-1]:
        return "index.h5 does not match the SHA-256 in its COMMITTED marker (the index is corrupt)"
    return None


def list_checkpoints(root) -> list[tuple[int, Path, bool]]:
    """``(step, path, complete)`` of every ``step-*`` directory in ``root``, by step.
    Complete means the marker is there (its content is checked on load)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR_RE.fullmatch(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p, (p / MARKER_FILE).is_file()))
    return sorted(out)


def latest(root) -> Path | None:
    done = [p for _, p, ok in list_checkpoints(root) if ok]
    return done[-1] if done else None


def prune(root, keep: int) -> list[Path]:
    """Remove complete checkpoints older than the ``keep`` newest (0: keep all), and
    incomplete ones older than the newest complete one. Returns what was removed."""
    items = list_checkpoints(root)
    done = [(s, p) for s, p, ok in items if ok]
    if not done:
        return []
    newest = done[-1][0]
    drop = [p for s, p in done[:-keep]] if keep > 0 else []
    drop += [p for s, p, ok in items if not ok and s < newest]
    for p in drop:
        shutil.rmtree(p, ignore_errors=True)
    return drop


def run_dir_hint(path) -> str:
    """For a run directory (it holds the run's ``config.toml``) whose checkpoints were
    saved elsewhere: where its config says they went; else ""."""
    import tomllib

    config = Path(path) / "config.toml"
    try:
        section = tomllib.loads(config.read_text()).get("checkpoint", {})
        where, every = section.get("dir", ""), section.get("every", 0)
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return ""
    if not where:
        return ("" if every else " (it is a run directory whose run saved no checkpoints: its config.toml "
                "has checkpoint.every = 0 and no checkpoint.dir)")
    return (f" (it is a run directory: its config.toml saved checkpoints to checkpoint.dir = {where!r}, "
            f"relative to where that job ran: hpcdp ckpt ls {where})")


def resolve(target: str, default_root, *, if_none: str = "train without --resume, or point it at a "
            "step-* directory") -> Path:
    """The checkpoint that ``--resume target`` means (complete, or an error).

    ``latest``: the newest complete checkpoint in ``default_root`` (the run's
    ``checkpoint.dir``). A path may be a checkpoint (``.../step-00000100``), a folder
    of checkpoints, or a run directory (its ``checkpoints/``). ``if_none``: the
    advice when it holds no complete checkpoint.
    """
    if target == "latest":
        if default_root is None:
            raise CheckpointError("--resume latest: no checkpoint folder is known; set checkpoint.dir "
                                  "(the folder that holds step-* checkpoints) or pass --resume <dir>")
        root = Path(default_root)
    else:
        root = Path(target)
        if not root.exists():
            raise CheckpointError(f"--resume {target}: no such file or directory")
        if STEP_DIR_RE.fullmatch(root.name) or (root / INDEX_FILE).exists():
            problem = marker_problem(root)
            if problem:
                raise CheckpointError(f"--resume {target}: this checkpoint must not be loaded: {problem}; "
                                      f"use an earlier checkpoint (hpcdp ckpt ls {root.parent})")
            return root
        if not list_checkpoints(root) and (root / "checkpoints").is_dir():
            root = root / "checkpoints"
    items = list_checkpoints(root)
    done = [path for _, path, ok in items if ok]
    if not done:
        what = (f"{root} holds only {len(items)} incomplete checkpoint(s)" if items
                else f"{root} holds no step-* checkpoint{run_dir_hint(root)}")
        raise CheckpointError(f"--resume {target}: no complete checkpoint: {what}; {if_none}")
    problem = marker_problem(done[-1])
    if problem:
        raise CheckpointError(f"--resume {target}: the newest checkpoint {done[-1]} must not be loaded: "
                              f"{problem}; pass an earlier one (hpcdp ckpt ls {root})")
    return done[-1]


__all__ = ["tmp_dir", "prepare", "commit", "lineage_of", "foreign_problem", "marker_problem", "list_checkpoints", "latest", "prune",
           "resolve", "marker_text", "run_dir_hint"]
