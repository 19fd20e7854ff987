"""Per-step metrics reach rank 0 in blocks (Igather at each flush), every rank's figures
in rank order and every step in step order; the writer's metrics.jsonl of an
asynchronous PS run holds each rank's own samples, bytes and staleness."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.metrics import StepGather
from hpcdp.shard import shard_range


def figures(rank, step):
    """Closed-form per-rank, per-step figures."""
    return 0.25 * (rank + 1) + step, 10 + rank, 0.5 * rank + step, {"bytes_sent": 1000 * rank + step,
                                                                    "comm_s": 0.125 * rank}


@pytest.mark.mpi(min_size=2)
def test_buffered_steps_reach_rank_0_in_step_and_rank_order():
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    g = StepGather(comm)
    seen = []
    for block in ((0, 1, 2, 3, 4), (5,), (6, 7, 8)):
        for step in block:
            g.add(*figures(r, step))
        got = g.flush()
        if r != 0:
            assert got == []  # the other ranks do not wait for the writer
            continue
        assert len(got) == len(block)
        for step, (loss, ranks) in zip(block, got):
            assert loss == pytest.approx(sum(figures(k, step)[0] for k in range(n)))
            assert ranks["samples"] == [10 + k for k in range(n)]
            assert ranks["step_time_s"] == [0.5 * k + step for k in range(n)]
            assert ranks["bytes_sent"] == [1000 * k + step for k in range(n)]
            assert ranks["comm_s"] == [0.125 * k for k in range(n)]
            seen.append(step)
    g.finish()
    assert g.flush() == []  # nothing buffered: no collective, nothing returned
    if r == 0:
        assert seen == list(range(9))


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_async_ps_run_writes_each_ranks_figures_for_every_step(tmp_path_factory):
    from hpcdp.config import load_config
    from hpcdp.train import run_training
    from hpcdp.world import World

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    out = comm.bcast(str(tmp_path_factory.mktemp("ps_metrics")) if comm.rank == 0 else None)
    k, steps = 2, 7
    cfg = load_config("jobs/digits_ps_async.toml",
                      [f"parallel.ps.staleness={k}", f"train.steps={steps}", "run.log_every=3",
                       "run.eval_every=0", f'run.out_dir="{out}"'])
    summary = run_training(cfg, world=World.from_mpi(), out=io.StringIO())
    comm.Barrier()
    lines = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    recs = [x for x in lines if "step" in x]
    assert [x["step"] for x in recs] == list(range(1, steps + 1))
    phi = 9610 * 4  # digits MLP 64-128-10, float32; one colocated server on rank 0
    for rec in recs:
        ranks = rec["ranks"]
        assert ranks["samples"] == [shard_range(64, n, w)[1] for w in range(n)]
        assert ranks["ps_push_sent_bytes"] == [0] + [phi] * (n - 1)
        assert ranks["ps_push_recv_bytes"][1:] == [0] * (n - 1)
        assert all(0 <= s <= k for s in ranks["ps_staleness"])
        assert len(ranks["step_time_s"]) == n and rec["step_time_s"] == ranks["step_time_s"][0]
        assert np.isfinite(rec["loss"])
    # Within the steps the server received every remote worker's gradient of every step
    # up to the staleness bound: the server's own worker starts its last step only once
    # every shard holds versions >= steps - k. The last k steps' pushes may arrive while
    # the server drains in close(), after the last step record (asynchronous by design).
    got = sum(sum(r["ranks"]["ps_push_recv_bytes"]) for r in recs)
    assert got % phi == 0
    assert (steps - k) * (n - 1) * phi <= got <= steps * (n - 1) * phi
    if comm.rank == 0:  # the writer knows the global loss
        assert summary["loss"] == pytest.approx(recs[-1]["loss"])
