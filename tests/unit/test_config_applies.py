"""Keys the run does not read are refused (or, for other strategies' tables in the
config file, named in one warning line): hpcdp/config_applies.py, docs/user-guide.md
"Keys that do not apply"."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from hpcdp.config import config_from_dict, dump_toml, load_config, register_parallel_config
from hpcdp.config_error import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sets, message", [
    (["data.path=mydata.npz"], r"data\.path: 'mydata\.npz' is not read by this run: data\.kind is 'digits' "
                               r"\(it is read when data\.kind is 'npz', 'hdf5', 'npy', 'tokens'\)"),
    (["parallel.zero.stage=3"], r"parallel\.zero\.stage: parallel\.strategy is 'ddp', which does not read "
                                r"\[parallel\.zero\]; set parallel\.strategy = \"zero\""),
    (['parallel.zero.shard="node"'], r"parallel\.zero\.shard: parallel\.strategy is 'ddp'"),
    (["parallel.strategy=zero", "parallel.ps.servers=2"], r"parallel\.ps\.servers: parallel\.strategy is 'zero'"),
    (["optim.betas=[0.9, 0.95]"], r"optim\.betas: .* optim\.kind is 'sgd' \(it is read when optim\.kind is "
                                  r"'adamw'\)"),
    (["optim.kind=adamw", "optim.momentum=0.5"], r"optim\.momentum: 0\.5 is not read"),
    (["model.n_layer=4"], r"model\.n_layer: 4 is not read by this run: model\.kind is 'mlp'"),
    (["data.n_samples=4096"], r"data\.n_samples: 4096 is not read"),  # --set: refused even at the default
    (["checkpoint.keep=2"], r"checkpoint\.keep: 2 is not read by this run: checkpoint\.enabled is False"),
    (["train.exact_micro_batch=8"], r"train\.exact_micro_batch: 8 is not read.*train\.reproducible is 'fast'"),
    (["parallel.strategy=zero", "parallel.zero.stage=3", "parallel.zero.bucket_mb=4"],
     r"parallel\.zero\.bucket_mb: 4\.0 is not read by this run: parallel\.zero\.stage is 3"),
])
def test_a_key_the_run_does_not_read_is_an_error(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets)


def test_keys_read_by_the_chosen_kind_pass():
    cfg = load_config(None, ["optim.kind=adamw", "optim.betas=[0.9, 0.95]", "checkpoint.every=5",
                             "checkpoint.keep=2", "data.kind=synthetic_classification", "data.n_samples=100",
                             "model.sizes=[32, 8, 8]"])
    assert cfg.warnings == []
    # gelu: read by a GPT, and by an MLP only with the gelu activation
    assert load_config(None, ["model.activation=gelu", 'model.gelu="exact"']).model.gelu == "exact"
    with pytest.raises(ConfigError, match=r"model\.gelu: .*model\.kind is 'mlp'.*; model\.activation is 'relu'"):
        load_config(None, ['model.gelu="exact"'])


def test_a_file_with_unread_values_is_refused_but_a_resolved_config_reruns(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[data]\nkind = "digits"\nn_samples = 100\n')
    with pytest.raises(ConfigError, match=r"data\.n_samples: 100 is not read"):
        load_config(job)
    # a resolved config.toml carries every key (unread ones at their defaults): it reruns
    resolved = tmp_path / "config.toml"
    resolved.write_text(dump_toml(load_config(None).to_dict()))
    assert load_config(resolved).warnings == []
    resolved.write_text(dump_toml(load_config(ROOT / "jobs/gpt_ddp.toml").to_dict()))
    assert load_config(resolved).warnings == []


def test_other_strategies_tables_in_the_file_are_one_warning_line(tmp_path):
    cfg = load_config(ROOT / "jobs/gpt_zero3.toml", ["parallel.strategy=ddp"])
    assert cfg.parallel.strategy == "ddp"
    assert len(cfg.warnings) == 1
    assert cfg.warnings[0].startswith("warning: the config file's [parallel.zero] (overlap, prefetch, stage) "
                                      "(parallel.strategy is 'ddp'): not read by this run")
    # the chosen strategy's options for another stage, from the file: in the same one line
    job = tmp_path / "job.toml"
    job.write_text('[parallel]\nstrategy = "zero"\n[parallel.zero]\nstage = 3\nbucket_mb = 4.0\n'
                   '[parallel.ps]\nservers = 2\n')
    (line,) = load_config(job).warnings
    assert "parallel.zero.bucket_mb (parallel.zero.stage is 3)" in line
    assert "[parallel.ps] (servers) (parallel.strategy is 'zero')" in line
    # every shipped job loads without an error; only what a shared file carries is warned about
    for path in sorted((ROOT / "jobs").glob("*.toml")):
        assert load_config(path).warnings == [], path


def test_a_new_strategy_declares_what_it_reads_in_one_place():
    @register_parallel_config("unit_applies")
    @dataclass
    class Opts:
        APPLIES: ClassVar[dict] = {"outer_lr": ("parallel.unit_applies.outer", (True,))}
        ALSO_READS: ClassVar[tuple] = ("ddp",)
        outer: bool = False
        outer_lr: float = 0.7

    cfg = load_config(None, ["parallel.strategy=unit_applies", "parallel.ddp.bucket_mb=2",
                             "parallel.unit_applies.outer=true", "parallel.unit_applies.outer_lr=0.5"])
    assert cfg.parallel.sub("ddp").bucket_mb == 2.0 and cfg.warnings == []
    with pytest.raises(ConfigError, match=r"parallel\.unit_applies\.outer_lr: 0\.5 is not read by this run: "
                                          r"parallel\.unit_applies\.outer is False"):
        load_config(None, ["parallel.strategy=unit_applies", "parallel.unit_applies.outer_lr=0.5"])


def test_stored_configs_are_not_checked():
    """A checkpoint's stored config (config_from_dict) is read as it was written."""
    cfg = config_from_dict(tomllib.loads('[data]\nkind = "digits"\nn_samples = 100\n'))
    assert cfg.data.n_samples == 100


