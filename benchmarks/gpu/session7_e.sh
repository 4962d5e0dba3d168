#!/bin/bash
# Session 7, call E on nvidia-h200-x2, from a snapshot of main: `mcx run` of the shipped FP8 recipe, now with the
# fused MLP (train.te_op_fuser): smoke stage on two GPUs (checkpoint round trip, bitwise resume), then the full
# stage. mlflow and dvc are not on the GPU machine: records stay in the run's journal (`mcx sync` sends them).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh >/dev/null 2>&1
(sleep 470; tar czf $OUT/res_s7e.tgz -C /tmp/res7e . 2>/dev/null) &
mkdir -p /tmp/res7e
timeout 460 python3 benchmarks/gpu_validation.py mcx-run --gpus 0,1 --out /tmp/res7e --timeout 450 -- \
  experiments/h200_2gpu_fp8.toml --yes > $OUT/mcxrun.log 2>&1
echo rc=$?; tail -c 3000 $OUT/mcxrun.log
tar czf $OUT/res_s7e.tgz -C /tmp/res7e .
