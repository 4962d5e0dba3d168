#!/bin/bash
# Session 7, call F on nvidia-h200 (one GPU), from a snapshot of 885682c (branch ckpt-rehearsal): the checkpoint writer's copy rehearsal
# (D30), with the 4.6 minutes of device time that were left. No Transformer Engine (its five piece transfers
# would not fit): the layout runs' model on the local spec.
# 1. Smoke checks with asynchronous saves (the rehearsal runs after step 1; round trip and bitwise resume after it).
# 2. The checkpoint stall, synchronous against asynchronous, saves at steps 20 and 40.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/res
(sleep 205; tar czf $OUT/res_s7f.tgz -C /tmp/res .) &
V=benchmarks/gpu_validation.py
L='model.transformer_impl="local"'
timeout 75 python3 $V layouts --gpus 0 --only ref-local --set checkpoint.async_save=true --out /tmp/res --tag rehearsal \
  --work-dir /tmp/gv --timeout 70 > $OUT/layout.log 2>&1
grep -h "smoke check\|prepared\|paused" /tmp/gv/layouts/ref-local/*.log 2>/dev/null | cut -c1-200 | tail -8
timeout 130 python3 $V ckpt-stall --gpus 0 --spec dense --steps 41 --every 20 --set "$L" --out /tmp/res --work-dir /tmp/gv \
  --timeout 62 > $OUT/ckpt.log 2>&1
tail -n 4 $OUT/ckpt.log
tar czf $OUT/res_s7f.tgz -C /tmp/res .