def _hpcdp(cwd, *args, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "hpcdp.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_new_users_commands_end_with_one_line_and_no_run(tmp_path):
    """The issue's commands: a data file that does not exist, ZeRO options under DDP."""
    for sets in (["data.path=mydata.npz", "train.steps=2"], ["parallel.zero.stage=3", "train.steps=2"],
                 ["data.kind=npz", 'data.path="mydata.npz"', "train.steps=2"],
                 ["data.kind=npz", 'data.path="x.npz"', 'data.test_path="missing.npz"', "train.steps=2"]):
        if "x.npz" in sets[1]:
            import numpy as np
            np.savez(tmp_path / "x.npz", x=np.zeros((8, 64), np.float32), y=np.zeros(8, np.int64))
        r = _hpcdp(tmp_path, "train", *[a for s in sets for a in ("--set", s)])
        assert r.returncode == 2, (sets, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpcdp: error: "), r.stderr
        assert ("mydata.npz" in lines[0] or "parallel.zero.stage" in lines[0]
                or "missing.npz" in lines[0]), lines[0]
        assert not (tmp_path / "runs").exists()


def test_a_study_passes_each_job_only_the_strategy_options_it_reads():
    """hpcdp scale / check-exact run several strategies with one list of --set: each job
    gets the options its strategy reads (hpcdp.launch.sets_for_job), the rest stay."""
    from hpcdp.launch import sets_for_job, train_command

    user = ['parallel.zero.shard="node"', "parallel.zero.bucket_mb=0.5", 'parallel.ddp.bucketing="size"',
            "train.steps=3"]
    ddp = sets_for_job(ROOT / "jobs/gpt_ddp.toml", user + ['parallel.strategy="ddp"'])
    assert ddp == ['parallel.ddp.bucketing="size"', "train.steps=3", 'parallel.strategy="ddp"']
    z3 = sets_for_job(ROOT / "jobs/gpt_ddp.toml", user + ['parallel.strategy="zero"', "parallel.zero.stage=3"])
    assert z3 == ['parallel.zero.shard="node"', "train.steps=3", 'parallel.strategy="zero"',
                  "parallel.zero.stage=3"]
    assert "parallel.zero.bucket_mb=0.5" not in train_command(ROOT / "jobs/gpt_ddp.toml", user)
    # a bad key is not dropped: the job reports it
    assert sets_for_job(None, ["model.n_layer=2"]) == ["model.n_layer=2"]
    # in-process, a study loads its config leniently and is told what its job would not read
    cfg = load_config(ROOT / "jobs/gpt_ddp.toml", user, shared_options=True)
    assert cfg.unread_options == ["parallel.zero.bucket_mb", "parallel.zero.shard"]


def test_a_files_key_left_unread_by_a_set_switch_is_a_warning(tmp_path):
    """An exact job's file run with --set train.reproducible=fast: its exact_micro_batch
    was written for the other setting (a warning); the same key in a fast file is an error."""
    job = tmp_path / "exact.toml"
    job.write_text('[train]\nsteps = 4\nreproducible = "exact"\nexact_micro_batch = 2\nglobal_batch = 8\n')
    (line,) = load_config(job, ['train.reproducible="fast"']).warnings
    assert "train.exact_micro_batch (train.reproducible is 'fast')" in line
    job.write_text('[train]\nsteps = 4\nexact_micro_batch = 2\nglobal_batch = 8\n')
    with pytest.raises(ConfigError, match=r"train\.exact_micro_batch: 2 is not read"):
        load_config(job)
