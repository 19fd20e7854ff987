"""What the commands say about themselves (issue 37, items 11-13): help texts that name
the right checksum, engine and commands; ``hpcdp bench --help``; ``hpcdp train
--print-config``; one thread per rank when ranks share a node, said in one line; the
plot command; the study figures' tables and labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpcdp.launch import THREAD_VARS, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]


def _run(args, cwd=None, env=None, launcher=()):
    base = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    return subprocess.run([*launcher, sys.executable, "-m", "hpcdp.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


def test_help_texts_name_what_is_true():
    top = _run(["--help"]).stdout
    for line in ("hpcdp data train-tokenizer --text", "hpcdp plot RUN...", "hpcdp train --print-config",
                 "hpcdp bench threads"):
        assert line in top, line
    bench = _run(["bench", "--help"])
    assert bench.returncode == 0, bench.stderr
    from hpcdp.commands.bench import BENCHMARKS
    assert all(f"  {name} " in bench.stdout for name in BENCHMARKS)
    assert _run(["bench"]).returncode == 2 and _run(["bench", "nosuch"]).returncode == 2
    ckpt = _run(["ckpt", "--help"]).stdout
    assert "XXH3-128" in ckpt and "check every SHA-256" not in ckpt
    coll = _run(["bench", "collectives", "--help"]).stdout.replace("\n", " ")
    assert "else compiled" in " ".join(coll.split()) and "HPCDP_COMM_ENGINE, else python)" not in coll
    train = " ".join(_run(["train", "--help"]).stdout.split())
    assert "docs/user-guide.md, \"The config file\"" in train and "--print-config" in train


def test_print_config_is_the_resolved_config_and_trains_nothing(tmp_path):
    r = _run(["train", "--config", str(ROOT / "jobs/gpt_zero3.toml"), "--set", "optim.lr=0.01",
              "--set", "parallel.strategy=ddp", "--print-config"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from hpcdp.config import load_config

    want = load_config(ROOT / "jobs/gpt_zero3.toml", ["optim.lr=0.01", "parallel.strategy=ddp"])
    printed = tomllib.loads(r.stdout)
    assert printed == json.loads(json.dumps(want.to_dict()))  # every key, seeds filled in
    assert printed["optim"]["lr"] == 0.01 and printed["model"]["seed"] == printed["run"]["seed"]
    assert r.stderr.startswith("warning: the config file's [parallel.zero]")  # what will not be read
    assert not (tmp_path / "runs").exists()
    (tmp_path / "c.toml").write_text(r.stdout)
    assert load_config(tmp_path / "c.toml").to_dict() == want.to_dict()  # it reruns as it is
    bad = _run(["train", "--print-config", "--set", "optim.kind=adam"], cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("hpcdp: error: optim.kind: 'adam' is not allowed")


def test_ranks_sharing_a_node_get_one_thread_each_said_once(tmp_path):
    """Under mpiexec -n 2 with no thread variable set: every rank runs with one thread per
    pool, rank 0 says so once; a user's own setting wins; one rank per node is left alone.
    Each rank writes what it got to a file (the ranks' stdout lines interleave)."""
    probe = ("import os, sys; from hpcdp.cli import _one_thread_per_rank_under_a_launcher as f; f(); "
             "r = os.environ.get('PMI_RANK', '0'); "
             f"open(os.path.join({str(tmp_path)!r}, sys.argv[1] + '-' + r), 'w').write("
             f"' '.join(str(os.environ.get(v)) for v in {list(THREAD_VARS)!r}))")
    base = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env = {**base, "PYTHONPATH": str(ROOT)}

    def run(n, name, extra=None):
        r = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, "-c", probe, name],
                           env={**env, **(extra or {})}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = [(tmp_path / f"{name}-{k}").read_text() for k in range(n)]
        return r.stdout, got

    out, got = run(2, "shared")
    assert out.count("ranks share this node") == 1 and ("hpcdp: 2 ranks share this node: 1 thread(s) per rank "
                                                        "(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 "
                                                        "NUMBA_NUM_THREADS=1; set them to choose)") in out, out
    assert got == ["1 1 1 1", "1 1 1 1"]
    out, got = run(2, "mine", {"OMP_NUM_THREADS": "2"})
    assert "OMP_NUM_THREADS=1" not in out and got == ["2 1 1 1", "2 1 1 1"]
    out, got = run(1, "alone")
    assert "hpcdp:" not in out and got == ["None None None None"]


def test_local_ranks_from_each_launcher(monkeypatch):
    from hpcdp.launch import local_ranks

    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE",
                "SLURM_TASKS_PER_NODE", "SLURM_NODEID"):
        monkeypatch.delenv(var, raising=False)
    assert local_ranks() is None
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1")
    monkeypatch.setenv("SLURM_NODEID", "3")
    assert local_ranks() == 1
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert local_ranks() == 2
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert local_ranks() == 4


