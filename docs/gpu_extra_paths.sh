#!/bin/bash
# Paths ../shared/gpu/acceptance.sh does not reach, Cora at P = 2 on CUDA beside the same run on CPU: the cover
# plan (GCN, SAGE), 1.5D replication, mini-batch SAGE with prefetch. On the GPU machine, from the repository root,
# after ../shared/gpu/device-setup.sh:  bash docs/gpu_extra_paths.sh   (DEV=cpu runs both sides on the CPU).
# One "== NAME: ok|FAILED" line each; logs and results files go to $OUT (or /tmp/acceptance).
set -u
O=${OUT:-/tmp/acceptance}; mkdir -p "$O"; D=/tmp/acc-data; mkdir -p "$D"
DEV=${DEV:-cuda}
[ -d "$D/cora" ] || sparse-dist prepare planetoid --out "$D/cora" --parts 4 > "$O/prepare-extra.log" 2>&1
for cfg in "cover:--plan cover" "sagecover:--plan cover --layer-kind sage" "repl2:--replication 2 --plan dense-bcast" \
           "mbprefetch:--mode minibatch --layer-kind sage --fanouts 10,10 --batch-size 64 --prefetch 2"; do
  name=${cfg%%:*}; flags=${cfg#*:}
  for dev in $DEV cpu; do
    t0=$SECONDS
    if timeout 120 mpiexec -n 2 sparse-dist train --data "$D/cora" --device $dev --epochs 200 $flags \
        --out "$O/cora-$name-$dev.jsonl" > "$O/cora-$name-$dev.log" 2>&1 < /dev/null; then echo "== cora-$name-$dev: ok ($((SECONDS - t0)) s)"
    else echo "== cora-$name-$dev: FAILED ($((SECONDS - t0)) s)"; tail -3 "$O/cora-$name-$dev.log"; fi
  done
done
