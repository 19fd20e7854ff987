"""[checkpoint] options: validation with the key named, and the clear error when
layout = "shared" meets an h5py without MPI."""

from __future__ import annotations

import h5py
import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import load_config


def test_checkpoint_options_are_validated_by_key():
    c = load_config(None, ["checkpoint.every=10", "checkpoint.keep=3"]).checkpoint
    assert c.enabled and (c.every, c.keep, c.layout, c.asynchronous) == (10, 3, "split", False)
    assert not load_config(None, []).checkpoint.enabled
    assert load_config(None, ['checkpoint.dir="x"']).checkpoint.enabled
    with pytest.raises(ConfigError, match=r"checkpoint.every: -1 is out of range"):
        load_config(None, ["checkpoint.every=-1"])
    with pytest.raises(ConfigError, match=r"checkpoint.layout: 'one' is not allowed; choose one of 'split', 'shared'"):
        load_config(None, ['checkpoint.layout="one"'])
    with pytest.raises(ConfigError, match=r"checkpoint.async: unknown key"):
        load_config(None, ["checkpoint.async=true"])


def test_shared_layout_needs_h5py_with_mpi():
    from hpcdp.io.errors import CheckpointError
    from hpcdp.io.format.shared import check_available

    if h5py.get_config().mpi:
        check_available()  # the parallel-HDF5 venv: nothing to say
    else:
        with pytest.raises(CheckpointError, match=r"needs h5py built with MPI .*bash .ci/parallel-hdf5.sh.*"
                                                  r"checkpoint.layout = \"split\""):
            check_available()


def test_bench_ckpt_refuses_a_stall_study_without_saves(capsys):
    """--stall-steps not above --every used to end in 'no median for empty data'."""
    import pytest

    from hpcdp.bench.ckpt import main

    with pytest.raises(SystemExit) as e:
        main(["--stall-steps", "8", "--every", "10"])
    assert e.value.code == 2
    assert "--stall-steps 8 must exceed --every 10" in capsys.readouterr().err


def test_bench_ckpt_refuses_an_unknown_writer_path(capsys):
    import pytest

    from hpcdp.bench.ckpt import main

    with pytest.raises(SystemExit) as e:
        main(["--io", "direct,mmap", "--no-stall"])
    assert e.value.code == 2
    assert "unknown --io or --stall-modes value 'mmap'" in capsys.readouterr().err


def test_checkpoint_writer_is_a_process_or_a_thread():
    import pytest

    from hpcdp.config import CheckpointConfig, ConfigError

    assert CheckpointConfig().writer == "process"
    assert CheckpointConfig(writer="thread").writer == "thread"
    with pytest.raises(ConfigError, match="writer"):
        CheckpointConfig(writer="fork")
