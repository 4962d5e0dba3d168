#!/bin/bash
# Session 7, call B on nvidia-h200-x2, from a snapshot of main: the 8B point (sequence 8192, DP 2) with both GPUs.
# 1. The shipped FP8 recipe (experiments/h200_2gpu_fp8.toml), then the same with train.te_op_fuser.
# 2. bf16 at the same point (gradients reduced in bf16, expandable segments): the FP8 ratio there.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 555; tar czf $OUT/res_s7b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
fp8spec() {  # fp8spec NAME ARGS...: the FP8 recipe on both GPUs
  local name=$1; shift
  timeout 175 python3 $T --spec experiments/h200_2gpu_fp8.toml --gpus 2 --impl te --steps 4 --warmup 2 --runners mcx \
    --timeout 170 --work-dir /tmp/w/$name --out /tmp/res/throughput_2gpu_$name.json "$@" > $OUT/$name.log 2>&1
  tail -n 2 $OUT/$name.log; rm -rf /tmp/w/$name; pkill -9 -f mcx.train; sleep 2
}
fp8spec fp8spec
fp8spec fp8spec_fuser --set train.te_op_fuser=true
two te_bf16_seq8192_dp2 170 --fp8 none --seq 8192 --set train.grad_reduce_in_bf16=true --set train.expandable_segments=true
tar czf $OUT/res_s7b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
