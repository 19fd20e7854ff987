"""Walking an untrusted HDF5 file's metadata in a child process first.

HDF5 checks checksums only on some of its structures; on a damaged file a few
builds (Debian's parallel HDF5 1.10.8 under h5py) do not raise but crash the
process (SIGSEGV inside an attribute read). A crash cannot become a line in the
process it kills, so before a reader opens a file that such a build wrote (the
shared layout's one file: ``layout.probe_first``; under such a build every
file of a checkpoint, the index included: :func:`crash_prone_build`), a child process
(``python -m hpcdp.io.format.probe FILE WHERE``) opens every object and attribute of it
the way the reader and ``verify`` will, printing each object's path before it
touches it. The parent turns the child's outcome into the usual one line:

- the child's own ``CheckpointError`` (a damage h5py reported): that line;
- the child killed by a signal: ``WHERE, object PATH: HDF5 crashed reading the
  file's metadata (SIGSEGV): the file is corrupt; use an earlier checkpoint``.

A file that passed is probed once per process (keyed by path, size and mtime).
The child starts no MPI (``MPI4PY_RC_INITIALIZE=0``, no launcher variables): it
reads with HDF5's default driver. Cost: one interpreter start (h5py import), about
0.3-1 s, per shared file and process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..errors import EARLIER, CheckpointError, damaged_file

_PASSED: set = set()
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "HYDRA_", "MPIR_", "PRTE_")
_KEEP = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def walk(h5, where: str, on_object=None) -> None:
    """Open every object and read every attribute of open h5py file ``h5``; a damage
    h5py reports is a CheckpointError naming ``where`` and the object.
    ``on_object(path)`` is called before each object is touched."""
    def visit(group, path: str) -> None:  # names each object it opens (visititems would not)
        if on_object is not None:
            on_object(path or "/")
        with damaged_file(f"{where}, object {path or '/'}"):
            names = list(group)
            for key in group.attrs:
                group.attrs[key]
        for child in names:
            at = f"{path}/{child}"
            if on_object is not None:
                on_object(at)
            with damaged_file(f"{where}, object {at}"):
                obj = group[child]
                for key in obj.attrs:
                    obj.attrs[key]
                if not hasattr(obj, "keys"):  # a dataset: what a reader asks of it
                    obj.dtype, obj.shape, obj.id.get_offset()
            if hasattr(obj, "keys"):  # a group
                visit(obj, at)

    visit(h5, "")


def crash_prone_build() -> bool:
    """True where h5py is the MPI-parallel build (Debian's parallel HDF5 1.10.8 is the
    one seen crashing on damage): its readers probe every file of a checkpoint first,
    the index and split files too, not only the shared layout's."""
    import h5py

    return bool(getattr(h5py.get_config(), "mpi", False))


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k in _KEEP or not k.startswith(_LAUNCHER_PREFIXES)}
    env["MPI4PY_RC_INITIALIZE"] = "0"
    return env


def check_in_child(path, where: str, timeout: float = 300.0) -> None:
    """Raise the one-line CheckpointError if walking ``path`` fails or crashes."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _PASSED:
        return
    try:
        proc = subprocess.run([sys.executable, "-m", "hpcdp.io.format.probe", str(path), where],
                              capture_output=True, text=True, env=_child_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckpointError(f"{where}: reading its HDF5 metadata did not finish in {timeout:g} s (a "
                              f"damaged structure loops); {EARLIER}") from None
    lines = proc.stdout.splitlines()
    if proc.returncode == 0 and lines and lines[-1] == "OK":
        _PASSED.add(key)
        return
    errors = [ln[2:] for ln in lines if ln.startswith("E ")]
    if errors:
        raise CheckpointError(errors[-1])
    last = next((ln[2:] for ln in reversed(lines) if ln.startswith("O ")), None)
    if proc.returncode < 0:
        try:
            how = signal.Signals(-proc.returncode).name
        except ValueError:
            how = f"signal {-proc.returncode}"
        obj = f", object {last}" if last else ""
        raise CheckpointError(f"{where}{obj}: HDF5 crashed reading the file's metadata ({how}): the file "
                              f"is corrupt; {EARLIER}")
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise CheckpointError(f"{where}: checking the file's metadata in a helper process failed (exit "
                          f"{proc.returncode}: {tail})")


def main(argv=None) -> int:
    path, where = (argv if argv is not None else sys.argv[1:])[:2]
    import h5py

    from ..failpoint import failpoint

    def seen(obj_path):
        print(f"O {obj_path}", flush=True)
        failpoint("ckpt-probe", step=0, rank=0)  # tests: the child dies here, as on a crash

    try:
        with damaged_file(where):
            h5 = h5py.File(path, "r")
        with h5:
            walk(h5, where, on_object=seen)
    except CheckpointError as e:
        print(f"E {str(e).splitlines()[0] if str(e) else where}", flush=True)
        return 3
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
