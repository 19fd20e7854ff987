"""The README's two commands are the one path to a tested checkout.

- its test command is what CI runs (.ci/run), verbatim;
- the test command installs the venv with the README's own install command when it is
  missing (tests/setup_venv.sh), and says what to fix, without a traceback, when that fails;
- it installs Slurm when missing (as root) or says what to run, and starts the
  repository's own local Slurm: nothing outside the checkout is referenced.
The real end-to-end check is a fresh clone running the README's test command; these
pin each piece without installing or starting anything.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_has_an_install_and_a_test_command():
    install, test = readme_commands()
    assert install.startswith("python3 -m venv .venv && .venv/bin/pip install -e ")
    assert test == "bash tests/run_all.sh"


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text()
    commands = [x for x in ci.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    assert commands[-1] == readme_commands()[1]
    # and nothing else installs or tests: the README's command does it all
    assert not any(re.search(r"\b(pip|pytest|apt-get|slurm)\b", c) for c in commands), commands


def test_setup_venv_installs_with_the_readme_install_command():
    install = readme_commands()[0].split(" && .venv/bin/mpiexec")[0]
    assert f'INSTALL="{install}"' in (REPO / "tests" / "setup_venv.sh").read_text()


def test_run_all_prepares_the_venv_before_any_group():
    text = (REPO / "tests" / "run_all.sh").read_text()
    assert text.index("bash tests/setup_venv.sh") < text.index("-m pytest")


def test_run_all_waits_for_the_background_preparation_before_the_groups_that_need_it():
    """The apt packages and venvs of the later groups are prepared while the unit tests
    run; every group that uses them must start after the wait."""
    text = (REPO / "tests" / "run_all.sh").read_text()
    start, wait = text.index(") >\"$prep_log\" 2>&1 </dev/null &"), text.index('wait "$prep_pid"')
    assert start < text.index("tests/unit -q") < wait
    for later in ("tests/run_slurm.sh", ".ci/parallel-hdf5.sh --test", "tests/hf -q", "tests/ulfm -q"):
        assert wait < text.index(later, start), later


def test_run_all_puts_the_venv_first_on_path():
    """A test that looks mpiexec up on PATH must find the venv's (the MPI mpi4py was
    built for), not a system MPI's, without an activated venv."""
    text = (REPO / "tests" / "run_all.sh").read_text()
    assert 'export PATH="$(cd "$(dirname "$(command -v "$PY")")" && pwd):$PATH"' in text
    assert text.index("export PATH=") < text.index("-m pytest")


def test_nothing_outside_the_checkout_is_used():
    for path in [*(REPO / "tests").rglob("*.sh"), *(REPO / "tests").rglob("*.py"), *(REPO / ".ci").iterdir()]:
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        for outside in ("shared/slurm", "start-local-slurm", "HPCDP_SLURM_DIR", "/work/"):
            assert outside not in text, f"{path.relative_to(REPO)} refers to {outside!r} outside the checkout"


# -- tests/setup_venv.sh on a copy, with a stand-in python3 ---------------------

def _checkout_copy(tmp_path: Path) -> Path:
    """tests/setup_venv.sh and tests/check_venv.py in an empty checkout (no .venv).
    check_venv.py is a symlink: it resolves to this checkout, where hpcdp is installed."""
    repo = tmp_path / "clone"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "setup_venv.sh").write_text((REPO / "tests" / "setup_venv.sh").read_text())
    (repo / "tests" / "check_venv.py").symlink_to(REPO / "tests" / "check_venv.py")
    return repo


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _fake_python3(bindir: Path, log: Path, venv_ok: bool) -> None:
    """python3 that answers the version check, and for `-m venv .venv` either fails like
    a Debian python3 without python3-venv or makes a .venv whose pip logs its arguments
    and whose python is the interpreter running these tests."""
    make_venv = f"""mkdir -p .venv/bin
cat > .venv/bin/pip <<'PIP'
#!/bin/sh
echo "pip $*" >> {log}
PIP
chmod +x .venv/bin/pip
printf '#!/bin/sh\\nexec {sys.executable} "$@"\\n' > .venv/bin/python
chmod +x .venv/bin/python
exit 0"""
    fail = 'echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1'
    _exe(bindir / "python3", f"""#!/bin/sh
case "$1" in
  -c) exit 0 ;;
  -m) echo "python3 $*" >> {log}; {make_venv if venv_ok else fail} ;;
esac
exit 2
""")


