#!/bin/bash
# Session 8, call C on nvidia-h200 (one GPU), from a shallow clone of main, with Transformer Engine (pieces sent
# before as .te0-.te4): the checkpoint stall on the Transformer Engine spec of the layout runs' model, as in
# sessions 5 and 6, with the writer started with the stage, the results queue warmed up and the rehearsed first
# copy (D30, D31). Saves at 20, 40, .., 100 (as sessions 5-6), then at 40, 80, 120.
cd "$(dirname "$0")/../.."
source benchmarks/gpu/prelude.sh
(sleep 560; tar czf $OUT/res_s8c.tgz -C /tmp/res .) &
stall() {  # stall NAME STEPS EVERY: one ckpt-stall run of the small dense model, Transformer Engine spec
  local name=$1 steps=$2 every=$3
  timeout 270 python3 $V ckpt-stall --gpus 0 --spec dense --steps $steps --every $every --out /tmp/res/$name \
    --work-dir /tmp/gv_$name --timeout 125 > $OUT/$name.log 2>&1
  tail -n 1 $OUT/$name.log
  for m in sync async; do
    grep -h "paused training\|in the writer\|prepared\|queue ready\|INFO mcx.train: stage " \
      /tmp/gv_$name/ckptstall/$m/worker.log 2>/dev/null | cut -c12-300
  done
}
stall te_every20 101 20
stall te_every40 121 40
tar czf $OUT/res_s8c.tgz -C /tmp/res .
