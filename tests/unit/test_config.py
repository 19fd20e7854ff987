"""Config: defaults, validation errors that name the key, --set overrides, round trip."""

import tomllib

import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import (
    Config, config_from_dict, dump_toml, load_config, parse_override,
)


def test_default_config_is_the_digits_mlp_under_ddp():
    cfg = load_config(None)
    assert cfg.model.kind == "mlp" and cfg.data.kind == "digits"
    assert cfg.parallel.strategy == "ddp"  # the built-in job runs on any rank count
    # seeds left at -1 follow run.seed
    assert cfg.model.seed == cfg.run.seed == cfg.data.seed == 0


def test_a_file_that_names_no_strategy_gets_none(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nsteps = 3\n")
    assert load_config(path).parallel.strategy == "none"


@pytest.mark.parametrize("raw, message", [
    ({"optim": {"kind": "adam"}}, r"optim\.kind: 'adam' is not allowed; choose one of 'sgd', 'adamw'"),
    ({"optim": {"lr": 0.0}}, r"optim\.lr: 0\.0 is out of range; allowed \(0\.0, inf\]"),
    ({"optim": {"lr": "fast"}}, r"optim\.lr: expected a number, found 'fast'"),
    ({"optim": {"betas": [0.9]}}, r"optim\.betas: needs exactly 2"),
    ({"optim": {"betas": [0.9, 1.0]}}, r"optim\.betas\[1\]: 1\.0 is out of range"),
    ({"optim": {"learning_rate": 0.1}}, r"optim\.learning_rate: unknown key; optim accepts kind, lr"),
    ({"optimizer": {"lr": 0.1}}, r"optimizer: unknown section; sections are run, model"),
    ({"run": {"dtype": "float16"}}, r"run\.dtype: 'float16' is not allowed; choose one of 'float32', 'float64'"),
    ({"run": {"seed": True}}, r"run\.seed: expected an integer, found True"),
    ({"train": {"steps": 10, "epochs": 2}}, r"train\.steps / train\.epochs: set exactly one"),
    ({"train": {"last_batch": "pad"}}, r"train\.last_batch: 'pad' is not allowed; choose one of 'drop', 'keep'"),
    ({"model": {"sizes": [64]}}, r"model\.sizes: needs at least 2 entries"),
    ({"model": {"sizes": [64, 0, 10]}}, r"model\.sizes\[1\]: 0 is out of range"),
    ({"model": {"kind": "gpt", "n_embd": 30, "n_head": 4}}, r"model\.n_embd: 30 must be divisible by model\.n_head"),
    ({"data": {"kind": "npz"}}, r"data\.path: required for data\.kind = 'npz'"),
    ({"data": {"kind": "csv"}}, r"data\.kind: 'csv' is not allowed; choose one of 'digits'"),
    ({"model": {"kind": "gpt"}}, r"data\.kind: 'digits' is a classification set; model\.kind = 'gpt'"),
    ({"parallel": {"nosuch": {"a": 1}}}, r"parallel\.nosuch: unknown key; parallel accepts strategy"),
    ({"comm": {"timeout": -1}}, r"comm\.timeout: -1\.0 is out of range"),
    ({"comm": {"timeout": float("inf")}}, r"comm\.timeout: inf is out of range; allowed \[1, 604800\] seconds"),
    ({"comm": {"timeout": 1e-9}}, r"comm\.timeout: 1e-09 is out of range; allowed \[1, 604800\] seconds"),
    ({"comm": {"setup_timeout": float("nan")}}, r"comm\.setup_timeout: nan is out of range"),
    ({"parallel": {"strategy": "ddp", "ddp": {"comm_dtype": "int8"}}},
     r"parallel\.ddp\.comm_dtype: 'int8' is not allowed; choose one of 'float32', 'float16', 'bfloat16'"),
    ({"parallel": {"strategy": "ddp", "ddp": {"comm_dtype": "bfloat16", "algorithm": "native"}}},
     r"parallel\.ddp\.comm_dtype = 'bfloat16' needs parallel\.ddp\.algorithm = \"ring\" or \"auto\" "
     r"\(got 'native'\)"),
    ({"parallel": {"strategy": "zero", "zero": {"comm_dtype": "float16", "algorithm": "native"}}},
     r"parallel\.zero\.comm_dtype = 'float16' needs parallel\.zero\.algorithm = \"ring\" or \"auto\""),
    ({"train": {"reproducible": "exact"}, "parallel": {"strategy": "ddp", "ddp": {"comm_dtype": "bfloat16"}}},
     r"parallel\.ddp\.comm_dtype: 'bfloat16' cannot be exact"),
    ({"train": {"reproducible": "exact"}, "parallel": {"strategy": "zero", "zero": {"comm_dtype": "float16"}}},
     r"parallel\.zero\.comm_dtype: 'float16' cannot be exact"),
    ({"run": {"dtype": "float64"}, "parallel": {"strategy": "zero", "zero": {"comm_dtype": "bfloat16"}}},
     r"parallel\.zero\.comm_dtype: 'bfloat16' carries float32 gradients; run\.dtype is 'float64'"),
])
def test_bad_values_and_keys_name_the_dotted_key(raw, message):
    """(Also: the 16-bit wire's refusals, comm_dtype, at config time.)"""
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_setting_steps_switches_epochs_off_and_vice_versa():
    assert load_config(None, ["train.steps=7"]).train.epochs == 0
    cfg = load_config(None, ["train.steps=7", "train.epochs=0"])
    assert (cfg.train.steps, cfg.train.epochs) == (7, 0)
    assert load_config(None, ["train.epochs=3"]).train.steps == 0


def test_overrides_parse_toml_values_with_string_fallback():
    assert parse_override("optim.lr=0.05") == (["optim", "lr"], 0.05)
    assert parse_override("model.sizes=[64, 32, 10]") == (["model", "sizes"], [64, 32, 10])
    assert parse_override("optim.nesterov=true") == (["optim", "nesterov"], True)
    assert parse_override("run.name=my-run") == (["run", "name"], "my-run")  # not TOML: a string
    assert parse_override('run.name="quoted"') == (["run", "name"], "quoted")
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_override("lr=0.1")
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_override("optim.lr")


def test_overrides_apply_on_top_of_the_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[optim]\nkind = "adamw"\nlr = 0.001\n[train]\nsteps = 50\n')
    cfg = load_config(path, ["optim.lr=3e-4", "run.seed=5", "model.sizes=[64, 16, 10]"])
    assert cfg.optim.kind == "adamw" and cfg.optim.lr == 3e-4
    assert cfg.train.steps == 50 and cfg.train.epochs == 0
    assert cfg.run.seed == 5 and cfg.model.seed == 5
    assert cfg.model.sizes == [64, 16, 10]
    with pytest.raises(ConfigError, match=r"optim\.kind: 'rmsprop' is not allowed"):
        load_config(path, ["optim.kind=rmsprop"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim\nlr = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_written_config_reads_back_identical():
    cfg = load_config(None, ["run.name=round-trip", 'run.out_dir="a \\"dir\\" \\\\ x"', "optim.kind=adamw",
                             "optim.eps=1e-12", "optim.lr=0.1", "model.sizes=[64, 7, 10]",
                             "comm.debug=true"])
    text = dump_toml(cfg.to_dict())
    again = config_from_dict(tomllib.loads(text))
    assert again == cfg
    assert dump_toml(again.to_dict()) == text
    assert again.run.out_dir == 'a "dir" \\ x'


def test_dump_toml_writes_nested_tables_and_special_values():
    text = dump_toml({"a": {"x": 1.5, "s": "t\tab\n", "inf": float("inf"), "l": [1, 2]},
                      "p": {"strategy": "ddp", "ddp": {"bucket_mb": 25.0}}})
    back = tomllib.loads(text)
    assert back == {"a": {"x": 1.5, "s": "t\tab\n", "inf": float("inf"), "l": [1, 2]},
                    "p": {"strategy": "ddp", "ddp": {"bucket_mb": 25.0}}}
    assert "[p.ddp]" in text


def test_config_dataclasses_validate_when_built_in_code():
    from hpcdp.config import OptimConfig
    with pytest.raises(ConfigError, match=r"optim\.momentum"):
        OptimConfig(momentum=1.5)
    assert Config().optim.kind == "sgd"


def test_a_strategy_registers_its_own_sub_table():
    from dataclasses import dataclass

    from hpcdp.config import register_parallel_config

    @register_parallel_config("unit_test_strategy")
    @dataclass
    class Opts:
        width: int = 3
        mode: str = "a"

        def __post_init__(self):
            if self.mode not in ("a", "b"):
                raise ConfigError(f"parallel.unit_test_strategy.mode: {self.mode!r} is not allowed")

    cfg = load_config(None, ["parallel.strategy=unit_test_strategy", "parallel.unit_test_strategy.width=7"])
    assert cfg.parallel.sub() == Opts(width=7)
    text = dump_toml(cfg.to_dict())
    assert "[parallel.unit_test_strategy]\nwidth = 7" in text
    assert config_from_dict(tomllib.loads(text)) == cfg
    # the chosen strategy's options appear with defaults even when not written
    assert load_config(None, ["parallel.strategy=unit_test_strategy"]).parallel.sub() == Opts()
    with pytest.raises(ConfigError, match=r"parallel\.unit_test_strategy\.depth: unknown key"):
        load_config(None, ["parallel.unit_test_strategy.depth=1"])
    with pytest.raises(ConfigError, match=r"parallel\.unit_test_strategy\.width: expected an integer"):
        load_config(None, ["parallel.unit_test_strategy.width=1.5"])
    with pytest.raises(ConfigError, match=r"parallel\.unit_test_strategy\.mode: 'c' is not allowed"):
        load_config(None, ["parallel.unit_test_strategy.mode=c"])


def test_parsing_strategy_options_imports_no_strategy_code():
    """Strategy options are plain data (hpcdp/config_parallel.py): parsing them must
    not import hpcdp.strategies (nor MPI)."""
    import subprocess
    import sys
    code = ("import sys; from hpcdp.config import config_from_dict; "
            "c = config_from_dict({'parallel': {'strategy': 'ps', 'ps': {'servers': 2}, "
            "'ddp': {'bucketing': 'per_param'}}}); "
            "assert c.parallel.sub().servers == 2 and c.parallel.sub('ddp').bucketing == 'per_param'; "
            "bad = [m for m in sys.modules if m.startswith(('hpcdp.strategies', 'mpi4py'))]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_literal_choices_name_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"parallel\.ddp\.bucketing: 'per_layer' is not allowed; "
                                          r"choose one of 'size', 'per_param'"):
        load_config(None, ["parallel.ddp.bucketing=per_layer"])
    with pytest.raises(ConfigError, match=r"parallel\.ps\.mode: 'eventually' is not allowed; "
                                          r"choose one of 'sync', 'async'"):
        load_config(None, ["parallel.strategy=ps", "parallel.ps.mode=eventually"])


def test_a_16bit_wire_is_accepted_on_the_ring_and_auto():
    for strategy in ("ddp", "zero"):
        for algorithm in ("ring", "auto"):
            cfg = config_from_dict({"parallel": {"strategy": strategy, strategy: {
                "comm_dtype": "bfloat16", "algorithm": algorithm}}})
            assert cfg.parallel.sub().comm_dtype == "bfloat16"
    assert load_config(None).parallel.sub().comm_dtype == "float32"  # today's wire by default
