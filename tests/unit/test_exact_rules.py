"""Exact mode's bad input: clear errors before training that name the key to change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import config_from_dict

EXACT = {"reproducible": "exact", "steps": 5, "epochs": 0, "global_batch": 12}


@pytest.mark.parametrize("train, parallel, message", [
    ({"exact_micro_batch": 5}, {}, r"train\.exact_micro_batch: 5 does not divide train\.global_batch "
                                   r"= 12; .*divisors of 12: 1, 2, 3, 4, 6, 12"),
    ({"exact_micro_batch": 3, "grad_accum": 2}, {}, r"train\.grad_accum: exact mode cuts the global "
                                                    r"batch .* leave grad_accum = 1"),
    ({"exact_micro_batch": 3}, {"strategy": "ps", "ps": {"mode": "async"}},
     r"parallel\.ps\.mode: 'async' cannot be exact"),
    ({"exact_micro_batch": 3}, {"strategy": "ps", "ps": {"aggregate": "mean"}},
     r"parallel\.ps\.aggregate: exact mode sums integers"),
    ({"reproducible": "bitwise"}, {}, r"train\.reproducible: 'bitwise' is not allowed; choose one of "
                                      r"'fast', 'exact'"),
])
def test_bad_exact_configs_are_clear_errors(train, parallel, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"train": {**EXACT, **train}, "parallel": parallel})


def test_exact_micro_batch_is_chosen_when_unset_and_an_explicit_one_wins():
    from hpcdp.config import choose_micro_batch

    cfg = config_from_dict({"train": EXACT})  # global_batch 12, no micro-batch set
    assert cfg.train.exact_micro_batch == 3 and cfg.train.exact_micro_chosen
    cfg = config_from_dict({"train": {**EXACT, "exact_micro_batch": 6}})
    assert cfg.train.exact_micro_batch == 6 and not cfg.train.exact_micro_chosen
    # every requested rank count holds a micro-batch, with an even load where one exists
    assert choose_micro_batch(16, [1, 2, 4]) == 4      # 4 micro-batches: 4, 2, 1 per rank
    assert choose_micro_batch(16, [1, 2, 3, 4]) == 4   # no count divides by 3 and 4: the largest
    assert choose_micro_batch(16, [8]) == 2            # 8 ranks need 8 micro-batches
    assert choose_micro_batch(12, [1, 2, 3]) == 2      # 6 = lcm(1, 2, 3): even load beats size 3
    assert choose_micro_batch(64) == 16 and choose_micro_batch(1) == 1
    assert choose_micro_batch(4, [8]) == 1             # more ranks than samples: 1 (some hold none)


def test_good_exact_config_and_fast_default():
    cfg = config_from_dict({"train": {**EXACT, "exact_micro_batch": 4}, "parallel": {"strategy": "ps"}})
    assert cfg.train.reproducible == "exact" and cfg.train.exact_micro_batch == 4
    assert config_from_dict({}).train.reproducible == "fast"


def test_unsupported_strategy_is_an_error_before_step_1():
    from mpi4py import MPI

    from hpcdp.exact.mode import ExactMode
    from hpcdp.nn import MLP
    from hpcdp.strategies.base import SingleRank
    from hpcdp.world import World

    class Other(SingleRank):  # a strategy whose collectives cannot carry a gradient codec
        name = "mine"

        def set_grad_codec(self, codec):
            raise NotImplementedError("its reductions are float only")

    m = MLP([4, 3], seed=0)
    strategy = Other()
    world = World(comm=MPI.COMM_SELF, rank=0, size=1)
    strategy.setup(m.flat, None, world)
    cfg = config_from_dict({"train": {**EXACT, "exact_micro_batch": 4}})
    with pytest.raises(ConfigError, match=r"parallel\.strategy: 'mine' has no exact mode yet"):
        ExactMode(cfg.train, strategy, world, m.flat)


def test_cli_exits_2_with_the_message_before_training(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "train", "--set", "train.steps=2",
                           "--set", "train.epochs=0", "--set", 'train.reproducible="exact"',
                           "--set", "train.exact_micro_batch=5", "--set", f'run.out_dir="{tmp_path}/r"'],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "train.exact_micro_batch: 5 does not divide train.global_batch = 64" in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing started, nothing written
