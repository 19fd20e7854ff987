"""The files of a model folder (``model.init_from``), read as a hostile folder could
make them.

A folder someone else wrote decides which files hpcdp opens: the shard names of
``model.safetensors.index.json``, and links. So:

- every file read is inside the folder: a name from the index must be relative, with
  no ``..`` part; and the file's real path (links resolved) must stay inside the
  folder's real path. A link *within* the folder (``model.safetensors`` ->
  ``blobs/abc``) is allowed, it reads nothing else. One layout links outside and is
  allowed: the Hugging Face hub cache, whose ``models--X/snapshots/<rev>/`` files
  link into the same ``models--X/blobs/``;
- every file read is a regular file, checked on the open file itself: opened with
  ``O_NONBLOCK`` (opening a FIFO then returns at once instead of waiting for a
  writer, a device is not read) and ``fstat`` must say S_ISREG before a byte is
  read. A safetensors file is then opened through that descriptor
  (``/proc/self/fd/N``), so what was checked is what is read.

Each refusal is one :class:`CheckpointError` naming the file and what to do.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath

from ..errors import CheckpointError

WHAT = "model.init_from"
HUB_SNAPSHOTS, HUB_BLOBS = "snapshots", "blobs"  # the hub cache: models--X/snapshots/<rev> -> models--X/blobs


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path, mode: int) -> CheckpointError:
    return CheckpointError(f"{WHAT}: {path} is {_kind(mode)}, not a regular file: a model's files must be "
                           "regular files (reading a FIFO or device would block the job or read without "
                           "end); put the file itself there")


def open_regular(path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file: opened
    without blocking (a FIFO returns at once), then checked with ``fstat``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise CheckpointError(f"{WHAT}: {path}: cannot open it ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode)
    return fd


def read_regular(path) -> bytes:
    """All bytes of the regular file ``path`` (see :func:`open_regular`)."""
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"{WHAT}: {path}: cannot read it ({e.strerror})") from None
    finally:
        os.close(fd)


def read_json(path):
    """The JSON value of the regular file ``path``; a file that is not JSON: one line."""
    data = read_regular(path)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{WHAT}: {path}: cannot read it as JSON ({e})") from None


def open_safetensors(path):
    """``safetensors.safe_open`` of the regular file ``path``, through the checked
    descriptor; a file that is not safetensors: one line naming it."""
    from safetensors import safe_open

    fd = open_regular(path)
    try:
        by_fd = next((f"{d}/{fd}" for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), str(path))
        return safe_open(by_fd, framework="numpy")
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: one line
        raise CheckpointError(f"{WHAT}: {path}: not a readable safetensors file ({e})") from None
    finally:
        os.close(fd)  # safe_open opened and mapped the file itself


def _roots(folder: Path) -> list[Path]:
    """The real folders the files of ``folder`` may be in."""
    real = folder.resolve()
    roots = [real]
    parent = Path(os.path.abspath(folder)).parent
    if parent.name == HUB_SNAPSHOTS and parent.parent.name.startswith("models--"):
        roots.append((parent.parent / HUB_BLOBS).resolve())
    return roots


def inside(folder: Path, name, what: str) -> Path:
    """``folder / name`` where ``name`` (from a file of the folder: ``what`` says which
    and where) is a relative path that stays inside ``folder``, links resolved."""
    folder = Path(folder)
    if not isinstance(name, str) or not name or "\x00" in name:
        raise CheckpointError(f"{WHAT}: {folder}: {what} is {json.dumps(name)}, not a file name: the file is "
                              "damaged; use another copy of the model")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or os.path.isabs(name):
        raise CheckpointError(f"{WHAT}: {folder}: {what} is {name!r}, a file outside the folder: a model's "
                              "files must be inside its folder (a damaged or hostile index); use another "
                              "copy of the model")
    path = folder / name
    real = path.resolve()
    if not any(real == r or r in real.parents for r in _roots(folder)):
        raise CheckpointError(f"{WHAT}: {path} is a link to {real}, outside the folder: a model's files must "
                              "be inside its folder; copy the file into the folder")
    return path


def check_file(folder: Path, name: str) -> Path | None:
    """``folder / name`` when it exists (inside the folder, see :func:`inside`), else
    None; a FIFO, device or folder of that name is refused."""
    path = inside(folder, name, name)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{WHAT}: {path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode)
    return path


__all__ = ["open_regular", "read_regular", "read_json", "open_safetensors", "inside", "check_file",
           "not_regular"]
