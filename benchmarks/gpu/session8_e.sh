#!/bin/bash
# Session 8, call E on nvidia-h200 (one GPU), from a shallow clone of main, with Transformer Engine: call D again
# (saves at 40, 80, 120 on the Transformer Engine spec) with pruned checkpoints deleted in the background and the
# asynchronous saves' finalization timed (its own log line).
cd "$(dirname "$0")/../.."
source benchmarks/gpu/prelude.sh
(sleep 215; tar czf $OUT/res_s8e.tgz -C /tmp/res .; cp /tmp/gv/ckptstall/*/worker.log $OUT/ 2>/dev/null) &
timeout 225 python3 $V ckpt-stall --gpus 0 --spec dense --steps 121 --every 40 --out /tmp/res/te_every40 \
  --work-dir /tmp/gv --timeout 100 > $OUT/te_every40.log 2>&1
tail -n 1 $OUT/te_every40.log
python3 -c "
import json; d = json.load(open('/tmp/res/te_every40/ckpt_stall.json'))
for m in ('sync', 'async'):
    r = d[m]; print(m, [round(x, 2) for x in r['save_step_excess_s']], round(r['other_steps_excess_s'], 2), r['largest_other_excess'])"
for m in sync async; do grep -h "paused training\|in the writer\|prepared\|queue ready\|finalized\|committed" /tmp/gv/ckptstall/$m/worker.log | cut -c12-250; done
tar czf $OUT/res_s8e.tgz -C /tmp/res .
