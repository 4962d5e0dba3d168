#!/bin/bash
# Session 6, call A on nvidia-h200-x2, from a snapshot of the `fp8-param-gather` branch (next_a.sh of
# session 5, plus the checkpoint stall with the per-save phase lines).
# GPU 0: FP8 at micro-batch 4 without and with FP8 primary weights (train.fp8_param_gather), side by side,
#   then FP8 primary weights at micro-batch 8 with expandable segments (session 5: 52,218 tokens/s without them).
# GPU 1: bf16 at micro-batch 4 and 8 (expandable segments), the references for the ratio; then the
#   checkpoint stall (the write-results Manager now starts with the worker).
# Then both GPUs: the smoke checks of FP8 primary weights (checkpoint round trip, bitwise resume) on
#   one GPU and on DP 2 (distributed optimizer sharding the fp8 cast).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 560; tar czf $OUT/res_s6a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
EXP=expandable_segments:True
(
  one 0 te_fp8_mbs4 85 --fp8 hybrid
  one 0 te_fp8pg_mbs4 85 --fp8 hybrid --set train.fp8_param_gather=true
  (export PYTORCH_CUDA_ALLOC_CONF=$EXP; one 0 te_fp8pg_mbs8_exp 110 --mbs 8 --fp8 hybrid --set train.fp8_param_gather=true)
) > $OUT/g0.log 2>&1 &
P0=$!
(
  one 1 te_mbs4 85
  (export PYTORCH_CUDA_ALLOC_CONF=$EXP; one 1 te_mbs8_exp 110 --mbs 8)
  timeout 230 python3 $V ckpt-stall --gpus 1 --spec dense --steps 101 --every 20 --out /tmp/res --work-dir /tmp/gv1 --timeout 110 \
    > $OUT/ckpt.log 2>&1
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
timeout 200 python3 $V layouts --gpus 0,1 --only fp8pg,fp8pg-dp2 --out /tmp/res --tag fp8pg --timeout 95 > $OUT/fp8pg.log 2>&1
tar czf $OUT/res_s6a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
