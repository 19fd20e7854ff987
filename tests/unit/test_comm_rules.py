"""Pure logic of hpcdp.comm without MPI ranks: chunk rule, ring schedule, byte
formulas, ledger arithmetic, ops, message pieces."""

import numpy as np
import pytest

from hpcdp.comm.auto import choose, choose_allreduce, choose_scatter_gather, crossover_bytes, forget
from hpcdp.comm.core.ledger import Ledger
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.schedules.recursive import expected_bytes as rd_bytes
from hpcdp.comm.core.requests import MAX_MESSAGE_BYTES, pieces
from hpcdp.comm.ring import expected_bytes
from hpcdp.shard import shard_bounds


def ring_schedule(N, r):
    rs = [((r - t - 1) % N, (r - t - 2) % N) for t in range(N - 1)]
    ag = [((r - u) % N, (r - u - 1) % N) for u in range(N - 1)]
    return rs, ag


@pytest.mark.parametrize("N", range(1, 9))
def test_ring_schedule_reduces_every_chunk_once_per_rank(N):
    """Simulate the ring symbolically: which ranks' contributions each copy holds."""
    have = [[{r} for _ in range(N)] for r in range(N)]  # have[rank][chunk] = contributors
    for t in range(N - 1):
        msgs = [(r, ring_schedule(N, r)[0][t]) for r in range(N)]
        sent = {(r + 1) % N: set(have[r][sc]) for r, (sc, _) in msgs}
        for r, (_, rc) in msgs:
            have[r][rc] |= sent[r]
            assert rc == [sc for rr, (sc, _) in msgs if rr == (r - 1) % N][0]
    for r in range(N):
        assert have[r][r] == set(range(N)), "rank r must own chunk r fully reduced"
    for u in range(N - 1):
        msgs = [(r, ring_schedule(N, r)[1][u]) for r in range(N)]
        sent = {(r + 1) % N: set(have[r][sc]) for r, (sc, _) in msgs}
        for r, (_, rc) in msgs:
            have[r][rc] = sent[r]
    assert all(have[r][c] == set(range(N)) for r in range(N) for c in range(N))


@pytest.mark.parametrize("N", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 64, 1000, 1001])
def test_ring_bytes_formula(N, n):
    S = n * 4
    sizes = [s for _, s in shard_bounds(n, N)]
    total_sent = total_recv = 0
    for r in range(N):
        sent, recv = expected_bytes(n, N, r, 4)
        rs_s, rs_r = expected_bytes(n, N, r, 4, phases=("rs",))
        ag_s, ag_r = expected_bytes(n, N, r, 4, phases=("ag",))
        assert (sent, recv) == (rs_s + ag_s, rs_r + ag_r)
        if n % N == 0:  # the textbook numbers, exactly
            assert sent == recv == 2 * (N - 1) * S // N
            assert rs_s == ag_r == (N - 1) * S // N
        # uneven chunks: at most one element per chunk of rounding either way
        assert abs(sent - 2 * (N - 1) * S / N) <= 2 * 4
        assert sent == (2 * n - sizes[r] - sizes[(r + 1) % N]) * 4 if N > 1 else sent == 0
        total_sent += sent
        total_recv += recv
    assert total_sent == total_recv == 2 * (N - 1) * S  # what a PS moves, spread over all links


@pytest.mark.parametrize("N", range(1, 9))
def test_recursive_doubling_bytes(N):
    p = 1 << (N.bit_length() - 1)
    rounds = p.bit_length() - 1
    sent = [rd_bytes(100, N, r)[0] for r in range(N)]
    assert sorted(sent).count(rounds * 100) >= p - (N - p)
    assert sum(sent) == p * rounds * 100 + 2 * (N - p) * 100


def test_pieces_stay_below_limit():
    assert pieces(0, 8, 64) == []
    got = pieces(100, 8, 64)
    assert all(ln * 8 <= 64 for _, ln in got)
    assert sum(ln for _, ln in got) == 100 and got[0] == (0, 8)
    n = (3 << 30) // 4  # a 3 GiB float32 buffer
    big = pieces(n, 4, MAX_MESSAGE_BYTES)
    assert len(big) == 2 and all(ln * 4 < (1 << 31) for _, ln in big)


def test_ledger_totals_snapshot_delta_reset():
    led = Ledger()
    led.record("allreduce", 100, 80, 2, 2, calls=1)
    snap = led.snapshot()
    led.record("allreduce", 10, 20, 1, 1, calls=1)
    led.record("ps_push", 5, 0, 1, 0, calls=1)
    assert led.totals()["allreduce"] == {"calls": 2, "sent_bytes": 110, "recv_bytes": 100,
                                         "sent_msgs": 3, "recv_msgs": 3}
    assert led.delta(snap) == {
        "allreduce": {"calls": 1, "sent_bytes": 10, "recv_bytes": 20, "sent_msgs": 1, "recv_msgs": 1},
        "ps_push": {"calls": 1, "sent_bytes": 5, "recv_bytes": 0, "sent_msgs": 1, "recv_msgs": 0}}
    assert led.total_bytes() == (115, 100)
    led.reset()
    assert led.totals() == {}
    with pytest.raises(ValueError, match=">= 0"):
        led.record("x", -1)


