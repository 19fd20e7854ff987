"""Checkpoints across nodes: saved by 2 nodes x 2 ranks, resumed on 1 node (2 ranks) and on
3 nodes x 1 rank, each continuing the run that never stopped. Exact mode
(train.reproducible = "exact") makes the weights bit-identical for any rank count, so
"continuing" is checked bit for bit: the step-8 checkpoint of every resumed run holds the
weights of the uninterrupted 2 x 2 run's."""

from __future__ import annotations

import shutil
import sys

import pytest

SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=24", "run.log_every=1",
        "run.eval_every=0", 'train.reproducible="exact"', "train.exact_micro_batch=4",
        'optim.kind="adamw"', "optim.lr=0.01", "checkpoint.every=4", "parallel.strategy=ddp"]


def _train(cluster, tmp_path, layout, name, ckpt, steps, *extra):
    sets = SETS + [f"train.steps={steps}", f'run.out_dir="{tmp_path / name}"', f'checkpoint.dir="{ckpt}"']
    argv = [sys.executable, "-m", "hpcdp.cli", "train"] + [a for s in sets for a in ("--set", s)] + list(extra)
    job = cluster.run(layout, argv, cwd=tmp_path, timeout=240)
    assert job.status == 0 and not job.timed_out, f"{name} on layout {layout}: exit {job.status}\n{job.out[-5000:]}"
    return job


def test_saved_on_2x2_resumed_on_1_node_and_on_3x1_continues_the_run(unlimited, tmp_path):
    from hpcdp.io.interop.inspect import weights_sha256

    cluster = unlimited
    _train(cluster, tmp_path, "2,2", "straight", tmp_path / "ck-straight", 8)
    want = weights_sha256(tmp_path / "ck-straight" / "step-00000008")
    _train(cluster, tmp_path, "2,2", "first-half", tmp_path / "ck", 4)
    for layout, name in (("2", "one-node"), ("1,1,1", "three-nodes")):
        ck = tmp_path / f"ck-{name}"
        shutil.copytree(tmp_path / "ck", ck)
        job = _train(cluster, tmp_path, layout, name, ck, 8, "--resume", "latest")
        assert "resumed from" in job.out and ": step 4" in job.out, job.out[-3000:]
        got = weights_sha256(ck / "step-00000008")
        assert got == want, f"resumed on layout {layout}: weights {got[:12]}, the uninterrupted run's {want[:12]}"
