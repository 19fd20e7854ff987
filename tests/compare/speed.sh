#!/usr/bin/env bash
# speed.sh OLDTREE NEWTREE [OUTFILE]
#   Speed check, old and new hpcdp interleaved (old, new, old, new, ... per benchmark), each
#   command alone on the machine (nothing else running), 2 ranks, with
#   OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset for every command alike:
#     overhead C LAYER   `hpcdp bench comm-overhead --collective C --rounds 5 --iters 200`
#                        (8 B), median of every round's per-call time, in us
#     coll C SIZE ALGO   `hpcdp bench collectives --collective all --algorithms mpi,ring,auto`
#                        at 8 B, 64 KiB (one call: --factor 8192) and 4 MiB, 64 MiB (one call:
#                        --factor 16), median of the repeats' per-call times, in us
#     step JOB           a short `hpcdp train` of jobs/gpt_ddp.toml / gpt_zero3.toml (the
#                        config files of tests/compare/jobs, same for both trees):
#                        median step_time_s of steps 3.. from metrics.jsonl, in ms
#   Each tree runs ROUNDS times (default 2); medians pool the samples of all its rounds.
#   Prints: key, old median, new median, new/old ratio ("*" where the ratio is above 1.05).
#   Env: ROUNDS=2, QUICK=1 (a smoke run: fewer iterations, 1 repeat, 6 steps),
#        STEPS=14, ONLY=overhead|coll|step (a subset, regex).
#   Raw JSON and logs: /tmp/speed/<old>-<new>-<date>/
set -u
OLD=$(cd "${1:?usage: speed.sh OLDTREE NEWTREE [OUTFILE]}" && pwd)
NEW=$(cd "${2:?usage: speed.sh OLDTREE NEWTREE [OUTFILE]}" && pwd)
OUTFILE=${3:-}
ROUNDS=${ROUNDS:-2}; QUICK=${QUICK:-0}; STEPS=${STEPS:-14}; ONLY=${ONLY:-.}
JOBS=${JOBS:-$(cd "$(dirname "$0")" && pwd)/jobs}
SLOT=${SLOT:-}  # a command prefix each benchmark runs under (e.g. a lock that keeps it alone), or none
export PATH=${VENV:-$(cd "$(dirname "$0")/../.." && pwd)/.venv}/bin:$PATH NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unset HPCDP_RANKS_PER_NODE
if [ "$QUICK" = 1 ]; then
  OV="--rounds 1 --iters 50"; CO="--repeats 1 --max-iters 20 --warmup 2"; STEPS=6
else
  OV="--rounds 5 --iters 200"; CO="--repeats 3 --max-iters 300"
fi
c() { git -C "$1" rev-parse --short HEAD 2>/dev/null || echo nogit; }
R=/tmp/speed/$(basename "$OLD")-$(c "$OLD")-$(basename "$NEW")-$(c "$NEW")-$(date -u +%H%M%S)
mkdir -p "$R"
T0=$SECONDS

runone() {  # runone LABEL TREE NAME cmd...   (json/metrics go under $R/LABEL/NAME-r$round)
  local label=$1 tree=$2 name=$3; shift 3
  local d="$R/$label/$name-r$round"; mkdir -p "$d"
  ( cd "$tree" && PYTHONPATH=$tree $SLOT env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
      timeout 300 "${@//@D@/$d}" ) >"$d/log" 2>&1 \
    || echo "speed.sh: $label $name round $round failed (rc $?): see $d/log" >&2
}

bench() {  # bench NAME cmd... : ROUNDS x (old, new)
  local name=$1; shift
  echo "$name" | grep -qE "$ONLY" || return 0
  for round in $(seq 1 "$ROUNDS"); do
    runone old "$OLD" "$name" "$@"
    runone new "$NEW" "$name" "$@"
  done
}

for C in allreduce reduce_scatter all_gather; do
  bench "overhead-$C" mpiexec -n 2 hpcdp bench comm-overhead --collective $C $OV --json @D@/out.json
done
bench coll-small mpiexec -n 2 hpcdp bench collectives --collective all --algorithms mpi,ring,auto \
  --min 8 --max 64K --factor 8192 $CO --json @D@/out.json
bench coll-large mpiexec -n 2 hpcdp bench collectives --collective all --algorithms mpi,ring,auto \
  --min 4M --max 64M --factor 16 $CO --json @D@/out.json
for J in gpt_ddp gpt_zero3; do
  bench "step-$J" mpiexec -n 2 hpcdp train --config "$JOBS/$J.toml" --set train.steps=$STEPS \
    --set run.eval_every=0 --set run.log_every=1000 --set 'run.out_dir="@D@/run"'
done

python3 - "$R" "$OLD" "$NEW" "$((SECONDS - T0))" <<'EOF' | tee ${OUTFILE:+"$OUTFILE"}
import glob, json, os, statistics, sys
R, old, new, secs = sys.argv[1:5]
def collect(label):
    s = {}
    for f in sorted(glob.glob(f"{R}/{label}/overhead-*/out.json")):
        d = json.load(open(f))
        for r in d["rows"]:
            s.setdefault(("overhead", d["meta"]["collective"], r["layer"]), []).extend(r["samples_us"])
    for f in sorted(glob.glob(f"{R}/{label}/coll-*/out.json"), reverse=True):  # small, then large
        for r in json.load(open(f))["rows"]:
            s.setdefault(("coll", r["collective"], r["size"], r["algorithm"]), []).extend(r["samples_us"])
    for f in sorted(glob.glob(f"{R}/{label}/step-*/run/metrics.jsonl")):
        job = f.split("/step-")[1].split("-r")[0]
        for line in open(f):
            try: rec = json.loads(line)
            except ValueError: continue
            if isinstance(rec, dict) and rec.get("step", 0) >= 3 and "step_time_s" in rec:
                s.setdefault(("step", job), []).append(rec["step_time_s"] * 1e3)
    return s
def human(n):
    for u in ("", "K", "M", "G"):
        if n < 1024: return f"{n}{u}"
        n //= 1024
    return f"{n}T"
def name(k):
    if k[0] == "coll": return f"coll {k[1]} {human(k[2])} {k[3]}"
    if k[0] == "step": return f"step {k[1]} (ms)"
    return f"overhead {k[1]} {k[2]}"
o, n = collect("old"), collect("new")
print(f"# speed.sh old={old} ({os.popen(f'git -C {old} rev-parse --short HEAD').read().strip()}) "
      f"new={new} ({os.popen(f'git -C {new} rev-parse --short HEAD').read().strip()}); raw {R}; {secs} s")
print(f"# {os.popen('date -u').read().strip()}; {os.popen('uptime').read().strip()}")
print(f"{'# key':58s} {'old':>11s} {'new':>11s} {'new/old':>8s}  n(old/new)")
worse = 0
for k in list(o) + [k for k in n if k not in o]:
    a, b = o.get(k), n.get(k)
    ma = statistics.median(a) if a else None
    mb = statistics.median(b) if b else None
    ratio = mb / ma if ma and mb else None
    flag = "*" if ratio and ratio > 1.05 else " "
    worse += flag == "*"
    f = lambda v: f"{v:11.2f}" if v is not None else f"{'-':>11s}"
    print(f"{name(k):58s} {f(ma)} {f(mb)} {(f'{ratio:8.3f}' if ratio else '       -')}{flag} {len(a or [])}/{len(b or [])}")
print(f"# {worse} key(s) with new/old > 1.05 (median us per call; step in ms)")
EOF
