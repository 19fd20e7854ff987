#!/usr/bin/env bash
# weights.sh TREE [OUTFILE]
#   Behaviour check: short training runs of the hpcdp in TREE (PYTHONPATH=TREE), each
#   ending in a checkpoint; prints one line per run:
#     name  ranks  ckpt-sha256  eval-sha256  # seconds rc
#   ckpt-sha256: `hpcdp ckpt info STEPDIR` "weights sha256" (SHA-256 over every parameter's
#                name and bytes, read back from the final checkpoint; same for any layout)
#   eval-sha256: the last "weights_sha256" in metrics.jsonl (the in-memory flat buffer's
#                SHA-256 at the final eval; for check-exact jobs the only hash: they keep
#                no checkpoint)
#   Configs: tests/compare/jobs/ (jobs/*.toml of main 8dbb3d5 and the tiny GPT of
#   tests/unit/test_exact_check.py), the SAME files for every tree, so a config file changed
#   between commits does not show up as a behaviour change. JOBS=dir overrides.
#   Run dirs: /tmp/hashes/<tree-basename>-<commit>/ (wiped at start).
#   Env: PAR=2 (jobs at once), STEPS_DIGITS=5,
#   STEPS_GPT=3, GPT_SAMPLES=512 (data.n_samples of the GPT jobs), STEPS_EXACT=4, ONLY=regex (run only matching names), JOB_TIMEOUT=420, TAG=x (run dir suffix).
set -u
TREE=$(cd "${1:?usage: weights.sh TREE [OUTFILE]}" && pwd)
OUTFILE=${2:-}
JOBS=${JOBS:-$(cd "$(dirname "$0")" && pwd)/jobs}
PAR=${PAR:-2}
SD=${STEPS_DIGITS:-5}; SG=${STEPS_GPT:-3}; NS=${GPT_SAMPLES:-512}; SE=${STEPS_EXACT:-4}
ONLY=${ONLY:-.}
JOB_TIMEOUT=${JOB_TIMEOUT:-420}
SLOT=${SLOT:-}  # a command prefix each job runs under (e.g. a CPU-slot lock), or none
COMMIT=$(git -C "$TREE" rev-parse --short HEAD 2>/dev/null || echo nogit)
DIRTY=$(git -C "$TREE" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "+dirty" || true)
R=/tmp/hashes/$(basename "$TREE")-$COMMIT${TAG:+-$TAG}
rm -rf "$R"; mkdir -p "$R/res"
export PYTHONPATH=$TREE PATH=${VENV:-$(cd "$(dirname "$0")/../.." && pwd)/.venv}/bin:$PATH
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unset HPCDP_RANKS_PER_NODE
cd "$TREE"
got=$(python -c 'import hpcdp,os;print(os.path.dirname(os.path.dirname(os.path.abspath(hpcdp.__file__))))')
[ "$got" = "$TREE" ] || { echo "weights.sh: hpcdp imports from $got, not $TREE" >&2; exit 2; }

# name | ranks | extra env | config | --set overrides (space separated, no spaces inside)
LIST="$R/list"
q='"'
{
for s in ddp ps zero1 zero2 zero3; do echo "check_exact_$s|1,2,4||exact_tiny.toml|CHECK $s"; done
for n in 1 2 3 4; do echo "digits_ddp|$n||digits_ddp.toml|train.epochs=0 train.steps=$SD run.eval_every=$SD"; done
for n in 1 2; do echo "gpt_ddp|$n||gpt_ddp.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG"; done
for n in 1 2 4; do echo "gpt_zero3|$n||gpt_zero3.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG"; done
for n in 2 3; do echo "digits_ps_sync|$n||digits_ps.toml|train.epochs=0 train.steps=$SD run.eval_every=$SD"; done
echo "gpt_ddp_exact|2||gpt_ddp.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG train.reproducible=${q}exact${q}"
echo "gpt_zero3_exact|2||gpt_zero3.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG train.reproducible=${q}exact${q}"
echo "gpt_zero3_hybrid|4|HPCDP_RANKS_PER_NODE=2|gpt_zero3.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG parallel.zero.shard=${q}node${q}"
echo "gpt_ddp_bf16wire|2||gpt_ddp.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG parallel.ddp.comm_dtype=${q}bfloat16${q}"
echo "gpt_zero3_bf16wire|2||gpt_zero3.toml|data.n_samples=$NS train.steps=$SG run.eval_every=$SG parallel.zero.comm_dtype=${q}bfloat16${q}"
} | grep -E "^[^|]*($ONLY)" > "$LIST"

