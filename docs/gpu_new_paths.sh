#!/bin/bash
# CUDA beside CPU, path by path (docs/results.md, "On a GPU"): the policies of the acceptance script (exact, bns,
# psc, dgs, fp16, int8 with feedback, SANCUS, GAT), and the paths added after the H100 acceptance: train --grid (2D
# and 3D, a compressed grid), layer 0's narrow exact wire (--input-exchange once), int4/int2/adaptive codes, psc with
# the guard's bias reference, pipe with its heralds, mini-batch (and its feature pulls on the narrow wire),
# --policy auto. Cora, --dropout $DROPOUT (0.5 unless given; GAT 0.6): both devices draw the same dropout masks
# (algorithms/dropout.py), so each configuration's CUDA and CPU run, side by side, are one computation; the check:
# test accuracy within 0.5 point and every epoch's loss within 1e-3 relative (--policy auto excepted: it chooses
# from measured rates, so only that both end).
# On the GPU machine, from the repository root, after ../shared/gpu/device-setup.sh:  bash docs/gpu_new_paths.sh
# (DEV=cpu runs both sides on the CPU). Logs and results files go to $OUT (or /tmp/acceptance).
set -u
O=${OUT:-/tmp/acceptance}; mkdir -p "$O/new"; D=/tmp/acc-data; mkdir -p "$D"
DEV=${DEV:-cuda}
EPOCHS=${EPOCHS:-60}
DROPOUT=${DROPOUT:-0.5}
[ -d "$D/cora" ] || sparse-dist prepare planetoid --out "$D/cora" --parts 4 > "$O/new/prepare.log" 2>&1
CONFIGS=("exact:2:" "bns:2:--sample bns:keep=0.1" "psc:2:--sample psc:budget=0.1" "dgs:2:--sample dgs:nodes=0.5"
         "fp16:2:--compress fp16" "int8:2:--compress int8,feedback" "sancus:2:--plan dense-bcast --stale sancus-e:eps=1"
         "gat:2:--layer-kind gat --heads 8 --hidden 8 --dropout 0.6"
         "grid2:2:--grid 2,1,1" "grid4:4:--grid 2,2,1" "grid8:8:--grid 2,2,2" "grid4int4:4:--grid 1,2,2 --compress int4"
         "once:2:--input-exchange once" "int4:2:--compress int4" "int2:2:--compress int2"
         "adaptive:2:--compress adaptive" "pscbias:2:--sample psc:budget=0.1 --audit-every 5"
         "pipe:2:--stale pipe:tau=1" "minibatch:2:--mode minibatch --layer-kind sage --fanouts 10,10 --batch-size 64"
         "auto:2:--policy auto")
launch() {  # launch NAME SIDE RANKS DEVICE FLAGS...: one run in the background, its log and results file under $O/new
  local name=$1 side=$2 ranks=$3 dev=$4; shift 4
  timeout 240 mpiexec -n "$ranks" sparse-dist train --data "$D/cora" --device "$dev" --threads 1 --epochs "$EPOCHS" \
    --dropout "$DROPOUT" "$@" --out "$O/new/$name-$side.jsonl" > "$O/new/$name-$side.log" 2>&1 < /dev/null &
}
batch=0
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name ranks flags <<< "$cfg"
  launch "$name" dev "$ranks" "$DEV" $flags
  launch "$name" cpu "$ranks" cpu $flags
  batch=$((batch + 1)); [ $((batch % 3)) -eq 0 ] && wait
done
wait
python3 - "$O/new" "$DEV" <<'PY' | tee "$O/new-paths.txt"
import json, pathlib, sys
o, dev = pathlib.Path(sys.argv[1]), sys.argv[2]
def records(p):
    try: return [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
    except OSError: return []
bad = 0
for log in sorted(o.glob("*-dev.log")):
    name = log.name[: -len("-dev.log")]
    a, b = records(o / f"{name}-dev.jsonl"), records(o / f"{name}-cpu.jsonl")
    fa = next((r for r in a if r.get("type") == "final"), None); fb = next((r for r in b if r.get("type") == "final"), None)
    if not fa or not fb:
        bad += 1; print(f"{name:>10}: FAILED (no final record on {'cpu' if fa else dev})"); continue
    la = [r["loss"] for r in a if r.get("type") == "epoch"]; lb = [r["loss"] for r in b if r.get("type") == "epoch"]
    worst = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(la, lb)), default=float("nan"))
    acc = abs(fa["test_acc"] - fb["test_acc"])
    ok = name == "auto" or (acc <= 0.005 and worst <= 1e-3 and len(la) == len(lb))
    bad += not ok
    print(f"{name:>10}: test acc {dev} {fa['test_acc']:.4f} cpu {fb['test_acc']:.4f}, epochs {len(la)}/{len(lb)}, "
          f"worst loss rel diff {worst:.2e} {'ok' if ok else 'DIFFERS'}")
print(f"paths: {bad} of {len(list(o.glob('*-dev.log')))} differ or failed")
PY
