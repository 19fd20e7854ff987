"""DiLoCo across the emulated cluster's link: 2 sites x 2 ranks, one replica group per
site (found as shared-memory nodes, no HPCDP_RANKS_PER_NODE), DDP inside a site.

One job (the GPT of jobs/gpt_ddp.toml, H = 2, 8 steps: 4 outer exchanges of float32):
every rank's ledger holds exactly the ring formula's outer bytes
(hpcdp.strategies.diloco.exchange.outer_bytes of its chunk, per exchange), nothing else
of the step crosses between groups, and each site's veth carried the ledger's
inter-site bytes within a few percent (TCP/IP and MPI headers, the run's start-up and
metrics on top)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

STEPS, H = 8, 2


def test_diloco_ledger_is_the_formula_and_the_veth_agrees(unlimited):
    from hpcdp.config import load_config
    from hpcdp.nn import build_model
    from hpcdp.shard import shard_range
    from hpcdp.strategies.diloco.exchange import outer_bytes

    cluster = unlimited
    out = Path(tempfile.mkdtemp(prefix="hpcdp-diloco-"))
    argv = [sys.executable, "-m", "hpcdp.cli", "train", "--config", "jobs/gpt_ddp.toml",
            "--set", 'parallel.strategy="diloco"', "--set", f"parallel.diloco.sync_every={H}",
            "--set", f"train.steps={STEPS}", "--set", "run.log_every=1", "--set", f'run.out_dir="{out}"']
    before = cluster.link_bytes()
    job = cluster.run("2,2", argv, timeout=400)
    carried = [a - b for a, b in zip(cluster.link_bytes(), before)]
    assert not job.timed_out and job.status == 0, job.out[-6000:]
    assert "DiLoCo: 2 replica group(s) x 2 rank(s) (shared-memory nodes" in job.out, job.out[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and "ranks" in r]
    assert len(rows) == STEPS
    outer = [sum(r["ranks"]["outer_bytes_sent"][k] for r in rows) for k in range(4)]
    inter = [sum(r["ranks"]["inter_bytes_sent"][k] for r in rows) for k in range(4)]
    # the formula: rank (group g, local l) carries chunk l of the whole model, per exchange
    cfg = load_config("jobs/gpt_ddp.toml", [])
    n = build_model(cfg.model, dtype="float32", storage=()).flat.numel
    want = []
    for rank in range(4):
        g, l = rank // 2, rank % 2
        chunk = shard_range(n, 2, l)[1]
        want.append(STEPS // H * outer_bytes(chunk, 2, g, "float32")["outer"][0])
    assert outer == want, f"ledger {outer} != formula {want}"
    assert inter == outer                   # nothing else crosses between the groups
    # each site's veth: what it sent plus received, against the ledger's both ways
    for node in (0, 1):
        ledger = 2 * (outer[2 * node] + outer[2 * node + 1])
        ratio = carried[node] / ledger
        assert 1.0 <= ratio <= 1.08, f"site {node}: veth {carried[node]} B, ledger {ledger} B: {ratio:.3f}"
