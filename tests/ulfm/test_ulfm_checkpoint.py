"""failure.on_rank_loss = "continue" with checkpoints: rank 2 of 3 is SIGKILLed in the
middle of writing its part of the checkpoint of step 6 (the failpoint ckpt-mid-write,
hpcdp/io/failpoint.py). The survivors repair the job, save the checkpoint of the agreed
step again on the two of them (its half-written temporary folder, never listed, is
replaced), and go on to the end: every listed checkpoint is complete (marker and index
agree), none is left half-written, the repair record names the lost rank and the step
saved again, train.log has one repair line, and a job resumed from the checkpoint of
step 6 on 2 ranks ends with the same weights as the repaired job."""

from __future__ import annotations

from ulfm_launch import run_job

SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=30", "train.steps=12",
        'train.reproducible="exact"', "train.exact_micro_batch=5", "run.log_every=1", "run.eval_every=0",
        "parallel.strategy=ddp", "comm.timeout=30", "checkpoint.every=3"]


def _job(tmp_path, name, ranks, sets, *extra, ft=True, **env):
    return run_job(tmp_path, name, ranks, SETS + sets, *extra, ft=ft, **env)


def test_a_rank_killed_during_a_save_leaves_only_complete_checkpoints(tmp_path):
    from hpcdp.io.format.commit import list_checkpoints, marker_problem
    from hpcdp.io.format.index import read_index

    a, recs, text, out = _job(tmp_path, "a", 3, ['failure.on_rank_loss="continue"'],
                              HPCDP_CKPT_FAILPOINT="ckpt-mid-write@6:2")
    repairs = [r["repair"] for r in recs if "repair" in r]
    assert len(repairs) == 1, text[-6000:]
    rep = repairs[0]
    assert (rep["step"], rep["lost_ranks"], rep["committed_step"], rep["checkpoint_saved_again"]) == (6, [2], 6, 6), rep
    log = (out / "train.log").read_text()
    assert len([ln for ln in log.splitlines() if "repair: rank 2 lost at step 6; 3 -> 2 ranks" in ln]) == 1, log
    listed = list_checkpoints(out / "checkpoints")
    assert [(s, ok) for s, _, ok in listed] == [(3, True), (6, True), (9, True), (12, True)], listed
    for s, path, _ in listed:
        assert marker_problem(path) is None, (s, marker_problem(path))
        assert int(read_index(path).attrs["world_size"]) == (3 if s == 3 else 2), s
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]  # nothing half-written
    # the checkpoint saved again holds the agreed state: resumed on 2 ranks, the same weights at the end
    six = [p for s, p, _ in listed if s == 6][0]
    c, _, text_c, _ = _job(tmp_path, "c", 2, [], "--resume", str(six), ft=False)
    assert a == c, text_c[-3000:]
