"""hpcdp scale --reproduce: hpcdp's cost model against published scaling tables."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from hpcdp.comm.model.cost import Topology, ps_push_pull, ring_allreduce
from hpcdp.scale import reproduce as R


@pytest.mark.parametrize("name", R.available())
def test_every_shipped_table_loads_cites_its_sources_and_states_its_assumptions(name):
    table = R.load_table(name)
    assert len(table["points"]) >= 6
    for pt in table["points"]:
        assert pt["source"] in table["sources"] and pt["model"] in table["models"]
        assert 0 < R.published_value(table, pt) <= 100
    for m in table["models"].values():
        assert m["params"] > 1e6 and m["images_per_s"] > 0 and m["batch"] >= 1 and m.get("source")
    text = (R.TABLE_DIR / f"{name}.toml").read_text()
    assert "ASSUMED" in text  # every input not published is marked and reasoned in the header


def test_the_shipped_tables_are_package_data():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "scale/published/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["hpcdp"]


def _table(strategy="ddp", overlap=0.0, fusion=0, call_s=0.0):
    t = copy.deepcopy(R.load_table("horovod"))
    t["strategy"] = strategy
    t["machine"].update(overlap=overlap, fusion_bytes=fusion, call_s=call_s)
    return t


def test_a_ddp_point_is_the_ring_allreduce_after_the_step_when_nothing_overlaps():
    """One bucket, no overlap: t(N) = t(1) + hpcdp's flat ring allreduce of the whole
    gradient across nodes of 4 (closed form from hpcdp.comm.model.cost)."""
    t = _table()
    mdl = t["models"]["vgg16"]
    t1 = mdl["batch"] / mdl["images_per_s"]
    assert R.predicted_step_s(t, "vgg16", 1) == pytest.approx(t1)
    p = R.profile_of(t["machine"], mdl["images_per_s"])
    ring = ring_allreduce(p, 4 * mdl["params"], Topology.of(512, 4)).total_s
    assert R.predicted_step_s(t, "vgg16", 512) == pytest.approx(t1 + ring, rel=1e-9)
    # the bandwidth term alone: 2 (N-1)/N of 553 MB at 25 Gbit/s
    assert ring > 2 * 511 / 512 * 4 * mdl["params"] / 3.125e9
    # overlap 1 hides part of it behind backward (buckets ready in backward order)
    t_ov = _table(overlap=1.0, fusion=64 << 20)
    assert t1 < R.predicted_step_s(t_ov, "vgg16", 512) < t1 + ring


def test_a_ps_replicated_point_is_the_machines_sum_then_push_and_pull():
    t = copy.deepcopy(R.load_table("tf-ec2-k80"))
    mdl = t["models"]["resnet152"]
    t1 = mdl["batch"] / mdl["images_per_s"]
    p = R.profile_of(t["machine"], mdl["images_per_s"])
    S = 4 * mdl["params"]
    local = ring_allreduce(p, S, Topology.of(8, 8)).total_s
    assert R.predicted_step_s(t, "resnet152", 8) == pytest.approx(t1 + local)
    # 64 GPUs = 8 machines, 4 servers (the table's exception for ResNet-152)
    pp = ps_push_pull(p, S, Topology(8, 1), 4).total_s
    assert R.predicted_step_s(t, "resnet152", 64) == pytest.approx(t1 + local + pp)
    assert pp > ps_push_pull(p, S, Topology(8, 1), 8).total_s  # fewer servers, more per server


def test_published_efficiency_from_the_tables_throughputs():
    t = R.load_table("tf-ec2-k80")
    pt = next(p for p in t["points"] if p["model"] == "resnet50" and p["gpus"] == 64)
    assert R.published_value(t, pt) == pytest.approx(100 * 2744 / (64 * 52.4), abs=0.05)  # 81.8


def test_the_published_tables_are_reproduced_within_the_aims():
    """Horovod: every point within 10 points, the median within 5 (the issue's aim). TF
    on EC2: the median within 5, 11 of 12 within 10 (ResNet-152 at 64 GPUs is -10.5:
    docs/scaling.md says why). A change of the model that moves them fails here."""
    h = R.summarize(R.reproduce(R.load_table("horovod")))
    assert h["median_met"] and h["max_met"], h
    tf = R.summarize(R.reproduce(R.load_table("tf-ec2-k80")))
    assert tf["median_met"] and tf["within_10"] >= 11, tf


def test_reproduce_command_prints_each_point_and_writes_json_records(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "scale", "--reproduce", "all", "--json",
                           str(out), "--sweep"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "VGG-16, 512 GPUs" in proc.stdout and "median |error|" in proc.stdout
    assert "inter_alpha_s = 5e-06" in proc.stdout  # --sweep: the assumed latency moved
    recs = json.loads(out.read_text())
    assert len(recs) == sum(len(R.load_table(n)["points"]) for n in R.available())
    for r in recs:
        assert {"source", "point", "published", "predicted", "unit"} <= set(r)
        assert r["unit"] == "%" and r["error"] == pytest.approx(r["predicted"] - r["published"], abs=0.11)
    bad = subprocess.run([sys.executable, "-m", "hpcdp.cli", "scale", "--reproduce", "nosuch"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "hpcdp: error: --reproduce 'nosuch': no such table" in bad.stderr


def test_a_table_with_a_point_of_an_unknown_model_is_refused(tmp_path):
    text = (R.TABLE_DIR / "horovod.toml").read_text().replace('model = "vgg16"\ngpus = 512',
                                                                'model = "vgg19"\ngpus = 512')
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match="names model 'vgg19'"):
        R.load_table(str(bad))
