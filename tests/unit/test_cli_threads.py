"""Under an MPI launcher the CLI defaults every thread pool to one thread per rank."""

from hpcdp.cli import _one_thread_per_rank_under_a_launcher

POOLS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
LAUNCHERS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS", "SLURM_CPUS_PER_TASK")


def _clean(monkeypatch):
    for v in POOLS + LAUNCHERS:
        monkeypatch.delenv(v, raising=False)


def test_under_mpiexec_pools_default_to_one_thread(monkeypatch):
    import os
    _clean(monkeypatch)
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("NUMBA_NUM_THREADS", "3")  # the user's own choice wins
    _one_thread_per_rank_under_a_launcher()
    assert [os.environ[v] for v in POOLS] == ["1", "1", "1", "3"]


def test_slurm_cpus_per_task_sets_the_width(monkeypatch):
    import os
    _clean(monkeypatch)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "8")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    _one_thread_per_rank_under_a_launcher()
    assert all(os.environ[v] == "4" for v in POOLS)


def test_without_a_launcher_nothing_is_set(monkeypatch):
    import os
    _clean(monkeypatch)
    _one_thread_per_rank_under_a_launcher()
    assert not any(v in os.environ for v in POOLS)