def test_bench_threads_runs_both_contenders(tmp_path):
    r = _run(["bench", "threads", "--config", str(ROOT / "jobs/digits_ddp.toml"), "--steps", "6", "--warmup",
              "1", "--repeats", "1", "--json", str(tmp_path / "t.json")], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    assert [row["contender"] for row in out["rows"]] == ["one per rank", "node-wide"]
    s = out["summary"]
    assert s["default_noted"] and s["ratio_node_wide_over_one"] > 0 and s["cores"] == os.cpu_count()
    assert "node-wide / one per rank:" in r.stdout


def test_plot_overlays_runs_and_labels_mlp_per_sample(tmp_path):
    """Two small runs (an MLP and a GPT): one PNG with both, and the CSV of every point
    equals metrics.jsonl (throughput in tokens/s for the GPT, samples/s for the MLP)."""
    mlp = _run(["train", "--set", "train.steps=4", "--set", 'run.out_dir="mlp"'], cwd=tmp_path,
               env={"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})
    gpt = _run(["train", "--config", str(ROOT / "jobs/gpt_small.toml"), "--set", "train.steps=3",
                "--set", 'run.out_dir="gpt"', "--set", "run.eval_every=2"], cwd=tmp_path,
               env={"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})
    assert mlp.returncode == 0 and gpt.returncode == 0, mlp.stderr + gpt.stderr
    r = _run(["plot", "mlp", "gpt", "--out", "both.png", "--csv", "both.csv"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mlp (4 steps, samples/s), gpt (3 steps, tokens/s)" in r.stdout
    assert (tmp_path / "both.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import csv

    rows = list(csv.DictReader(open(tmp_path / "both.csv")))
    assert [(x["run"], x["step"], x["unit"]) for x in rows] == [
        ("mlp", str(s), "samples/s") for s in range(1, 5)] + [("gpt", str(s), "tokens/s") for s in range(1, 4)]
    recs = [json.loads(x) for x in (tmp_path / "gpt" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in recs if "step" in x]
    block = tomllib.loads((tmp_path / "gpt" / "config.toml").read_text())["model"]["block_size"]
    for row, rec in zip(rows[4:], steps):
        assert float(row["throughput"]) == pytest.approx(rec["samples_per_s"] * block)
        assert float(row["loss"]) == pytest.approx(rec["loss"])
    assert rows[5]["eval_loss"] != "" and rows[4]["eval_loss"] == ""  # the eval at step 2
    one = _run(["plot", "mlp"], cwd=tmp_path)
    assert one.returncode == 0 and (tmp_path / "mlp" / "plot.png").is_file()
    bad = _run(["plot", "nowhere"], cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == ("hpcdp: error: hpcdp plot: nowhere is not a run "
                                                          "directory (no metrics.jsonl)")


def test_predict_table_and_figure_keep_every_strategy_apart():
    from hpcdp.scale.predict import distinct_series, format_predict

    def row(name, k, eff, step):
        return {"strategy": name, "ranks": k, "step_s": step, "compute_s": step, "comm_s": 0.0, "exposed_s": 0.0,
                "link_bytes": 0, "inter_bytes_node": 0, "memory_bytes": 0, "weak_efficiency": eff,
                "algorithms": "ring"}
    rows = [row(n, k, e, 0.04 / e) for n, e in (("zero1", 0.9), ("zero2", 0.9), ("zero3-hierarchical", 0.8))
            for k in (1, 2)]
    series = distinct_series(rows)
    assert [names for names, *_ in series] == [["zero1", "zero2"], ["zero3-hierarchical"]]
    res = {"profile": "p", "workload": "w", "buckets": [1], "batch_per_rank": 8, "ranks_per_node": 2,
           "rows": rows, "crossovers": {"bucket_bytes": 2**20, "ring_latency_reaches_bandwidth_at": None,
                                        "software_reaches_bandwidth_at": None, "ring_bound_at_max_ranks": "wire",
                                        "ring_bound_from": 2, "hierarchical_beats_ring_from": None,
                                        "parameter_server": {}}, "ranks": [1, 2]}
    lines = format_predict(res).splitlines()
    table = [x for x in lines[1:] if x.split()[:1] and x.split()[0] in ("strategy", "zero1", "zero2",
                                                                          "zero3-hierarchical")]
    import re
    assert len(table) == 7 and len({re.match(r"\S+\s+\S+", x).end() for x in table}) == 1  # columns line up


def test_the_staleness_figure_says_what_k_is():
    from PIL import Image

    title = Image.open(ROOT / "docs/figures/ps_staleness.png").text.get("Title", "")
    assert "k = staleness bound: a worker may start step t once the updates of steps <= t - k - 1" in title
