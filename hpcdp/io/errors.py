"""The one error type of hpcdp.io (no h5py import, so callers can catch it cheaply),
and how it reaches every rank (:data:`AGREEMENT`)."""

from __future__ import annotations

from contextlib import contextmanager

from hpcdp.failure.agreement import Agreement

EARLIER = "use an earlier checkpoint"


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or must not be loaded. The message names
    the checkpoint, the file and the tensor, and what to do. A ValueError, so the
    ``hpcdp`` command prints it as one error line (exit status 2)."""


class SaveFailed(CheckpointError):
    """A save that failed while the run went on (a full disk, the file-size limit, a
    folder made read-only): a failure of the run, exit status 1, not bad input."""

    exit_status = 1


def os_error_text(e: BaseException) -> str:
    """One phrase for an error of a write: what happened, which file, what to do."""
    import errno
    import resource

    name = getattr(e, "filename", None)
    where = f" ({name})" if name else ""
    code = getattr(e, "errno", None)
    if code == errno.EFBIG or "file too large" in str(e).lower():
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
        return (f"a file reached this process's file-size limit (ulimit -f: {limit}){where}; raise the "
                "limit (ulimit -f unlimited in the job script) or spread the checkpoint over more files "
                "(more ranks)")
    if code == errno.ENOSPC:
        return f"the disk is full{where}; free space or choose another checkpoint.dir"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write there ({e.strerror}){where}; choose a checkpoint.dir this job can write"
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return f"{text}{where}"


# Every phase of a save or restore ends with this agreement (hpcdp.failure.agreement):
# if any rank failed, every rank raises the same CheckpointError, the lowest failing
# rank's message "... (reported by rank r)", agreed on the checkpoint's own
# communicator (a background save's agreements run in its thread, polling gently).
AGREEMENT = Agreement(CheckpointError, lowest=True, private=False)


@contextmanager
def damaged_file(where: str):
    """Reading HDF5 structures inside: any error h5py raises for damaged metadata
    (HDF5's own checksums, a broken B-tree or heap: ``OSError``, ``KeyError``,
    ``RuntimeError``, ``ValueError``, ``TypeError``, ``IndexError``...) becomes one
    :class:`CheckpointError` that names ``where`` (checkpoint, file, object) and says
    what to do, the same kind of line as a SHA-256 mismatch of the data."""
    try:
        yield
    except CheckpointError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError, AttributeError,
            OverflowError, MemoryError) as e:
        text = str(e).strip("'\"") or type(e).__name__
        raise CheckpointError(f"{where}: HDF5 metadata is damaged ({text}): the file is corrupt; "
                              f"{EARLIER}") from None


__all__ = ["CheckpointError", "SaveFailed", "os_error_text", "damaged_file", "EARLIER", "AGREEMENT"]
