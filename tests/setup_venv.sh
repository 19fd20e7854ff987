#!/usr/bin/env bash
# Make sure the Python the tests run with has hpcdp from this checkout and every
# package of its test extras; tests/run_all.sh runs this first, so the README's test
# command does not depend on the README's first command having run.
#
# PYTHON unset: .venv/bin/python. A missing or incomplete .venv is created/refreshed
# with the README's own install command ($INSTALL below, the same text); a failure
# prints the installer's last lines and what to fix, not a traceback.
# PYTHON set: that interpreter is checked, never changed (the message says what to run).
# Exit status: 0 ready, 1 not (the message says why).
set -uo pipefail
cd "$(dirname "$0")/.."
EXTRAS=mpi,digits,plot,test
# The README's first command up to its training run (tests/unit/test_readme_commands.py).
INSTALL="python3 -m venv .venv && .venv/bin/pip install -e '.[mpi,digits,plot,test]'"

say() { echo "setup-venv: $*"; }

if [ -n "${PYTHON:-}" ]; then
  if ! command -v "$PYTHON" >/dev/null; then
    say "PYTHON=$PYTHON is not an executable; unset PYTHON to use .venv"; exit 1
  fi
  if ! why=$("$PYTHON" tests/check_venv.py "$EXTRAS" 2>&1); then
    say "PYTHON=$PYTHON is not ready (${why}); run: $PYTHON -m pip install -e '.[$EXTRAS]'"; exit 1
  fi
  exit 0
fi

why="no .venv"
if [ -x .venv/bin/python ]; then
  why=$(.venv/bin/python tests/check_venv.py "$EXTRAS" 2>&1) && { say ".venv is ready"; exit 0; }
  why=".venv is incomplete: ${why}"
fi
if ! command -v python3 >/dev/null; then
  say "$why, and there is no python3 to create it: install Python >= 3.11 with its venv module (Debian/Ubuntu: apt-get install python3 python3-venv)"
  exit 1
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "$why, and hpcdp needs Python >= 3.11; python3 is $(python3 -V 2>&1). Put a newer python3 first on PATH"
  exit 1
fi
log=$(mktemp)
say "$why; installing (about a minute with a warm pip cache): $INSTALL"
if ! bash -c "$INSTALL" >"$log" 2>&1; then
  say "the install failed; its last lines:"
  tail -25 "$log" | sed 's/^/    /'
  say "fix the cause above (no venv module: apt-get install python3-venv; no network: a pip mirror or wheel cache), then rerun"
  rm -f "$log"
  exit 1
fi
rm -f "$log"
if ! why=$(.venv/bin/python tests/check_venv.py "$EXTRAS" 2>&1); then
  say "installed, but the venv is still not ready (${why})"
  exit 1
fi
say ".venv ready"
