"""failure.on_rank_loss = "continue" with hybrid ZeRO (parallel.zero.shard = "node") under
Open MPI 5's ULFM: 3 emulated nodes x 2 ranks on one host (HPCDP_RANKS_PER_NODE=2: ranks
0-1, 2-3, 4-5), rank 3 killed with SIGKILL in the middle of step 5. Its node is lost as
a whole: rank 2 (alive, holding only a part of node 1's copy) leaves with one line and
status 0, nodes 0 and 2 (each holds every shard) repair and train to the end: one repair
line, the repair in metrics.jsonl, every step logged once, the shard replicas across
nodes equal bit for bit (the repair's hash check), the same loss curve as a job that
lost nothing, no process of the job left; at stage 3 and at stage 2 (whose full parameters
are all-gathered again from the shards after the repair; in exact mode, so its final
weights' SHA-256 equals that of the job that lost nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ulfm_launch import left_running, run_job

STEPS = 12
SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=30", f"train.steps={STEPS}",
        "run.log_every=1", "run.eval_every=0", "parallel.strategy=zero", 'parallel.zero.shard="node"',
        "comm.timeout=30", 'failure.on_rank_loss="continue"']
NODES = {"HPCDP_RANKS_PER_NODE": "2"}


def _killed_node_run(tmp_path, stage, *sets):
    name = f"kill{stage}"
    sha, recs, text, out = run_job(tmp_path, name, 6, SETS + [f"parallel.zero.stage={stage}", *sets], ft=True,
                                   steps=STEPS, HPCDP_FAULT="3:5:kill", **NODES)
    assert not left_running(str(out), within=5), left_running(str(out))
    lines = text.splitlines()
    assert "hpcdp: injected fault (HPCDP_FAULT: kill on rank 3 at step 5)" in lines, text[-4000:]
    assert not [ln for ln in lines if ln.startswith("hpcdp: error:")], text[-6000:]
    left = [ln for ln in lines if " leaves at step" in ln]
    assert left == ["hpcdp: rank 2 leaves at step 5: rank 3 of its node (node 1) lost; the other nodes hold "
                    'the same shards and go on without this node (failure.on_rank_loss = "continue"); ending '
                    "this rank with status 0"], text[-6000:]
    repairs = [ln for ln in lines if ln.startswith("repair:")]
    assert len(repairs) == 1, text[-6000:]
    # step 5's reduction may have completed on the survivors before the kill was seen: then
    # its update is committed and step 6 is next; else step 5 is redone
    m = re.match(r"repair: rank 3 lost at step 5 \(node 1 left, with rank 2\); 6 -> 4 ranks; last committed "
                 r"step ([45]), redoing step (\d+) with the same global batch; detected in [\d.]+s, repaired "
                 r"in [\d.]+s; replicas equal \(hash [0-9a-f]{12}\)$", repairs[0])
    assert m and int(m.group(2)) == int(m.group(1)) + 1, repairs[0]
    committed = int(m.group(1))
    rec = [r["repair"] for r in recs if "repair" in r]
    assert len(rec) == 1, rec
    assert (rec[0]["lost_ranks"], rec[0]["left_ranks"], rec[0]["lost_nodes"]) == ([2, 3], [2], [1]), rec
    assert (rec[0]["world_before"], rec[0]["world_after"], rec[0]["committed_step"]) == (6, 4, committed), rec
    steps = [r for r in recs if "step" in r and "loss" in r]
    assert [r["step"] for r in steps] == [s for s in range(1, STEPS + 1) if s != 5 or committed == 4]
    assert all(r["global_batch"] == 30 for r in steps)
    return steps, sha


EXACT = 'train.reproducible="exact"'


def test_a_lost_rank_takes_its_node_out_and_zero_goes_on_as_before(tmp_path):
    runs = {3: _killed_node_run(tmp_path, 3)[0]}
    runs[2], sha2 = _killed_node_run(tmp_path, 2, EXACT)
    base_sha, base_recs, base_text, _ = run_job(tmp_path, "whole3", 6, SETS + ["parallel.zero.stage=3", EXACT],
                                                ft=True, steps=STEPS, **NODES)
    assert not [ln for ln in base_text.splitlines() if ln.startswith("repair:")]
    # exact mode (gradient sums that do not depend on the rank count), stage 2 on the 4 ranks left
    # after the repair against stage 3 on 6 ranks that lost nothing: the same final weights
    assert sha2 == base_sha, (sha2, base_sha)
    base = {r["step"]: r["loss"] for r in base_recs if "step" in r and "loss" in r}
    for stage, steps in runs.items():  # the same global batch on 4 ranks: sums in another order
        for r in steps:
            assert r["loss"] == pytest.approx(base[r["step"]], rel=1e-5, abs=1e-6), \
                (stage, r["step"], r["loss"], base[r["step"]])


def test_losing_rank_0s_node_ends_the_job_as_with_stop(tmp_path):
    """Rank 0 writes metrics.jsonl and train.log: when its node loses a rank, rank 0 does
    not leave with status 0; the job ends as with "stop": one line (rank 0's, the lowest
    survivor's), a non-zero status, every rank gone. Under `mpirun --with-ft ulfm` an
    MPI_Abort ends only the rank that calls it: the survivors end together instead (each
    of them printed the line, and some lingered until their own 10 s bound, before)."""
    import os
    import subprocess

    from ulfm_launch import ROOT, VENV

    out = tmp_path / "node0"
    argv = [str(VENV / "bin" / "mpirun"), "--with-ft", "ulfm", "--oversubscribe", "-n", "6",
            str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train"]
    for s in SETS + ["parallel.zero.stage=3", f'run.out_dir="{out}"']:
        argv += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "HPCDP_FAULT": "1:5:kill", **NODES}
    if not Path(argv[0]).exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh")
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    # every rank has ended by now (mpirun waits for them; a rank that outlived it would be a
    # bug, the bound is for the process table to catch up, not for a rank to finish)
    assert not left_running(str(out), within=5), left_running(str(out))
    assert proc.returncode not in (0, None), text[-6000:]
    lines = text.splitlines()
    # one line, naming the step every survivor agreed on (a rank that saw the loss in step 6 too)
    assert [ln for ln in lines if ln.startswith("hpcdp: error:")] == [
        "hpcdp: error: rank 0 of 6 at step 5: rank 1 of node 0 lost at step 5: rank 0 (the writer of "
        "metrics.jsonl and train.log) is on that node, which failure.on_rank_loss = 'continue' drops as a "
        "whole; the job ends"], text[-6000:]
    assert not [ln for ln in lines if ln.startswith("repair:") or " leaves at step" in ln], text[-6000:]
    assert "Traceback" not in text and "MPI_ABORT" not in text, text[-6000:]
