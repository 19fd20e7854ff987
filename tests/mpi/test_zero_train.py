"""ZeRO through ``run_training`` on real ranks: the same run (losses, final weights and
evaluation) as DDP at every stage, evaluation when a rank's test piece runs out first,
memory figures in metrics.jsonl, and the up-front memory refusal on every rank."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile

import numpy as np
import pytest

pytestmark = pytest.mark.mpi


def _world():
    from hpcdp.world import World
    return World.from_mpi()


def _shared_tmp(world, name):
    pid = np.array([os.getpid()], dtype=np.int64)
    world.comm.Bcast(pid, root=0)
    return os.path.join(tempfile.gettempdir(), f"hpcdp-zero-{name}-{pid[0]}")


def _cfg(out, strategy, *extra):
    from hpcdp.config import load_config
    return load_config(None, [
        f'run.out_dir="{out}"', "run.dtype=float64", "run.log_every=1", "run.eval_every=2",
        "model.kind=gpt", "model.vocab_size=8", "model.block_size=6", "model.n_layer=2",
        "model.n_head=2", "model.n_embd=8", "data.kind=synthetic_sequence", "data.vocab_size=8",
        "data.seq_len=6", "data.n_samples=40", "data.test_fraction=0.125", "train.steps=3",
        "train.global_batch=8", "train.eval_batch=1", "optim.kind=adamw", "optim.lr=0.01",
        f"parallel.strategy={strategy}", *extra])


def _rows(path):
    return [json.loads(x) for x in open(path).read().splitlines()]


def test_every_stage_trains_and_evaluates_like_ddp():
    """5 test sequences with eval_batch = 1: ranks with fewer run a dropped forward."""
    from hpcdp.train import run_training

    world = _world()
    tmp = _shared_tmp(world, "train")
    try:
        runs = {}
        for name, sets in [("ddp", ["parallel.strategy=ddp"]),
                           ("z1", ["parallel.zero.stage=1"]), ("z2", ["parallel.zero.stage=2"]),
                           ("z3", ["parallel.zero.stage=3", "parallel.zero.prefetch=2"])]:
            strategy = "ddp" if name == "ddp" else "zero"
            out = os.path.join(tmp, name)
            res = run_training(_cfg(out, strategy, *sets[1:] if name == "ddp" else sets),
                               world=world, out=io.StringIO())
            runs[name] = res
            if world.rank == 0:
                rows = _rows(os.path.join(out, "metrics.jsonl"))
                steps = [r for r in rows if "step" in r]
                mem = steps[-1]["ranks"]
                assert len(mem["mem_persistent_bytes"]) == world.size
                assert all(v > 0 for v in mem["rss_peak_bytes"])
                runs[name]["losses"] = [r["loss"] for r in steps]
                runs[name]["persistent"] = mem["mem_persistent_bytes"][0]
        for name in ("z1", "z2", "z3"):
            assert runs[name]["eval"]["n"] == runs["ddp"]["eval"]["n"] == 5 * 6
            assert runs[name]["eval"]["loss"] == pytest.approx(runs["ddp"]["eval"]["loss"], rel=1e-12)
            if world.rank == 0:
                np.testing.assert_allclose(runs[name]["losses"], runs["ddp"]["losses"], rtol=1e-12)
        if world.rank == 0 and world.size > 1:  # memory falls with the stage
            p = [runs[n]["persistent"] for n in ("ddp", "z1", "z2", "z3")]
            assert p[0] > p[1] > p[2] > p[3]
    finally:
        world.comm.Barrier()
        if world.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def test_model_state_that_cannot_fit_is_refused_up_front_on_every_rank(monkeypatch):
    import hpcdp.memcheck
    from hpcdp.config_error import ConfigError
    from hpcdp.train import run_training

    world = _world()
    tmp = _shared_tmp(world, "refuse")
    monkeypatch.setattr(hpcdp.memcheck, "available_bytes", lambda: 4096)  # a 4 KiB node
    try:
        with pytest.raises(ConfigError, match=r"parallel.strategy = 'ddp': the model state needs .* GiB per "
                                              r"rank.*more than the 0.00 GiB available.*ZeRO stage 3 would"):
            run_training(_cfg(os.path.join(tmp, "r"), "ddp"), world=world, out=io.StringIO())
    finally:
        world.comm.Barrier()
        if world.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
