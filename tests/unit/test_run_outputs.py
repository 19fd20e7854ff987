"""What a run leaves for its user, from real jobs (issue 37):

- metrics.jsonl keeps the steps before a failure: the writer's own failure writes its
  unflushed steps, and every rank's figures are flushed at least every
  ``run.metrics_flush_s`` seconds, so another rank's death loses only those;
- train.log in the run folder: timestamped lines, interval means of the loss and the
  throughput (checked against metrics.jsonl), an end-of-run summary;
- metrics.jsonl at scale: above ``run.rank_lists_up_to`` ranks the spread of every
  figure each step, the per-rank lists every ``run.rank_lists_every`` steps, and the
  repository's readers of the file still work.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path, name, *sets, ranks=1, env=None, config=None):
    out = tmp_path / name
    cmd = [sys.executable, "-m", "hpcdp.cli", "train", "--set", f'run.out_dir="{out}"']
    if config:
        cmd += ["--config", str(config)]
    for s in sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [find_mpiexec(), "-n", str(ranks)] + cmd
    proc = subprocess.run(cmd, env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return proc, out


def _records(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_writers_failure_keeps_its_unflushed_steps(tmp_path):
    """Rank 0 fails at step 7 of a run that logs every 1000 steps: steps 1-6 are in
    metrics.jsonl (gathered ones as step records, the rest with rank 0's figures),
    and train.log says where it failed."""
    proc, out = _train(tmp_path, "raise", "train.steps=20", "run.log_every=1000", "run.metrics_flush_s=1000",
                       env={"HPCDP_FAULT": "0:7:raise"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = _records(out)
    full = [r["step"] for r in recs if "step" in r]
    partial = [r for r in recs if "unflushed_step" in r]
    assert sorted(full + [r["unflushed_step"] for r in partial]) == [1, 2, 3, 4, 5, 6]
    assert full == [1, 2], recs  # the first step, then the cadence's first interval: one step
    p = partial[-1]
    assert p["why"].startswith("RuntimeError: injected fault") and p["rank0"]["samples"] == 64
    assert p["rank0"]["step_time_s"] > 0 and p["rank0"]["loss_part"] > 0 and p["lr"] == 0.1
    assert "failed at step 7: RuntimeError: injected fault" in (out / "train.log").read_text()


def test_another_ranks_death_loses_only_the_last_seconds(tmp_path):
    """Rank 1 is killed at step 150 of a run that logs every 1000 steps: rank 0 dies
    with it, but metrics.jsonl was flushed every run.metrics_flush_s seconds. The
    interval is far shorter than a step, so the cadence is one step whatever the
    machine's speed (a 0.05 s interval was ~66 steps of this MLP on a fast machine, and
    which of them were written depended on its speed): at most the steps in flight are
    lost."""
    proc, out = _train(tmp_path, "kill", "train.steps=400", "run.log_every=1000", "run.metrics_flush_s=1e-6",
                       ranks=2, env={"HPCDP_FAULT": "1:150:kill"})
    assert proc.returncode != 0
    steps = [r["step"] for r in _records(out) if "step" in r]
    assert steps == list(range(1, len(steps) + 1))  # in order, none lost in between
    assert 147 <= steps[-1] < 150, steps[-1]
    assert all(len(r["ranks"]["samples"]) == 2 for r in _records(out) if "step" in r)


def test_train_log_interval_means_and_summary(tmp_path):
    """One job: train.log beside metrics.jsonl, each line timestamped; a log line's loss,
    samples/s and ms/step are the means over the steps since the previous line (the ETA
    follows them); a summary at the end; the config's warning line is in the log too."""
    job = tmp_path / "job.toml"
    job.write_text('[parallel]\nstrategy = "ddp"\n[parallel.zero]\nstage = 3\n')
    proc, out = _train(tmp_path, "story", "train.steps=30", "run.log_every=10", "run.eval_every=15",
                       "run.tensorboard=true", config=job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "train.log").read_text().splitlines()
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")
    firsts = [line for line in log if stamp.match(line)]
    assert firsts and firsts[0].endswith(f"run dir: {out}")
    assert all(stamp.match(line) for line in log if line.startswith("20")), log
    # stdout carries the same lines, without timestamps
    assert f"run dir: {out}" in proc.stdout.splitlines()[0]
    assert any("[parallel.zero] (stage) (parallel.strategy is 'ddp'): not read by this run" in line
               for line in log)
    steps = {r["step"]: r for r in _records(out) if "step" in r}
    lines = {int(m.group(1)): m for m in (re.search(r" step +(\d+)/30  loss (\S+)  lr \S+  ([\d,]+) samples/s  "
                                                     r"([\d.]+) ms/step", x) for x in log) if m}
    assert sorted(lines) == [1, 10, 20, 30]
    for lo, hi in ((2, 10), (11, 20), (21, 30)):
        block = [steps[s] for s in range(lo, hi + 1)]
        m = lines[hi]
        assert float(m.group(2)) == pytest.approx(sum(r["loss"] for r in block) / len(block), abs=1e-4)
        rate = sum(r["global_batch"] for r in block) / sum(r["step_time_s"] for r in block)
        assert float(m.group(3).replace(",", "")) == pytest.approx(rate, abs=1.0)
        ms = 1e3 * sum(r["step_time_s"] for r in block) / len(block)
        assert float(m.group(4)) == pytest.approx(ms, abs=0.01)
    assert "(means of the 9 steps since the last line)" in "\n".join(log)
    text = "\n".join(log)
    assert re.search(r"summary: steps 1-30 of 30 in \d:\d\d:\d\d .*1,920 samples; [\d,]+ samples/s", text)
    evals = [r["eval"] for r in _records(out) if "eval" in r]
    best = min(evals, key=lambda e: e["loss"])
    assert f"best {best['loss']:.4f} at step {best['step']}" in text
    assert f"summary: files {out}/train.log, {out}/metrics.jsonl, {out}/config.toml" in text
    # the same figures as TensorBoard events (run.tensorboard), read with TensorBoard's own schema
    (events,) = (out / "tensorboard").glob("events.out.tfevents.*")
    scalars = read_events(events)
    assert [st for tag, st, _ in scalars if tag == "train/loss"] == list(range(1, 31))
    for tag, st, v in scalars:
        if tag == "train/loss":
            assert v == pytest.approx(steps[st]["loss"], rel=1e-6)
        if tag == "eval/loss":
            assert v == pytest.approx(next(e["loss"] for e in evals if e["step"] == st), rel=1e-6)
    assert {tag for tag, _, _ in scalars} >= {"train/samples_per_s", "train/step_time_s", "train/lr",
                                              "eval/accuracy", "data/wait_s"}


