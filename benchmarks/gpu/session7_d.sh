#!/bin/bash
# Session 7, call D on nvidia-h200-x2, from a snapshot of main: FP8 against bf16 on the one-H200 spec once more on
# both GPUs, in the opposite order on each, to see how far the call-to-call spread moves the ratio.
# GPU 0: micro-batch 4, with the fused MLP (train.te_op_fuser) and without, bf16 first.
# GPU 1: with the fused MLP, FP8 first, at micro-batch 4 and 8 (expandable segments).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
rm -rf /tmp/res/*; mkdir -p /tmp/res
(sleep 555; tar czf $OUT/res_s7d.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
F=train.te_op_fuser=true; X=train.expandable_segments=true
(
  one 0 te_fuser_mbs4_g0 80 --set $F
  one 0 te_fp8_fuser_mbs4_g0 80 --fp8 hybrid --set $F
  one 0 te_mbs4_g0 80
  one 0 te_fp8_mbs4_g0 80 --fp8 hybrid
) > $OUT/g0.log 2>&1 &
P0=$!
(
  one 1 te_fp8_fuser_mbs4_g1 80 --fp8 hybrid --set $F
  one 1 te_fuser_mbs4_g1 80 --set $F
  one 1 te_fp8_fuser_mbs8_exp_g1 100 --mbs 8 --fp8 hybrid --set $F --set $X
  one 1 te_fuser_mbs8_exp_g1 100 --mbs 8 --set $F --set $X
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_s7d.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | grep "^==\|mcx:" | cut -c1-120