eval_sha() {  # last weights_sha256 of a metrics.jsonl
  python - "$1" <<'EOF'
import json, sys
h = "-"
try:
    for line in open(sys.argv[1]):
        try: r = json.loads(line)
        except ValueError: continue
        for v in ([r] + list(r.values())) if isinstance(r, dict) else []:
            if isinstance(v, dict) and v.get("weights_sha256"): h = v["weights_sha256"]
except OSError: pass
print(h)
EOF
}

one() {  # one line of LIST -> $R/res/<idx>
  local idx=$1 line=$2 name ranks envs cfg sets
  IFS='|' read -r name ranks envs cfg sets <<<"$line"
  local d="$R/$name-n${ranks//,/_}" t0=$SECONDS rc
  mkdir -p "$d"
  if [[ $sets == CHECK* ]]; then
    local strat=${sets#CHECK }
    $SLOT /usr/bin/time -f %e -o "$d/busy_s" timeout "$JOB_TIMEOUT" hpcdp check-exact --config "$JOBS/$cfg" --ranks "$ranks" \
      --strategies "$strat" --steps "$SE" --out "$d/out" >"$d/log" 2>&1
    rc=$?
    # one line per job of the check (its run directories hold metrics.jsonl)
    local el=$((SECONDS-t0)) m any=0
    for m in $(ls -d "$d"/out/*/ 2>/dev/null | sort); do
      [ -f "$m/metrics.jsonl" ] || continue
      any=1
      printf '%-22s %-6s %-64s %s  # %ss rc=%s\n' "$name" "$(basename "$m")" "-" "$(eval_sha "$m/metrics.jsonl")" "$el" "$rc"
    done > "$R/res/$idx"
    [ $any = 1 ] || printf '%-22s %-6s %-64s %s  # %ss rc=%s\n' "$name" "$ranks" "FAILED(rc=$rc)" "-" "$el" "$rc" > "$R/res/$idx"
    return
  fi
  local args=()
  for s in $sets; do args+=(--set "$s"); done
  args+=(--set "run.out_dir=\"$d/run\"" --set "checkpoint.dir=\"$d/ck\"" --set "checkpoint.final=true")
  env $envs $SLOT /usr/bin/time -f %e -o "$d/busy_s" timeout "$JOB_TIMEOUT" mpiexec -n "$ranks" hpcdp train --config "$JOBS/$cfg" "${args[@]}" \
    >"$d/log" 2>&1
  rc=$?
  local step ck="-"
  step=$(ls -d "$d"/ck/step-* 2>/dev/null | sort | tail -1)
  if [ $rc = 0 ] && [ -n "$step" ]; then
    ck=$(hpcdp ckpt info "$step" 2>>"$d/log" | awk '$1=="weights" && $2=="sha256"{print $3}')
    [ -n "$ck" ] || ck="NOHASH"
  else
    ck="FAILED(rc=$rc)"
  fi
  local ev; ev=$(eval_sha "$d/run/metrics.jsonl")
  printf '%-22s %-6s %-64s %s  # %ss rc=%s\n' "$name" "$ranks" "$ck" "$ev" "$((SECONDS-t0))" "$rc" > "$R/res/$idx"
}

T0=$SECONDS
i=0
while IFS= read -r line; do
  i=$((i+1))
  while [ "$(jobs -rp | wc -l)" -ge "$PAR" ]; do wait -n; done
  one "$(printf %03d $i)" "$line" </dev/null &
done < "$LIST"
wait
{
  echo "# weights.sh $TREE (commit $COMMIT$DIRTY), configs $JOBS, steps digits=$SD gpt=$SG exact=$SE"
  busy=$(cat "$R"/*/busy_s 2>/dev/null | awk '{s+=$NF} END{printf "%.0f", s}')
  echo "# $(date -u '+%F %T UTC'), $(uptime | sed 's/.*load/load/'), wall $((SECONDS-T0)) s, jobs' own time summed ${busy} s; run dirs $R"
  printf '%-22s %-6s %-64s %s\n' "# name" "ranks" "ckpt weights sha256" "final eval weights_sha256"
  cat "$R"/res/* 2>/dev/null
} | tee ${OUTFILE:+"$OUTFILE"}
nres=$(ls "$R"/res | wc -l); nlist=$(wc -l < "$LIST")
[ "$nres" = "$nlist" ] || { echo "weights.sh: $nres results for $nlist runs" >&2; exit 1; }
grep -q "FAILED\|NOHASH" "$R"/res/* && exit 1 || exit 0
