"""hpcdp.failure's pure parts, in one process: messages, the non-finite guard, the
fault-hook parser, config skew, signals, and the one-rank policy."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import config_from_dict, load_config
from hpcdp.failure.agreement import Agreement, JobError, agree, allgather_rows, on_root, stage
from hpcdp.failure.inject import Faults, parse
from hpcdp.failure.nonfinite import NonFiniteError, NonFiniteGuard
from hpcdp.failure.policy import note_step, report_failure
from hpcdp.failure.ranks import fmt_ranks
from hpcdp.failure.signals import Interrupted, handling_signals, on_stop_signal
from hpcdp.failure.skew import config_differences, config_text
from hpcdp.metrics import strict_json
from hpcdp.optim import SGD


def test_rank_lists_are_written_as_ranges():
    assert fmt_ranks([3]) == "rank 3"
    assert fmt_ranks([5, 0, 1, 2]) == "ranks 0-2, 5"
    assert fmt_ranks([1, 3]) == "ranks 1, 3"


def test_fault_spec_parses_and_rejects_typos():
    assert parse("1:5:raise, 0:0:memory") == {(1, 5): "raise", (0, 0): "memory"}
    assert parse("") == {}
    for bad in ("1:5", "x:1:raise", "1:2:explode"):
        with pytest.raises(ValueError, match="RANK:STEP:KIND"):
            parse(bad)
    f = Faults(1, "1:3:raise,0:3:exit")
    f.fire(2)  # nothing at step 2
    with pytest.raises(RuntimeError, match="injected fault.*raise on rank 1 at step 3"):
        f.fire(3)
    nan = Faults(0, "0:2:nan")
    assert nan.poisons(2) and not nan.poisons(1) and not f.poisons(3)


def test_nan_fault_poisons_the_gradient_before_the_strategy_reduces_it():
    """The NaN enters through the loss weight, so it is in the gradient that backward
    hands to the strategy (a DDP allreduce that finished inside backward carries it to
    every rank), not written into an already reduced gradient on one rank."""
    from hpcdp.autograd import Tensor
    from hpcdp.failure.steps import StepChecks
    from hpcdp.nn import MLP
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies.base import SingleRank
    from hpcdp.world import World

    model = MLP([3, 4, 2], seed=0, dtype="float64")
    opt = SGD(model.flat.numel, lr=0.1, momentum=0.0, dtype="float64")
    strategy = SingleRank()
    strategy.setup(model.flat, opt, World(comm=None, rank=0, size=1))
    seen = []
    checks = StepChecks("skip", 0, opt)
    checks.faults = Faults(0, "0:2:nan")
    x, y = np.ones((2, 3)), np.array([0, 1])
    fetch = lambda idx: (Tensor(x[idx]), Tensor(y[idx]))  # noqa: E731
    before = model.flat.data.copy()
    for step in (1, 2):
        train_step(model, strategy, LocalBatch([np.arange(2)], 2, np.arange(1)), fetch,
                   after_backward=lambda m: seen.append(np.isnan(model.flat.grad).all()),
                   checks=checks.at(step))
        if step == 1:
            after_one = model.flat.data.copy()
    assert seen == [False, True]
    assert not np.array_equal(after_one, before)             # step 1 applied
    assert np.array_equal(model.flat.data, after_one)        # step 2 skipped
    assert checks.stats()["nonfinite_skipped"] == 1.0


# -- non-finite guard -----------------------------------------------------------------

def _sgd():
    return SGD(4, lr=0.5, momentum=0.9, dtype="float64")


def test_stop_names_the_step_and_the_rank_for_a_nan_loss():
    g = NonFiniteGuard("stop", rank=3)
    g.check_loss(6, 1.25)  # finite: nothing
    with pytest.raises(NonFiniteError, match=r"non-finite loss \(nan\) at step 7 on rank 3.*on_nonfinite"):
        g.check_loss(7, float("nan"))


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e200])  # 1e200**2 overflows: not usable either
def test_stop_refuses_a_non_finite_gradient_before_the_optimizer_touches_anything(bad):
    opt, g = _sgd(), NonFiniteGuard("stop", rank=1)
    g.guard(opt)
    param = np.ones(4)
    g.check_loss(2, 0.5)
    with pytest.raises(NonFiniteError, match="non-finite gradient norm .*at step 2 on rank 1"):
        opt.step(param, np.array([0.0, bad, 0.0, 0.0]))
    assert np.array_equal(param, np.ones(4))


def test_skip_leaves_parameters_and_optimizer_state_untouched_and_counts():
    opt, g = _sgd(), NonFiniteGuard("skip", rank=0)
    g.guard(opt)
    param = np.ones(4)
    opt.step(param, np.full(4, 0.1))            # a normal update
    after_one, state = param.copy(), opt.state["momentum_buf"].copy()
    g.check_loss(2, float("inf"))               # skip mode: the loss alone does not stop
    opt.step(param, np.array([1.0, np.nan, 0.0, 0.0]))
    assert np.array_equal(param, after_one) and np.array_equal(opt.state["momentum_buf"], state)
    assert g.stats() == {"nonfinite_skipped": 1.0} and g.stats() == {"nonfinite_skipped": 0.0}
    opt.step(param, np.full(4, 0.1))            # and training goes on
    assert not np.array_equal(param, after_one)
    assert NonFiniteGuard("stop").stats() == {}  # the column exists only in skip mode


def test_metrics_records_are_strict_json():
    import json
    rec = {"loss": float("nan"), "ranks": {"x": [1.0, float("inf"), 2]}, "n": 3}
    text = json.dumps(strict_json(rec), allow_nan=False)
    assert json.loads(text) == {"loss": None, "ranks": {"x": [1.0, None, 2]}, "n": 3}


# -- config -----------------------------------------------------------------------------

@pytest.mark.parametrize("sets, msg", [
    (["optim.lr=inf"], r"optim\.lr: inf is out of range; must be a finite number"),
    (["optim.lr=nan"], r"optim\.lr: nan is out of range"),
    (["optim.weight_decay=inf"], r"optim\.weight_decay: inf .*finite"),
    (["train.on_nonfinite=ignore"], r"train\.on_nonfinite: 'ignore' is not allowed; choose one of 'stop', 'skip'"),
    (["comm.setup_timeout=0"], r"comm\.setup_timeout: 0\.0 is out of range"),
])
def test_config_refuses_non_finite_rates_and_unknown_policies(sets, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, sets)


def test_config_skew_names_each_differing_key_and_ignores_per_node_paths():
    npz = "data.kind=npz"
    a = load_config(None, [npz, "train.steps=30", "run.log_every=5", 'data.path="/node0/d.npz"'])
    b = load_config(None, [npz, "train.steps=40", "run.log_every=5", 'data.path="/node1/d.npz"'])
    c = load_config(None, [npz, "train.steps=30", "run.log_every=7", 'data.path="/node0/d.npz"'])
    assert config_text(a) != config_text(b)
    assert config_text(a) == config_text(load_config(None, [npz, "train.steps=30", "run.log_every=5",
                                                            'data.path="/elsewhere/d.npz"']))
    msg = config_differences([config_text(a), config_text(b), config_text(c)])
    assert "train.steps = 30 on ranks 0, 2, 40 on rank 1" in msg
    assert "run.log_every = 5 on ranks 0-1, 7 on rank 2" in msg
    assert "data.path" not in msg


# -- agreement and policy on one rank -----------------------------------------------------

def test_one_rank_stage_turns_an_error_into_the_same_message():
    with pytest.raises(JobError, match=r"^data\.path: nope$") as e:
        with stage(None, "setup", timeout=1.0):
            raise ConfigError("data.path: nope")
    assert isinstance(e.value, ConfigError) and e.value.failed == {0: "data.path: nope"}
    assert agree(None, None, what="x", timeout=1.0) == []
    assert on_root(None, lambda: "runs/a", what="x", timeout=1.0) == "runs/a"
    with pytest.raises(JobError, match="out of memory"):
        on_root(None, lambda: (_ for _ in ()).throw(MemoryError()), what="x", timeout=1.0)


def test_one_rank_agreement_in_either_wording():
    """The one helper, both wordings, on one rank (no communicator): the error type, the
    cause's line, the chain to the exception, the root's value kept or shared."""
    class Mine(ValueError):
        pass
    lowest = Agreement(Mine, lowest=True, private=False)
    with pytest.raises(Mine, match=r"^disk full$") as e:
        lowest.all_ok(None, lambda: (_ for _ in ()).throw(OSError("disk full")), timeout=1.0)
    assert isinstance(e.value.__cause__, OSError) and e.value.failed == {0: "disk full"}
    with pytest.raises(Mine, match=r"^KeyError: 'x'$"):  # a bug: its type in the line
        lowest.on_root(None, lambda: {}["x"], timeout=1.0, share=False)
    assert lowest.on_root(None, lambda: 5, timeout=1.0, share=False) == 5
    assert lowest.all_ok(None, lambda: "ok", timeout=1.0) == "ok"
    with pytest.raises(JobError, match=r"^the text$"):
        Agreement().agree(None, "the text", timeout=1.0)
    rows = np.arange(6).reshape(3, 2)
    assert [r.tolist() for r in allgather_rows(None, rows)] == [rows.tolist()]


def test_one_rank_policy_statuses_and_lines(capsys):
    try:
        raise RuntimeError("boom")
    except RuntimeError as caught:
        e = caught
    note_step(e, 7)
    assert report_failure(e) == 1
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1  # a bug: its traceback, once
    assert err.strip().splitlines()[-1] == "hpcdp: error: at step 7: RuntimeError: boom"
    assert report_failure(ValueError("data.kind: bad")) == 2
    assert capsys.readouterr().err == "hpcdp: error: data.kind: bad\n"
    assert report_failure(Interrupted(signal.SIGINT)) == 130
    assert capsys.readouterr().err == "hpcdp: error: stopped by SIGINT\n"


def test_the_step_the_survivors_agreed_on_is_the_one_named(capsys):
    """A rank that saw a lost rank a step later (the loop notes its own step) names the
    step the survivors agreed on (hpcdp.failure.lasting.RankLossEnds)."""
    from hpcdp.failure.lasting import RankLossEnds

    e = RankLossEnds("rank 2 lost at step 5: 5 rank(s) left, below failure.min_world = 6; the job ends",
                     [0, 1, 3, 4, 5], step=5)
    note_step(e, 6)
    assert report_failure(e) == 1
    assert capsys.readouterr().err == ("hpcdp: error: at step 5: rank 2 lost at step 5: 5 rank(s) left, "
                                       "below failure.min_world = 6; the job ends\n")


def test_signals_raise_interrupted_unless_a_graceful_handler_takes_them():
    with handling_signals():
        with pytest.raises(Interrupted, match="stopped by SIGTERM") as e:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        assert e.value.exit_status == 143
        seen = []
        undo = on_stop_signal(lambda s: seen.append(s) or True)
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(1000):
            pass
        undo()
        assert seen == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the program's handlers are back


def test_config_from_dict_keeps_on_nonfinite():
    cfg = config_from_dict({"train": {"steps": 3, "on_nonfinite": "skip"}})
    assert cfg.train.on_nonfinite == "skip"


def test_drain_output_waits_until_the_launcher_has_read_the_pipe():
    """Before MPI_Abort the failing rank waits for its error line to leave the pipe (the
    launcher kills every rank on an abort and dropped unread lines under load)."""
    import subprocess
    import sys
    import time

    code = ("import sys, time; from hpcdp.failure.ranks import drain_output\n"
            "sys.stderr.write('hpcdp: error: x\\n'); t = time.monotonic(); drain_output(limit=5.0)\n"
            "print(f'{time.monotonic() - t:.3f}', flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # the "launcher" reads stderr only after a second
    err = proc.stderr.read()
    waited = float(proc.stdout.read().decode())
    proc.wait(timeout=30)
    assert err == b"hpcdp: error: x\n"
    assert 0.5 < waited < 5.0, waited  # it waited for the read, not for its limit
    # nobody reading: it gives up after its limit, never hangs
    proc = subprocess.Popen([sys.executable, "-c", code.replace("limit=5.0", "limit=0.3")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()  # stderr stays unread until the child has exited
    proc.wait(timeout=30)
    assert proc.stderr.read() == b"hpcdp: error: x\n"
    assert 0.25 < float(out.decode()) < 2.0
