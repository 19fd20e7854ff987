"""docs/cluster.md's "Up, run, down" block, run as written (each line a command, in
order, from the repository root), and its "Slurm on two nodes" block (one shell script),
on a second cluster with its own prefix and subnet (derived from the session's, so that
two people's groups at once do not meet) that never touches the session's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import PREFIX, ROOT

DOCS_PREFIX = f"{PREFIX}d"
DOCS_NET = "10.232." + os.environ.get("HPCDP_CLUSTER_NET", "10.231.47").rsplit(".", 1)[-1]
ENV = {**os.environ, "HPCDP_CLUSTER_PREFIX": DOCS_PREFIX, "HPCDP_CLUSTER_NET": DOCS_NET,
       "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
       "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _block(section: str) -> list[str]:
    text = (ROOT / "docs" / "cluster.md").read_text()
    head = text.index(f"## {section}")
    body = text[head:].split("```bash\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in body.splitlines() if ln.strip()]


def _left_nothing():
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert DOCS_PREFIX not in left and DOCS_PREFIX not in (Path("/etc/hosts").read_text())
    assert not Path(f"/run/hpcdp-cluster-slurm-{DOCS_PREFIX}").exists()


def _down():
    for script in ("slurm.sh", "cluster.sh"):
        subprocess.run(["bash", str(ROOT / "tests" / "cluster" / script), "down"], env=ENV,
                       capture_output=True, timeout=120)


def test_the_documented_commands_work_as_written():
    cmds = _block("Up, run, down")
    assert cmds[0].startswith("bash tests/cluster/cluster.sh up") and cmds[-1].endswith("down")
    env = ENV
    try:
        for cmd in cmds:
            r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=240)
            assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
            if "bench collectives" in cmd:
                assert "hierarchical" in r.stdout, r.stdout
            if "status" in cmd:
                assert f"{DOCS_PREFIX}0:" in r.stdout and f"{DOCS_NET}.11" in r.stdout, r.stdout
    finally:
        _down()
    _left_nothing()


def _job_outputs(tmp_path) -> str:
    """The job's output file(s) (under the block's HPCDP_RUN_ROOT, made in TMPDIR) and the
    slurmds' log tails: what a failed or stuck job said."""
    parts = [f"--- {f}\n{f.read_text(errors='replace')[-4000:]}" for f in sorted(tmp_path.glob("*/slurm-*.out"))]
    for log in sorted(Path(f"/run/hpcdp-cluster-slurm-{DOCS_PREFIX}").glob("*.log")):
        parts.append(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}")
    return "\n".join(parts) or "(no job output file)"


def test_the_documented_slurm_commands_work_as_written(tmp_path):
    cmds = _block("Slurm on two nodes")
    assert cmds[0].startswith("bash tests/cluster/cluster.sh up") and cmds[-1].endswith("cluster.sh down")
    script = "set -euo pipefail\n" + "\n".join(cmds) + "\n"
    try:
        r = subprocess.run(["timeout", "-k", "10", "420", "bash", "-c", script], cwd=ROOT,
                           env={**ENV, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=450)
        assert r.returncode == 0, (f"exit {r.returncode}\n{r.stdout[-4000:]}{r.stderr[-4000:]}\n"
                                   + _job_outputs(tmp_path))
        assert f"4 rank(s) on {DOCS_PREFIX}[0-1]" in r.stdout, r.stdout[-3000:]
        assert "COMPLETED (exit 0:0)" in r.stdout and f"{DOCS_PREFIX}1" in r.stdout, r.stdout[-3000:]
    finally:
        _down()
    _left_nothing()
