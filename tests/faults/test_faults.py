"""Fault injection on real jobs: a failure on any rank ends the job on every rank,
within a bound, with a non-zero status, a message naming the rank and the cause,
and no process left behind (hpcdp.bench.faults launches and judges each scenario).

Each job runs under ``mpiexec`` in its own session with a hard limit, so a
regression shows up as a failed check, never as a hung test run. The bounds are
generous (load makes things slow, never wrong): 60 s from the fault to the full
exit where the policy ends the job at once, with comm.timeout = 120 s so that any
path still waiting for a timeout would overshoot it; stuck-rank scenarios use
comm.timeout = 5 s.
"""

from __future__ import annotations

import json
import math

import pytest

from hpcdp.bench.faults import check, launch, scenarios

SCENARIOS = {sc.name: sc for sc in scenarios()}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault_ends_the_job_as_promised(name, tmp_path):
    sc = SCENARIOS[name]
    res = launch(sc, tmp_path)
    problems = check(sc, res)
    assert not problems, "\n".join(problems) + "\n--- output:\n" + res.out[-6000:]
    if sc.fault.endswith(":nan"):  # on_nonfinite = "skip": the run finishes, the step is dropped
        lines = (res.run_dir / "metrics.jsonl").read_text().splitlines()
        recs = [json.loads(x, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
                for x in lines]
        steps = {r["step"]: r for r in recs if "step" in r}
        assert sorted(steps) == list(range(1, sc.steps + 1))
        skipped = {s: sum(r["ranks"]["nonfinite_skipped"]) for s, r in steps.items()}
        # the step of the NaN is dropped (by every DDP rank; by the server that owns
        # the shard under the parameter server), no other step is
        expect = sc.ranks if sc.strategy == "ddp" else 1
        assert skipped == {s: (expect if s == 4 else 0) for s in steps}
        ev = [r["eval"] for r in recs if "eval" in r][-1]
        assert math.isfinite(ev["loss"]) and all(math.isfinite(r["loss"]) for r in steps.values())