def test_ops():
    a, b = np.array([1.0, 5.0]), np.array([3.0, 2.0])
    out = np.empty(2)
    resolve("max").reduce(out, a, b)
    assert out.tolist() == [3.0, 5.0]
    resolve(lambda x, y: x * y).reduce(out, a, b)
    assert out.tolist() == [3.0, 10.0]
    m = np.array([7, 8], dtype=np.int32)
    resolve("mean").finalize(m, 2)
    assert m.tolist() == [3, 4]  # floor division for integers
    with pytest.raises(ValueError, match="op must be one of"):
        resolve("prod")
    with pytest.raises(ValueError, match="elementwise"):
        resolve(lambda x, y: x.sum()).reduce(out, a, b)


def test_auto_choice(monkeypatch):
    """Per collective: MPI's own below the crossover, the ring from it on (the
    table in hpcdp.comm.auto); explicit names pass through; overrides per collective."""
    for name in ("allreduce", "reduce_scatter", "all_gather"):
        cross = crossover_bytes(name)
        assert choose(name, 8, 2) == "native"
        assert choose(name, cross - 1, 4) == "native"
        assert choose(name, cross, 4) == "ring"
        assert choose(name, 1024, 4, "ring") == "ring"
    assert choose_allreduce(1024, 4) == "native"
    assert choose_allreduce(64 << 20, 4) == "ring"
    assert choose_allreduce(1024, 4, "recursive") == "recursive"
    monkeypatch.setenv("HPCDP_ALLREDUCE_CROSSOVER", "0")
    forget()
    assert choose_allreduce(1024, 4) == "ring"
    assert choose("reduce_scatter", 1024, 4) == "native"  # the others keep theirs
    monkeypatch.setenv("HPCDP_ALL_GATHER_CROSSOVER", "many")
    with pytest.raises(ValueError, match="HPCDP_ALL_GATHER_CROSSOVER must be an integer"):
        forget()  # (the settings are read here: hpcdp.comm.core.settings)
    monkeypatch.delenv("HPCDP_ALL_GATHER_CROSSOVER")
    forget()
    assert choose_scatter_gather("auto") == "ring"
    with pytest.raises(ValueError, match="must be one of"):
        choose("reduce_scatter", 8, 2, "tree")
    assert choose("reduce_scatter", 8, 2, "recursive") == "recursive"
    assert choose("all_gather", 8, 2, "bruck") == "bruck"
    with pytest.raises(ValueError, match="must be one of"):
        choose_allreduce(8, 2, "tree")
    monkeypatch.undo()
    forget()


def test_the_config_names_exactly_the_registered_algorithms():
    """Parsing a config checks algorithm names without importing comm: its Literals must
    name what hpcdp.comm.algorithms registers (a new algorithm: add its name there too)."""
    from hpcdp.comm.algorithms import names
    import typing

    from hpcdp.config_parallel import AllreduceAlgorithm, ZeroConfig, literal_values

    assert set(literal_values(AllreduceAlgorithm)) == set(names("allreduce"))
    zero = set(literal_values(typing.get_type_hints(ZeroConfig)["algorithm"]))
    # ZeRO names one algorithm for both of its collectives: every name both register
    assert zero == set(names("reduce_scatter")) & set(names("all_gather"))
    from hpcdp.comm.engines.wire import WIRE_DTYPES
    from hpcdp.comm.select import WIRE_ALGORITHMS
    from hpcdp.config_parallel import WIRE_ALGORITHMS as CONFIG_WIRE_ALGORITHMS, CommDtype

    assert literal_values(CommDtype) == WIRE_DTYPES
    assert set(CONFIG_WIRE_ALGORITHMS) == {"auto", *WIRE_ALGORITHMS}


def test_the_config_names_exactly_the_selectable_engines():
    """``[comm] engine`` is checked without importing comm: hpcdp.config.COMM_ENGINES must
    name the engines hpcdp.comm.engines.registry lets a user ask for (a new selectable
    engine: add its name there too); every algorithm has an engine that runs it."""
    from hpcdp.comm.algorithms import registered
    from hpcdp.comm.engines import registry
    from hpcdp.config import COMM_ENGINES

    assert set(COMM_ENGINES) == set(registry.selectable())
    assert set(COMM_ENGINES) < {e.name for e in registry.registered()}
    for c in ("allreduce", "reduce_scatter", "all_gather"):
        for alg in registered(c):
            assert [e.name for e in registry.registered() if e.runs(alg)], (c, alg.name)