def _setup_venv(repo: Path, bindir: Path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{bindir}:{env['PATH']}"
    return subprocess.run(["bash", str(repo / "tests" / "setup_venv.sh")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_missing_venv_is_created_with_the_readme_command(tmp_path):
    repo, log = _checkout_copy(tmp_path), tmp_path / "calls.log"
    _fake_python3(tmp_path / "bin", log, venv_ok=True)
    r = _setup_venv(repo, tmp_path / "bin")
    assert r.returncode == 0, r.stdout + r.stderr
    assert log.read_text().splitlines() == ["python3 -m venv .venv", "pip install -e .[mpi,digits,plot,test]"]
    assert "no .venv; installing" in r.stdout and ".venv ready" in r.stdout


def test_a_failed_venv_creation_says_what_to_fix(tmp_path):
    repo, log = _checkout_copy(tmp_path), tmp_path / "calls.log"
    _fake_python3(tmp_path / "bin", log, venv_ok=False)
    r = _setup_venv(repo, tmp_path / "bin")
    out = r.stdout + r.stderr
    assert r.returncode == 1
    assert "the install failed" in out and "ensurepip is not available" in out
    assert "apt-get install python3-venv" in out
    assert "Traceback" not in out


def test_an_existing_ready_venv_is_left_alone(tmp_path):
    repo, log = _checkout_copy(tmp_path), tmp_path / "calls.log"
    _fake_python3(tmp_path / "bin", log, venv_ok=True)
    _exe(repo / ".venv" / "bin" / "python", f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    r = _setup_venv(repo, tmp_path / "bin")
    assert r.returncode == 0 and ".venv is ready" in r.stdout, r.stdout + r.stderr
    assert not log.exists()  # nothing installed


def test_a_given_python_without_hpcdp_is_named_not_changed(tmp_path):
    repo = _checkout_copy(tmp_path)
    env = dict(os.environ, PYTHON="/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3",
               PYTHONNOUSERSITE="1")
    r = subprocess.run(["bash", "tests/setup_venv.sh"], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=120)
    if r.returncode == 0:
        pytest.skip("the system python3 has hpcdp installed")
    assert "is not ready" in r.stdout and "-m pip install -e '.[mpi,digits,plot,test]'" in r.stdout
    assert not (repo / ".venv").exists()


# -- Slurm: install when missing, the repository's own starter ------------------

def _slurm_script(name, *args, env=None):
    cmd = ["bash", str(REPO / "tests" / "slurm" / name), *args]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)


MISSING = {"HPCDP_SLURM_SBIN": "/nonexistent-sbin"}  # the daemons "not installed"


def test_install_slurm_dry_run_names_the_apt_command_when_missing():
    r = _slurm_script("install-slurm.sh", "--dry-run", env=MISSING)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "missing: /nonexistent-sbin/slurmctld /nonexistent-sbin/slurmd /nonexistent-sbin/munged" in r.stdout
    assert "apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the non-root message by switching to user nobody")
def test_install_slurm_without_root_says_what_to_run():
    # User nobody runs copies of the scripts from a folder it can read: the checkout may
    # sit in a private folder (a `mktemp -d` clone is mode 0700).
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="hpcdp-slurm-scripts-"))
    try:
        folder.chmod(0o755)
        for name in ("install-slurm.sh", "local-slurm.sh"):
            shutil.copy(REPO / "tests" / "slurm" / name, folder / name)
            (folder / name).chmod(0o644)
        r = subprocess.run(["runuser", "-u", "nobody", "--", "bash", str(folder / "install-slurm.sh")],
                           env={**os.environ, **MISSING}, capture_output=True, text=True, timeout=60,
                           cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "needs root; run: sudo bash tests/slurm/install-slurm.sh" in r.stdout


def test_local_slurm_start_without_slurm_names_the_installer(tmp_path):
    r = _slurm_script("local-slurm.sh", "start", env={**MISSING, "HPCDP_SLURM_STATE": str(tmp_path)})
    assert r.returncode == 3
    assert "Slurm is not installed" in r.stderr and "tests/slurm/install-slurm.sh" in r.stderr


def test_local_slurm_stop_leaves_a_slurm_it_did_not_start(tmp_path):
    r = _slurm_script("local-slurm.sh", "stop", "--holder", "someone", env={"HPCDP_SLURM_STATE": str(tmp_path)})
    assert r.returncode == 0 and "no Slurm was started here" in r.stdout
    (tmp_path / "holder").write_text("another-holder\n")
    (tmp_path / "pids").write_text("slurmctld 1\n")
    r = _slurm_script("local-slurm.sh", "stop", "--holder", "someone", env={"HPCDP_SLURM_STATE": str(tmp_path)})
    assert r.returncode == 0 and "belongs to holder another-holder" in r.stdout
    assert (tmp_path / "pids").exists()  # nothing stopped, nothing forgotten
