#!/usr/bin/env bash
# The transformers group's own venv (default .venv-hf, gitignored): PyTorch CPU and
# transformers, test-only, never a dependency of hpcdp, never in .venv. The tests
# run hpcdp from .venv and call this venv's python for the transformers side
# (tests/hf/oracle.py), so the two never share an interpreter.
#
# torch first, pinned (torch==2.13.0: the machine's pip finds its CPU wheel,
# 2.13.0+cpu, on local disk); transformers is then installed with the same pin, so
# pip can never replace it by a CUDA build, and the last line refuses a CUDA torch.
# Skips everything when the venv already imports both.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${HPCDP_HF_VENV:-.venv-hf}
TORCH=${HPCDP_HF_TORCH:-torch==2.13.0}
TRANSFORMERS=${HPCDP_HF_TRANSFORMERS:-transformers>=5.0,<6}
if "$VENV/bin/python" -c "import torch, transformers, safetensors" 2>/dev/null; then
  echo "hf: $VENV has $("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
  exit 0
fi
log=$(mktemp)
echo "hf: creating $VENV with $TORCH (CPU) and $TRANSFORMERS (a few minutes the first time)"
if ! { python3 -m venv "$VENV" &&
       "$VENV/bin/pip" install -q "$TORCH" &&
       "$VENV/bin/pip" install -q "$TORCH" "$TRANSFORMERS" safetensors tokenizers numpy; } >"$log" 2>&1; then
  echo "hf: the install failed; its last lines:" >&2
  grep -v "^WARNING: Location" "$log" | tail -20 | sed 's/^/    /' >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
"$VENV/bin/python" -c "import torch, transformers; assert not torch.version.cuda, torch.version.cuda; print('hf: ready: torch', torch.__version__, 'transformers', transformers.__version__)"