def test_a_registered_algorithm_is_known_to_auto_volume_and_the_cost_model():
    """One registration: choose() accepts it, collective_bytes counts it by its formula,
    the cost model prices it and (model_picks) may choose it."""
    from hpcdp.comm import algorithms
    from hpcdp.comm.model import cost as C
    from hpcdp.comm.select import collective_bytes

    def never_cheaper(p, nbytes, t, itemsize=4):
        return C.Cost(latency_s=1e9)

    alg = algorithms.Algorithm("allreduce", "tree", None, lambda n, N, r, s: (7 * n * s, 7 * n * s),
                               never_cheaper, "always")
    algorithms.register(alg)
    forget()
    try:
        assert choose_allreduce(1024, 4, "tree") == "tree"
        assert collective_bytes("allreduce", "tree", 10, 4, 0, 4) == (280, 280)
        prof = C.load_profile("dev-vm-2core")
        assert "tree" in C.priced()
        assert C.allreduce(prof, 1 << 20, C.Topology(1, 4), "tree")[1].latency_s == 1e9
        assert C.allreduce(prof, 1 << 20, C.Topology(1, 4), "auto")[0] != "tree"  # priced, never cheaper
    finally:
        algorithms.unregister("allreduce", "tree")
        forget()
    with pytest.raises(ValueError, match="must be one of"):
        choose_allreduce(8, 2, "tree")
    with pytest.raises(ValueError, match="'auto' is hpcdp.comm.auto's choice"):
        algorithms.register(algorithms.Algorithm("allreduce", "auto"))


def test_auto_progress_runs_the_thread_only_with_a_spare_core(monkeypatch):
    """HPCDP_COMM_PROGRESS=auto (the default): the progress thread when this rank's
    affinity mask holds two CPUs for each rank that shares it, else progress in calls."""
    from hpcdp.comm.engines.compiled.progress import choose_progress, local_ranks, progress_mode

    assert choose_progress(2, 2, 2) == "calls"     # this machine: 2 ranks, 2 cores
    assert choose_progress(2, 2, 1) == "thread"    # one rank on 2 cores
    assert choose_progress(16, 16, 8) == "thread"  # unbound, 2 CPUs a rank
    assert choose_progress(16, 16, 9) == "calls"
    assert choose_progress(2, 16, 8) == "thread"   # bound to 2 CPUs of its own
    assert choose_progress(1, 16, 16) == "calls"   # bound to one CPU
    assert choose_progress(4, 16, 8) == "thread"   # 4-CPU masks shared by 2 ranks each
    assert choose_progress(4, 16, 16) == "calls"   # ... by 4 ranks each
    assert local_ranks({"MPI_LOCALNRANKS": "3"}, 8) == (3, "MPI_LOCALNRANKS")
    assert local_ranks({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 8)[0] == 4
    assert local_ranks({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, 8)[0] == 2
    assert local_ranks({"MPI_LOCALNRANKS": ""}, 8)[0] == 8  # unknown: the whole job
    from hpcdp.comm.core.settings import reload

    monkeypatch.delenv("HPCDP_COMM_PROGRESS", raising=False)
    reload()
    assert progress_mode() == "auto"
    for mode in ("thread", "calls", "auto"):  # [comm] progress, the variable overriding it
        monkeypatch.setenv("HPCDP_COMM_PROGRESS", mode)
        reload()
        assert progress_mode() == mode
    monkeypatch.setenv("HPCDP_COMM_PROGRESS", "threads")
    with pytest.raises(ValueError, match="HPCDP_COMM_PROGRESS must be one of"):
        reload()
    monkeypatch.undo()
    reload()


def test_the_model_loads_without_mpi_or_the_registry():
    """``import hpcdp.comm.model.cost`` (pure arithmetic) in a fresh interpreter loads no
    mpi4py and no module of comm/ outside model/ (``import hpcdp.comm`` is lazy), and
    the model prices hpcdp's own algorithms from its own table."""
    import subprocess
    import sys

    code = ("import sys, hpcdp.comm.model.cost as C; "
            "print(sorted(m for m in sys.modules if m.startswith(('mpi4py', 'hpcdp.comm')))); "
            "print(C.pick('allreduce', C.load_profile('dev-vm-2core'), 1 << 20, C.Topology(2, 2))[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == str(["hpcdp.comm", "hpcdp.comm.model", "hpcdp.comm.model.cost",
                          "hpcdp.comm.model.volume"]), out
    assert out[1] in ("ring", "recursive", "hierarchical"), out


def test_the_registry_and_the_model_agree_on_every_price():
    """Every registered algorithm with a cost function is in the model's table with the
    same function and model_picks, in registration order, and nothing else is."""
    from hpcdp.comm import algorithms
    from hpcdp.comm.model import cost as C

    for collective in algorithms.COLLECTIVES:
        registered = [(a.name, (a.cost, a.model_picks)) for a in algorithms.registered(collective)
                      if a.cost is not None]
        assert registered == list(C.PRICES[collective].items()), collective
