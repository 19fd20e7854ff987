"""hpcdp installed from a built wheel (not editable, not the source tree) runs the
subcommands that read a config shipped with it: the digits data (``hpcdp train``'s
default job), a machine profile and an example config (``hpcdp scale --predict``), the
example configs of ``hpcdp bench ckpt`` and ``hpcdp bench exact``.

The wheel is built from a copy of the tracked tree (``pip wheel --no-deps``), installed
with ``--no-deps --no-index`` into a throwaway venv that sees this venv's packages
(numpy, numba, mpi4py, h5py) through a path file but not its editable hpcdp; every
command runs from an empty folder, with no PYTHONPATH. About a minute on 2 cores.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns(".venv*", ".git", "runs", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", "kernels", "docs")


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=IGNORE)
    dist = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = dist.glob("hpcdp-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # this venv's dependencies, as a plain path: its .pth files (the editable hpcdp) are not read
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "-q", str(whl)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "no such option: --python" in r.stderr:  # pip < 22.3
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                            "--target", str(site), str(whl)], capture_output=True, text=True, timeout=300)
        (venv / "bin" / "hpcdp").write_text(f"#!{py}\nimport sys\nfrom hpcdp.cli import main\nsys.exit(main())\n")
        (venv / "bin" / "hpcdp").chmod(0o755)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # mpi4py looks for its MPI library under the running venv's prefix: a user's venv
    # holds the MPICH wheel's libmpi there, this one borrows it from this venv
    if list(Path(sys.prefix, "lib").glob("libmpi.so*")):
        env.setdefault("MPI4PY_LIBMPI", str(Path(sys.prefix, "lib")))
    # the commands find mpiexec on PATH (this venv's MPICH), after the wheel venv's own bin
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    work = tmp / "work"
    work.mkdir()
    return {"py": py, "bin": venv / "bin", "site": site, "env": env, "work": work}


def run(wheel_env, *args, timeout=240):
    r = subprocess.run([str(wheel_env["bin"] / "hpcdp"), *map(str, args)], cwd=wheel_env["work"],
                       env=wheel_env["env"], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"hpcdp {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def test_the_wheel_is_what_runs_not_the_source_tree(wheel_env):
    r = subprocess.run([str(wheel_env["py"]), "-c", "import hpcdp, numpy; print(hpcdp.__file__)"],
                       cwd=wheel_env["work"], env=wheel_env["env"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).is_relative_to(wheel_env["site"]), r.stdout


def test_every_config_a_command_names_is_in_the_wheel(wheel_env):
    """Each ``config_path("X")`` and shipped profile the source names is a file in the
    installed package (the links of hpcdp/jobs/ became files)."""
    names = set()
    for f in (ROOT / "hpcdp").rglob("*.py"):
        names |= set(re.findall(r'config_path\("([^"]+)"\)', f.read_text()))
        names |= {m + ".toml" for m in re.findall(r'^STUDY_CONFIG = "([^"]+)\.toml"', f.read_text(), re.M)}
    assert names >= {"gpt_ddp.toml", "digits_ddp.toml", "gpt_small.toml", "gpt_pysource.toml",
                     "digits_ps_async.toml"}
    jobs = wheel_env["site"] / "hpcdp" / "jobs"
    for name in names:
        path = jobs / name
        assert path.is_file() and not path.is_symlink(), f"{name} is not shipped in the wheel"
        assert path.read_text() == (ROOT / "jobs" / name).read_text()
    for name in ("dev-vm-2core", "example-cluster", "example-cluster-1nic"):
        assert (wheel_env["site"] / "hpcdp" / "comm" / "model" / "profiles" / f"{name}.toml").is_file()
    for name in ("horovod", "tf-ec2-k80"):  # hpcdp scale --reproduce's published tables
        assert (wheel_env["site"] / "hpcdp" / "scale" / "published" / f"{name}.toml").is_file()
    assert (wheel_env["site"] / "hpcdp" / "data" / "digits.csv.gz").is_file()


def test_train_runs_the_default_digits_job_from_the_wheel(wheel_env):
    out = wheel_env["work"] / "train"
    r = run(wheel_env, "train", "--set", "train.steps=2", "--set", "train.epochs=0",
            "--set", "run.eval_every=0", "--set", f'run.out_dir="{out}"')
    assert (out / "metrics.jsonl").is_file(), r.stdout + r.stderr


def test_scale_predict_reads_a_shipped_profile_and_config(wheel_env):
    cfg = wheel_env["site"] / "hpcdp" / "jobs" / "gpt_ddp.toml"
    out = wheel_env["work"] / "predict"
    r = run(wheel_env, "scale", "--predict", "--profile", "dev-vm-2core", "--config", cfg,
            "--ranks", "1,2,4", "--strategies", "ddp-ring,zero1", "--out", out)
    assert "ddp-ring" in r.stdout and (out / "predict.json").is_file(), r.stdout


def test_bench_ckpt_and_bench_exact_read_their_shipped_configs(wheel_env):
    work = wheel_env["work"]
    r = run(wheel_env, "bench", "ckpt", "--sizes", "gpt", "--ranks", "1", "--layouts", "split",
            "--repeat", "1", "--no-stall", "--dir", work / "ckpt", "--json", work / "ckpt.json")
    assert (work / "ckpt.json").is_file(), r.stdout + r.stderr
    r = run(wheel_env, "bench", "exact", "--models", "mlp", "--ranks", "1", "--steps-mlp", "3",
            "--warmup", "1", "--out", work / "exact", "--json", work / "exact.json")
    assert (work / "exact.json").is_file(), r.stdout + r.stderr
