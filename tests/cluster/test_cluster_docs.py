"""docs/cluster.md's "Up, run, down" block, run as written (each line a command, in
order, from the repository root), on a second cluster with its own prefix and subnet so
that it never touches the session's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def _block() -> list[str]:
    text = (ROOT / "docs" / "cluster.md").read_text()
    head = text.index("## Up, run, down")
    body = text[head:].split("```bash\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in body.splitlines() if ln.strip()]


def test_the_documented_commands_work_as_written():
    cmds = _block()
    assert cmds[0].startswith("bash tests/cluster/cluster.sh up") and cmds[-1].endswith("down")
    env = {**os.environ, "HPCDP_CLUSTER_PREFIX": "hpcdpd", "HPCDP_CLUSTER_NET": "10.231.48",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        for cmd in cmds:
            r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=240)
            assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
            if "bench collectives" in cmd:
                assert "hierarchical" in r.stdout, r.stdout
            if "status" in cmd:
                assert "hpcdpd0:" in r.stdout and "10.231.48.11" in r.stdout, r.stdout
    finally:
        subprocess.run(["bash", str(ROOT / "tests" / "cluster" / "cluster.sh"), "down"], env=env,
                       capture_output=True, timeout=120)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "hpcdpd" not in left and "hpcdpd" not in (Path("/etc/hosts").read_text())