def read_events(path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in a TensorBoard event file (TFRecord framing:
    length, its CRC, the Event protobuf, its CRC)."""
    import struct

    from tensorboardX.proto import event_pb2

    data, i, out = path.read_bytes(), 0, []
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
        i += 12 + n + 4
        out += [(v.tag, ev.step, v.simple_value) for v in ev.summary.value]
    return out


def test_a_slow_first_step_is_explained_while_it_runs():
    from hpcdp.metrics import FirstStepNotice

    lines: list[str] = []
    notice = FirstStepNotice(lines.append, after_s=0.05)
    time.sleep(0.5)
    notice.cancel()
    assert len(lines) == 1 and "the first step compiles the kernels (numba; cached on disk" in lines[0]
    quick = FirstStepNotice(lines.append, after_s=0.5)
    quick.cancel()  # the step ended in time: nothing said
    time.sleep(0.6)
    assert len(lines) == 1


def test_metrics_at_scale_keep_the_spread_and_lists_every_k_steps(tmp_path):
    """2 ranks counted as many (run.rank_lists_up_to = 1): every step has the spread
    (min / median / max, the slowest rank), the per-rank lists come every 4 steps and
    on the first and last; the repository's readers of metrics.jsonl still work."""
    proc, out = _train(tmp_path, "scale", "train.steps=10", "run.rank_lists_up_to=1", "run.rank_lists_every=4",
                       ranks=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [r for r in _records(out) if "step" in r]
    assert [r["step"] for r in recs if "ranks" in r] == [1, 4, 8, 10]
    for r in recs:
        sp = r["spread"]
        assert sp["slowest_rank"] in (0, 1)
        assert sp["samples"] == {"min": 32, "median": 32, "mean": 32, "max": 32, "argmax": sp["samples"]["argmax"]}
        t = sp["step_time_s"]
        assert t["min"] <= t["median"] <= t["max"] and t["argmax"] == sp["slowest_rank"]
        if "ranks" in r:
            assert max(r["ranks"]["step_time_s"]) == t["max"]
            assert r["ranks"]["step_time_s"].index(t["max"]) == sp["slowest_rank"]
    # readers: the scaling study's summary, the data benchmark's waits, the plot command's series
    from hpcdp.metrics import rank_values
    from hpcdp.scale.study import summarize

    s = summarize(out / "metrics.jsonl", 1)
    assert s["step_time_s"] > 0 and s["bytes_sent"] > 0
    assert rank_values(recs[1], "samples") is None and rank_values(recs[0], "samples") == [32, 32]
    assert rank_values(recs[1], "step_time_s", "max") == recs[1]["spread"]["step_time_s"]["max"]
