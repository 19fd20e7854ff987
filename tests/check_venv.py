"""Exit 0 if this Python has hpcdp installed from this checkout with every package
of the extras the tests use; else print what is missing and exit 1.

Used by tests/setup_venv.sh to decide whether the venv must be (re)installed. The
package list is read from hpcdp's own metadata (pyproject.toml's extras), so a new
dependency in pyproject.toml makes the next test run refresh the venv.
Usage: python tests/check_venv.py EXTRA[,EXTRA...]
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def missing(extras: set[str]) -> list[str]:
    try:
        dist = metadata.distribution("hpcdp")
    except metadata.PackageNotFoundError:
        return ["hpcdp (not installed)"]
    out = []
    try:
        import hpcdp
        where = Path(hpcdp.__file__).resolve()
        if REPO not in where.parents:
            out.append(f"hpcdp from this checkout (this Python imports {where})")
    except ImportError as e:
        out.append(f"hpcdp (import fails: {e})")
    for req in dist.requires or ():
        spec, _, marker = req.partition(";")
        m = re.search(r'extra\s*==\s*"([^"]+)"', marker)
        if m and m.group(1) not in extras:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip()).group(0)
        if name == "hpcdp":
            continue  # "all" = hpcdp[...]: its members are listed themselves
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


if __name__ == "__main__":
    gone = missing(set(sys.argv[1].split(",")) if len(sys.argv) > 1 else set())
    if gone:
        print("missing: " + ", ".join(gone))
        sys.exit(1)
