#!/bin/bash
# Session 6, call D on nvidia-h200-x2 (as run, the command given inline to the device tool from the snapshot
# root): the shipped FP8 spec end to end, `mcx run` with its smoke stage (FP8 checkpoint round trip and
# bitwise resume on two GPUs) and the 50-step full stage. The machine has no MLflow or DVC: the tracking
# records stay in the run's journal (`mcx sync` sends them).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh >/dev/null 2>&1
(sleep 470; tar czf $OUT/res_s6d.tgz -C /tmp/res6d . 2>/dev/null) &
mkdir -p /tmp/res6d
timeout 460 python3 benchmarks/gpu_validation.py mcx-run --gpus 0,1 --out /tmp/res6d --timeout 450 -- \
  experiments/h200_2gpu_fp8.toml --yes > $OUT/mcxrun.log 2>&1
echo rc=$?; tail -c 3000 $OUT/mcxrun.log
tar czf $OUT/res_s6d.tgz -C /tmp/res6d .
