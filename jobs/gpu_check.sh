#!/usr/bin/env bash
# One-call GPU check for hpcdp's numba.cuda backend (< 8 minutes on an H200).
#   bash jobs/gpu_check.sh            # results in $OUT if set, else ./gpu-results
# Stages (each under its own timeout; a failure is recorded and the next stage runs):
#   1 env       GPU, driver, numba-cuda, CuPy visible?
#   2 tests     tests/cuda on the real GPU (no simulator)
#   3 lab       kernels/run_lab.py: validation + benchmark vs cuBLAS / copy bandwidth
#   4 curve     one rank, gpt_small: cuda vs cpu loss curves (float tolerance)
#   5 speed     a small GPT (4 layers, 256 wide, T=128, batch 32): step time cuda vs cpu
#   6 ddp       2 ranks sharing the GPU with the DDP strategy
# Ends with summary.json (stage -> status, seconds, key numbers).
set -o pipefail
cd "$(dirname "$0")/.."
RES="${OUT:-./gpu-results}"
mkdir -p "$RES"
export PYTHONUNBUFFERED=1
unset NUMBA_ENABLE_CUDASIM
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
PY="${PYTHON:-python}"
STATUS_FILE="$RES/stages.tsv"
: > "$STATUS_FILE"
# Whole-script budget: a stage gets min(its own limit, time left); none starts
# with under 15 s left (recorded as "no_time"). Default 450 s < 8 min.
DEADLINE=$(( $(date +%s) + ${GPU_CHECK_BUDGET_S:-450} ))

stage() {  # stage NAME TIMEOUT_S CMD...: run, tee the log, record status and time
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  local left=$(( DEADLINE - t0 ))
  if [ "$left" -lt 15 ]; then
    echo -e "$name\tno_time\t0" >> "$STATUS_FILE"; echo "=== [$name] no time left" | tee -a "$RES/gpu_check.log"; return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== [$name] $* (timeout ${limit}s)" | tee -a "$RES/gpu_check.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$RES/$name.log"
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo -e "$name\t$rc\t$dt" >> "$STATUS_FILE"
  echo "=== [$name] rc=$rc in ${dt}s" | tee -a "$RES/gpu_check.log"
}

stage env 40 bash -c "nvidia-smi || true; $PY - <<'PYEOF'
import numba, numpy
from numba import cuda
print('numba', numba.__version__, 'numpy', numpy.__version__)
cuda.detect()
try:
    import cupy; print('cupy', cupy.__version__)
except ImportError:
    print('cupy: not installed')
from hpcdp.backend.cuda import CUDABackend
be = CUDABackend(); print('CUDABackend ok')
PYEOF"

stage tests 150 $PY -m pytest -q -p no:cacheprovider tests/cuda

stage lab 120 $PY kernels/run_lab.py --json "$RES/lab.json"

GPT_SMALL=(--config jobs/gpt_small.toml --set train.steps=60 --set run.log_every=10 --set run.eval_every=0)
stage curve_cuda 60 $PY -m hpcdp.cli train "${GPT_SMALL[@]}" --set run.device=\"cuda\" --set run.out_dir=\"$RES/curve_cuda\"
stage curve_cpu 60 $PY -m hpcdp.cli train "${GPT_SMALL[@]}" --set run.device=\"cpu\" --set run.out_dir=\"$RES/curve_cpu\"

SPEED=(--config jobs/gpt_small.toml --set model.n_layer=4 --set model.n_head=4 --set model.n_embd=256
       --set model.block_size=128 --set data.seq_len=128 --set train.global_batch=32
       --set run.log_every=5 --set run.eval_every=0)
stage speed_cuda 60 $PY -m hpcdp.cli train "${SPEED[@]}" --set train.steps=25 --set run.device=\"cuda\" --set run.out_dir=\"$RES/speed_cuda\"
stage speed_cpu 60 $PY -m hpcdp.cli train "${SPEED[@]}" --set train.steps=10 --set run.device=\"cpu\" --set run.out_dir=\"$RES/speed_cpu\"

if [ -f hpcdp/strategies/ddp.py ]; then
  stage ddp 90 timeout 85 mpiexec -n 2 $PY -m hpcdp.cli train "${GPT_SMALL[@]}" --set run.device=\"cuda\" \
    --set parallel.strategy=\"ddp\" --set run.out_dir=\"$RES/ddp_cuda\"
else
  echo -e "ddp\tskipped\t0" >> "$STATUS_FILE"  # no DDP strategy in this tree
fi

$PY - "$RES" <<'PYEOF'
import json, os, sys
res = sys.argv[1]
summary = {"stages": {}}
for line in open(os.path.join(res, "stages.tsv")):
    name, rc, dt = line.rstrip("\n").split("\t")
    summary["stages"][name] = {"rc": rc, "seconds": int(dt), "ok": rc == "0"}

def curve(d):
    p = os.path.join(res, d, "metrics.jsonl")
    if not os.path.exists(p):
        return None
    rows = [json.loads(l) for l in open(p) if l.strip()]
    return [r for r in rows if "loss" in r and "step" in r]

c, p = curve("curve_cuda"), curve("curve_cpu")
if c and p:
    n = min(len(c), len(p))
    diffs = [abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-12) for a, b in zip(c[:n], p[:n])]
    summary["curve"] = {"steps": n, "max_rel_loss_diff": max(diffs),
                        "first": [c[0]["loss"], p[0]["loss"]], "last": [c[n-1]["loss"], p[n-1]["loss"]],
                        "ok": max(diffs) < 1e-3}
for d in ("speed_cuda", "speed_cpu", "ddp_cuda"):
    r = curve(d)
    if r:
        times = sorted(x.get("step_time_s", 0.0) for x in r[3:]) or [r[-1].get("step_time_s", 0.0)]
        summary[d] = {"median_step_s": times[len(times) // 2], "steps": len(r), "last_loss": r[-1]["loss"]}
if "speed_cuda" in summary and "speed_cpu" in summary:
    summary["speedup_cuda_vs_cpu_same_machine"] = summary["speed_cpu"]["median_step_s"] / max(summary["speed_cuda"]["median_step_s"], 1e-12)
lab = os.path.join(res, "lab.json")
if os.path.exists(lab):
    rows = json.load(open(lab))["rows"]
    summary["lab"] = {"all_valid": all(r["ok"] for r in rows),
                      "rows": [{k: r.get(k) for k in ("kernel", "variant", "size", "rate", "unit", "pct")} for r in rows]}
summary["ok"] = all(s["ok"] for s in summary["stages"].values() if s["rc"] not in ("skipped", "no_time"))
json.dump(summary, open(os.path.join(res, "summary.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k != "lab"}, indent=1))
PYEOF
