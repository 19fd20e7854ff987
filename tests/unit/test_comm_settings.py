"""The [comm] settings (hpcdp.comm.core.settings): the config's values, environment
variables that override them (logged once per process), bad values named."""

import logging

import pytest

from hpcdp.comm.core import settings as S
from hpcdp.config import CommConfig
from hpcdp.config_error import ConfigError

ENV = ("HPCDP_COMM_ENGINE", "HPCDP_COMM_LEAN", "HPCDP_COMM_PROGRESS", "HPCDP_PROFILE",
       "HPCDP_RANKS_PER_NODE", "HPCDP_CUDA_AWARE", "HPCDP_DEBUG", "HPCDP_COMM_TIMEOUT",
       "HPCDP_ALLREDUCE_CROSSOVER", "HPCDP_REDUCE_SCATTER_CROSSOVER", "HPCDP_ALL_GATHER_CROSSOVER")


@pytest.fixture
def clean(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    S._STATE["told"].clear()
    yield
    monkeypatch.undo()
    S.configure(None)


def test_the_config_is_what_the_settings_say(clean):
    s = S.configure(CommConfig(algorithm="recursive", all_gather="bruck", engine="python",
                               ranks_per_node=2, allreduce_crossover=4096, timeout=7.5))
    assert [s.algorithm(c) for c in S.COLLECTIVES] == ["recursive", "recursive", "bruck"]
    assert (s.engine, s.ranks_per_node, s.crossover["allreduce"], s.timeout) == ("python", 2, 4096, 7.5)
    assert s.overridden == () and S.settings() is s
    g = S.generation()
    S.reload()
    assert S.generation() == g + 1  # cached decisions elsewhere are made again


def test_an_environment_variable_overrides_and_is_logged_once(clean, monkeypatch, caplog):
    monkeypatch.setenv("HPCDP_COMM_ENGINE", "python")
    monkeypatch.setenv("HPCDP_ALLREDUCE_CROSSOVER", "65536")
    with caplog.at_level(logging.INFO, logger="hpcdp.comm"):
        s = S.configure(CommConfig(engine="compiled"))
        S.reload()
        S.configure(CommConfig())
    assert (s.engine, s.crossover["allreduce"]) == ("python", 65536)
    assert set(s.overridden) == {"engine", "allreduce_crossover"}
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("hpcdp.comm: HPCDP_COMM_ENGINE=python overrides [comm] engine = 'compiled'") == 1
    assert sum("HPCDP_ALLREDUCE_CROSSOVER=65536 overrides [comm] allreduce_crossover" in x
               for x in lines) == 1


@pytest.mark.parametrize("var,raw,message", [
    ("HPCDP_COMM_ENGINE", "fast", "HPCDP_COMM_ENGINE must be one of ('compiled', 'python'), got 'fast'"),
    ("HPCDP_RANKS_PER_NODE", "two", "HPCDP_RANKS_PER_NODE must be a whole number >= 1, got 'two'"),
    ("HPCDP_COMM_TIMEOUT", "-1", "HPCDP_COMM_TIMEOUT must be > 0 seconds, got '-1'"),
    ("HPCDP_ALL_GATHER_CROSSOVER", "1e6", "HPCDP_ALL_GATHER_CROSSOVER must be an integer byte count"),
])
def test_a_bad_override_is_named(clean, monkeypatch, var, raw, message):
    monkeypatch.setenv(var, raw)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        S.reload()


@pytest.mark.parametrize("key,value,message", [
    ("algorithm", "bruck", "comm.algorithm: 'bruck' is not allowed"),
    ("reduce_scatter", "bruck", "comm.reduce_scatter: 'bruck' is not allowed"),
    ("engine", "gpu", "comm.engine: 'gpu' is not allowed"),
    ("ranks_per_node", -1, "comm.ranks_per_node: -1 is out of range"),
])
def test_bad_config_values_are_refused(key, value, message):
    with pytest.raises(ConfigError, match=message):
        CommConfig(**{key: value})
