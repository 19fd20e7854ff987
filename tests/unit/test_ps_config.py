"""[parallel.ps] options: parsed from TOML dicts, bad values are errors naming the key."""

import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import config_from_dict


def ps(**opts):
    return config_from_dict({"parallel": {"strategy": "ps", "ps": opts}}).parallel.sub()


def test_defaults_and_staleness_spellings():
    c = ps()
    assert (c.servers, c.colocated, c.mode, c.k, c.update, c.aggregate) == (1, True, "sync", 0, "server", "sum")
    assert ps(staleness=4).k == 4
    assert ps(staleness="none").k is None and ps(staleness="unbounded").staleness == "none"
    assert c.stale_lr == "relative" and ps(stale_lr="inverse").stale_lr == "inverse"


@pytest.mark.parametrize("opts, msg", [
    ({"staleness": -1}, "parallel.ps.staleness: k = -1 is negative"),
    ({"staleness": "soon"}, "parallel.ps.staleness"),
    ({"servers": 0}, "parallel.ps.servers"),
    ({"mode": "eventually"}, "parallel.ps.mode"),
    ({"update": "both"}, "parallel.ps.update"),
    ({"aggregate": ""}, "parallel.ps.aggregate"),
    ({"shards": 2}, "parallel.ps.shards: unknown key"),
    ({"stale_lr": "half"}, "parallel.ps.stale_lr: 'half' is not allowed; choose one of 'relative'"),
])
def test_bad_options(opts, msg):
    with pytest.raises(ConfigError, match=msg):
        ps(**opts)


def test_build_reports_a_bad_aggregation_as_config_error():
    from hpcdp.strategies import build_strategy
    cfg = config_from_dict({"parallel": {"strategy": "ps", "ps": {"aggregate": "nowhere_mod_q:f"}}})
    with pytest.raises(ConfigError, match="cannot import module"):
        build_strategy(cfg.parallel)
