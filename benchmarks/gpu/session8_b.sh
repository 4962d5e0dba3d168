#!/bin/bash
# Session 8, call B on nvidia-h200 (one GPU), from a shallow clone of main: the writer started with the stage
# and the rehearsed first copy (D30, D31), and where a process's first save goes. No Transformer Engine: the
# layout runs' model on the local spec, as call A.
# 1. first_save.py: one rank's 1316 MiB in 212 tensors saved four times, the first two profiled.
# 2. ckpt-stall, synchronous and asynchronous: saves at 20, 40, .., 100 (as call A), then at 40, 80, 120.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/res
(sleep 560; tar czf $OUT/res_s8b.tgz -C /tmp/res .) &
timeout 90 python3 benchmarks/first_save.py --mib 1316 --tensors 212 --dir /tmp/fs --out /tmp/res/first_save.json 2>&1 \
  | grep -v Warning | cut -c1-230 | tail -32
stall() {  # stall NAME STEPS EVERY: one ckpt-stall run of the small dense model, local spec
  local name=$1 steps=$2 every=$3
  timeout 250 python3 benchmarks/gpu_validation.py ckpt-stall --gpus 0 --spec dense --steps $steps --every $every \
    --set 'model.transformer_impl="local"' --out /tmp/res/$name --work-dir /tmp/gv_$name --timeout 115 > $OUT/$name.log 2>&1
  tail -n 1 $OUT/$name.log
  for m in sync async; do
    grep -h "paused training\|in the writer\|prepared\|INFO mcx.train: stage \|built:" /tmp/gv_$name/ckptstall/$m/worker.log 2>/dev/null | cut -c1-330
  done
}
stall every20 101 20
stall every40 121 40
tar czf $OUT/res_s8b.tgz -C /tmp/res .
