"""hpcdp.launch: the one home of the launch helpers, and its one behaviour when no
mpiexec is found (one error line, exit status 2) in every tool that launches jobs."""

from __future__ import annotations

import sys

import pytest

from hpcdp import cli
from hpcdp.launch import (THREAD_ENV, ChildFailed, LaunchError, child_env, find_mpiexec, parse_ranks,
                          run_child, train_command)


@pytest.fixture
def no_mpiexec(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # nothing next to it
    monkeypatch.setenv("PATH", str(tmp_path))


def test_find_mpiexec_names_the_command_and_the_fix(no_mpiexec):
    with pytest.raises(LaunchError, match=r"hpcdp scale: no mpiexec found .*pip install 'hpcdp\[mpi\]'"):
        find_mpiexec("hpcdp scale")


@pytest.mark.parametrize("argv", [["bench", "startup", "--ranks", "1", "--repeats", "1", "--warmup", "0"],
                                  ["check-exact", "--ranks", "1", "--steps", "1", "--set", "train.exact_micro_batch=16"]])
def test_every_tool_says_one_line_and_exits_2_without_mpiexec(no_mpiexec, tmp_path, capsys, argv):
    extra = ["--out", str(tmp_path / "out")] if argv[0] == "check-exact" else ["--json", str(tmp_path / "s.json")]
    assert cli.main(argv + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpcdp: error: ") and "no mpiexec found" in err[0], err


def test_parse_ranks_keeps_order_and_refuses_bad_lists():
    assert parse_ranks("3,1,3") == [3, 1]
    for bad in ("", "0,2", "two", "1,x"):
        with pytest.raises(LaunchError, match="--ranks"):
            parse_ranks(bad)


def test_child_env_one_thread_per_rank_this_hpcdp_first_and_cleared_vars(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    env = child_env({"X": "1"}, clear=("OPENBLAS_CORETYPE",))
    assert all(env[k] == v for k, v in THREAD_ENV.items()) and env["X"] == "1"
    assert "OPENBLAS_CORETYPE" not in env and env["PYTHONUNBUFFERED"] == "1"
    import hpcdp
    from pathlib import Path
    assert env["PYTHONPATH"].split(":")[0] == str(Path(hpcdp.__file__).resolve().parents[1])


def test_run_child_failure_names_the_command_and_its_output():
    with pytest.raises(ChildFailed, match=r"(?s)the test: .*exit 3.*boom"):
        run_child([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], "the test", 60)
    with pytest.raises(ChildFailed, match="timed out after 0.5 s"):
        run_child([sys.executable, "-c", "import time; time.sleep(30)"], "the test", 0.5)


def test_train_command_spells_hpcdp_train():
    assert train_command("c.toml", ["a=1"], "latest")[-7:] == ["train", "--config", "c.toml", "--set", "a=1",
                                                               "--resume", "latest"]
