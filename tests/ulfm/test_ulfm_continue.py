"""failure.on_rank_loss = "continue" under Open MPI 5's ULFM (`mpirun --with-ft ulfm`, the
venv of tests/ulfm/setup_venv_ulfm.sh): a DDP job on 3 ranks whose rank 2 is killed with
SIGKILL in the middle of step 5 (its gradient allreduce in flight, HPCDP_FAULT) goes on
to the end on the 2 survivors: one repair line, the repair in metrics.jsonl, every step
logged once, the same loss curve as a job that lost nothing (the same global batch),
replicas checked equal (the repair's hash and DDP's check_every=1), status 0."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root
STEPS = 12
SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=30", f"train.steps={STEPS}",
        "run.log_every=1", "run.eval_every=0", "parallel.strategy=ddp", "parallel.ddp.check_every=1",
        "comm.timeout=30"]


def _run(tmp_path, name, sets, ranks=3, **env):
    mpirun = VENV / "bin" / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_all.sh does)")
    out = tmp_path / name
    argv = [str(mpirun), "--with-ft", "ulfm", "--oversubscribe", "-n", str(ranks),
            str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train"]
    for s in sets + [f'run.out_dir="{out}"']:
        argv += ["--set", s]
    full = {**{k: v for k, v in os.environ.items() if k != "HPCDP_FAULT"}, "PYTHONPATH": str(ROOT),
            "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **env}
    proc = subprocess.run(argv, cwd=tmp_path, env=full, capture_output=True, text=True, timeout=240)
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()] \
        if (out / "metrics.jsonl").exists() else []
    return proc, proc.stdout + proc.stderr, records


def test_a_killed_rank_is_repaired_around_and_training_goes_on(tmp_path):
    proc, out, recs = _run(tmp_path, "kill", SETS + ['failure.on_rank_loss="continue"'],
                           HPCDP_FAULT="2:5:kill")
    assert proc.returncode == 0, out[-6000:]
    assert "injected fault (HPCDP_FAULT: kill on rank 2 at step 5)" in out, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("repair:")]
    assert len(lines) == 1, out[-6000:]
    # the killed rank's watcher names it, and says the job goes on (no error line)
    assert not [ln for ln in out.splitlines() if ln.startswith("hpcdp: error:")], out[-6000:]
    assert "hpcdp: rank 2 of 3 lost at step 5: its process was killed by SIGKILL" in out and \
        'the other ranks repair the job and go on (failure.on_rank_loss = "continue")' in out, out[-6000:]
    # Step 5's gradient may have completed on the survivors before the kill was seen (rank 2's
    # part was on its way): then its update is committed (found by the replica check after
    # it) and step 6 is next; else step 5 is redone.
    m = re.match(r"repair: rank 2 lost at step 5; 3 -> 2 ranks; last committed step ([45]), redoing step (\d+) "
                 r"with the same global batch; detected in [\d.]+s, repaired in [\d.]+s; replicas equal", lines[0])
    assert m and int(m.group(2)) == int(m.group(1)) + 1, lines[0]
    committed = int(m.group(1))
    repairs = [r["repair"] for r in recs if "repair" in r]
    assert len(repairs) == 1 and repairs[0]["lost_ranks"] == [2] and repairs[0]["committed_step"] == committed
    assert (repairs[0]["world_before"], repairs[0]["world_after"]) == (3, 2)
    steps = [r for r in recs if "step" in r and "loss" in r]
    # every step once (a step committed during the failure has no metrics record: its gather failed)
    expected = [s for s in range(1, STEPS + 1) if s != 5 or committed == 4]
    assert [r["step"] for r in steps] == expected, [r["step"] for r in steps]
    assert all(r["global_batch"] == 30 for r in steps)  # the same global batch after the repair
    # the same training: a job that lost nothing has the same loss curve (float sums in
    # another order on 2 ranks: equal to rounding)
    proc0, out0, recs0 = _run(tmp_path, "whole", SETS + ['failure.on_rank_loss="continue"'])
    assert proc0.returncode == 0, out0[-6000:]
    base = {r["step"]: r["loss"] for r in recs0 if "step" in r and "loss" in r}
    assert not [ln for ln in out0.splitlines() if ln.startswith("repair:")]
    for r in steps:
        assert r["loss"] == pytest.approx(base[r["step"]], rel=1e-5, abs=1e-6), (r["step"], r["loss"], base[r["step"]])


def test_fewer_ranks_than_min_world_end_the_job_with_one_line(tmp_path):
    """6 ranks, failure.min_world = 6, rank 2 killed: the 5 survivors end the job as with
    "stop": one line (rank 0's), a non-zero status, every rank gone. Under `mpirun
    --with-ft ulfm` an MPI_Abort ends only the rank that calls it, so they end together
    (before, each survivor printed the line, up to 10 s late; 3 ranks did not show it)."""
    from ulfm_launch import left_running

    proc, out, _ = _run(tmp_path, "min", SETS + ['failure.on_rank_loss="continue"', "failure.min_world=6"],
                        ranks=6, HPCDP_FAULT="2:5:kill")
    # every rank has ended with mpirun (the bound is for the process table to catch up)
    assert not left_running(str(tmp_path / "min"), within=5), left_running(str(tmp_path / "min"))
    assert proc.returncode not in (0, None), out[-6000:]
    said = [ln for ln in out.splitlines() if ln.startswith("hpcdp: error:")]
    # the step the survivors agreed on, though some may have seen the loss in step 6
    assert said == ["hpcdp: error: rank 0 of 6 at step 5: rank 2 lost at step 5: 5 rank(s) left, below "
                    "failure.min_world = 6; the job ends"], out[-6000:]
    assert "Traceback" not in out and "MPI_ABORT" not in out, out[-6000:]
    assert not [ln for ln in out.splitlines() if ln.startswith("repair:")]


@pytest.mark.parametrize("fault, says", [
    ("1:5:raise", r"hpcdp: error: rank 1 of 3 at step 5: RuntimeError: injected fault \(HPCDP_FAULT: raise on "
                  r"rank 1 at step 5\)$"),
    # rank 1's gradient is NaN before DDP reduces it: every rank that sees the non-finite
    # gradient fails (a rank that the first one's revoke reaches before its allreduce
    # completes does not); the lowest of them says it
    ("1:5:nan", r"hpcdp: error: rank ([012]) of 3 at step 5: non-finite gradient norm \(nan\) at step 5 on "
                r"rank \1; "),
])
def test_a_failure_that_is_not_a_lost_rank_ends_every_rank_with_one_line(tmp_path, fault, says):
    """Continue mode repairs around a lost rank only. A bug on one rank (or a non-finite
    gradient on all) ends the job as with "stop": one line (the failing rank's), a
    non-zero status, no repair, every rank gone. Under `mpirun --with-ft ulfm` an
    MPI_Abort ends only its caller, so before the failing rank aborted alone: the others
    repaired around it as if it were lost and went on (status 0), or each printed its
    own line (hpcdp.failure.ulfm.Ending)."""
    from ulfm_launch import left_running

    proc, out, recs = _run(tmp_path, "end", SETS + ['failure.on_rank_loss="continue"'], HPCDP_FAULT=fault)
    assert not left_running(str(tmp_path / "end"), within=5), left_running(str(tmp_path / "end"))
    assert proc.returncode == 1, out[-6000:]
    said = [ln for ln in out.splitlines() if ln.startswith("hpcdp: error:")]
    assert len(said) == 1 and re.match(says, said[0]), out[-6000:]
    assert not [ln for ln in out.splitlines() if ln.startswith("repair:")], out[-6000:]
    assert "MPI_ABORT" not in out, out[-6000:]
    assert out.count("Traceback") == (1 if fault.endswith("raise") else 0), out[-6000:]  # the bug's, once
    assert not [r for r in recs if "repair" in r]
    assert max(r["step"] for r in recs if "step" in r and "loss" in r) == 4  # the job stopped at step 5


def test_a_second_rank_lost_during_the_repair_is_repaired_around_too(tmp_path):
    """4 ranks: rank 3 killed in step 5, then rank 2 killed in the middle of the repair
    (after the survivors' first agreement, HPCDP_FAULT kill-in-repair). The round fails on
    every survivor (their agreement after it), they repair again on the 2 left and go on:
    one repair line naming both ranks, 2 rounds in the record, every step logged once,
    status 0, no process left. Before, the MPI error of the repair ended each survivor
    with its own line."""
    from ulfm_launch import left_running

    proc, out, recs = _run(tmp_path, "twice", SETS + ['failure.on_rank_loss="continue"'], ranks=4,
                           HPCDP_FAULT="3:5:kill,2:0:kill-in-repair")
    assert proc.returncode == 0, out[-6000:]
    assert "injected fault (HPCDP_FAULT: kill-in-repair on rank 2)" in out, out[-6000:]
    assert not [ln for ln in out.splitlines() if ln.startswith("hpcdp: error:")], out[-6000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("repair:")]
    assert len(lines) == 1 and lines[0].startswith("repair: ranks 2-3 lost at step 5; 4 -> 2 ranks; "), out[-6000:]
    repairs = [r["repair"] for r in recs if "repair" in r]
    assert len(repairs) == 1 and repairs[0]["lost_ranks"] == [2, 3] and repairs[0]["rounds"] == 2, repairs
    committed = repairs[0]["committed_step"]
    steps = [r["step"] for r in recs if "step" in r and "loss" in r]
    assert steps == [s for s in range(1, STEPS + 1) if s != 5 or committed == 4], steps
    assert not left_running(str(tmp_path / "twice"), within=5)
