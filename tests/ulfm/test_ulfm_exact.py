"""failure.on_rank_loss = "continue" with train.reproducible = "exact" and the same global
batch: after a repair the weights are bit-identical to a run launched on the survivors'
rank count from the checkpoint of the agreed step.

Three jobs of the same 12-step MLP run (exact mode, Open MPI 5 of the ULFM venv):
A on 3 ranks under `--with-ft ulfm`, rank 2 SIGKILLed in step 5 (HPCDP_FAULT), the
survivors repair and finish; B on 3 ranks with a checkpoint after every step, nothing
killed; C on 2 ranks resumed from B's checkpoint of A's agreed step. A's final weights
hash (the eval record's sha256) equals C's, and B's (exact mode: any rank count)."""

from __future__ import annotations

import os
import subprocess
import sys

from ulfm_launch import ROOT, run_job

SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=30", "train.steps=12",
        'train.reproducible="exact"', "train.exact_micro_batch=5", "run.log_every=1", "run.eval_every=0",
        "parallel.strategy=ddp", "comm.timeout=30", "optim.kind=adamw", "optim.lr=0.01"]


def _job(tmp_path, name, ranks, sets, *extra, ft=False, **env):
    return run_job(tmp_path, name, ranks, SETS + sets, *extra, ft=ft, **env)[:3]


def test_exact_weights_after_a_repair_equal_a_smaller_run_resumed_from_that_step(tmp_path):
    a, recs, text = _job(tmp_path, "a", 3, ['failure.on_rank_loss="continue"'], ft=True, HPCDP_FAULT="2:5:kill")
    repairs = [r["repair"] for r in recs if "repair" in r]
    assert len(repairs) == 1 and repairs[0]["world_after"] == 2, text[-6000:]
    at = repairs[0]["committed_step"]
    assert at in (4, 5), repairs
    b, _, _ = _job(tmp_path, "b", 3, ["checkpoint.every=1"])
    ckpt = tmp_path / "b" / "checkpoints"
    (path,) = [p for p in ckpt.iterdir() if p.name.startswith("step-") and int(p.name[5:]) == at]
    c, recs_c, text_c = _job(tmp_path, "c", 2, [], "--resume", str(path))
    assert min(r["step"] for r in recs_c if "loss" in r) == at + 1, text_c[-3000:]
    assert a == c, f"after the repair at step {at}: {a} (3 -> 2 ranks) != {c} (2 ranks from the checkpoint)"
    assert a == b  # exact mode: the same weights for any rank count


def test_scale_keeps_the_per_rank_batch_and_equals_a_smaller_run_resumed(tmp_path):
    """failure.batch = "scale": after the repair each survivor keeps its 10 samples, so the
    global batch goes 30 -> 20 (the rest of the epoch re-split at 20: hpcdp.data.rescale);
    the replicas agree (the repair's hash, DDP's check every step); the final weights equal
    a 2-rank job resumed (same config) from A's checkpoint of the agreed step, and from its
    checkpoint of step 9, written after the repair (its batch schedule carries over)."""
    scale = ['failure.on_rank_loss="continue"', 'failure.batch="scale"']
    a, recs, text = _job(tmp_path, "a", 3, scale + ["checkpoint.every=1", "parallel.ddp.check_every=1"],
                         ft=True, HPCDP_FAULT="2:5:kill")
    repairs = [r["repair"] for r in recs if "repair" in r]
    assert len(repairs) == 1 and repairs[0]["world_after"] == 2, text[-6000:]
    rep = repairs[0]
    at = rep["committed_step"]
    assert at in (4, 5) and (rep["global_batch_before"], rep["global_batch_after"]) == (30, 20), rep
    assert rep["weights_hash"], rep
    lines = [ln for ln in text.splitlines() if ln.startswith("repair:")]
    assert len(lines) == 1 and f"redoing step {at + 1} with global batch 20 (was 30; failure.batch = 'scale'" \
        in lines[0], lines
    steps = {r["step"]: r["global_batch"] for r in recs if "loss" in r}
    assert [steps[s] for s in sorted(steps)] == [30 if s <= at else 20 for s in sorted(steps)], steps
    ckpt = tmp_path / "a" / "checkpoints"
    for frm in (at, 9):
        (path,) = [p for p in ckpt.iterdir() if p.name.startswith("step-") and int(p.name[5:]) == frm]
        c, recs_c, text_c = _job(tmp_path, f"c{frm}", 2, scale, "--resume", str(path), ft=True)
        assert {r["global_batch"] for r in recs_c if "loss" in r} == {20}, text_c[-3000:]
        assert a == c, f"scaled at step {at}: {a} (3 -> 2 ranks) != {c} (2 ranks from the checkpoint of step {frm})"
    # resumed without failure.batch = "scale", the changed batch would not carry over: one line, status 2
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "train", "--resume", str(path),
                           *[a for s in SETS + [f'run.out_dir="{tmp_path / "k"}"'] for a in ("--set", s)]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcdp: error:")]
    assert proc.returncode == 2 and len(said) == 1 and "its job changed the global batch after a lost rank " \
        f"(batch schedule [[0, 30], [{at}, 20]]): resume it with failure.on_rank_loss = 'continue' and " \
        "failure.batch = 'scale'" in said[0], proc.stdout[-2000:] + proc.stderr[-3000:]
