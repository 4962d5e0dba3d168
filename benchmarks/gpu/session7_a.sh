#!/bin/bash
# Session 7, call A on nvidia-h200-x2, from a snapshot of main: Transformer Engine's operation fuser for the
# MLP (train.te_op_fuser, D29) and Megatron-LM's amax defaults, against FP8 >= 1.35x bf16 on the one-H200 spec.
# GPU 0: FP8 at micro-batch 4 with and without the fuser; with a one-step amax history (Megatron-LM's default);
#   FP8 + fuser at micro-batch 8 (expandable segments).
# GPU 1: bf16 at micro-batch 4 with and without the fuser, then FP8 with and without it: ratios within one GPU.
# Then both GPUs: the smoke checks (checkpoint round trip, bitwise resume) of FP8 with the fuser on one GPU and
#   on DP 2 (the overlapped parameter gather's hooks), beside plain FP8.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 555; tar czf $OUT/res_s7a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
F=train.te_op_fuser=true
(
  one 0 te_fp8_fuser_mbs4 80 --fp8 hybrid --set $F
  one 0 te_fp8_mbs4 80 --fp8 hybrid
  one 0 te_fp8_hist1_mbs4 80 --fp8 hybrid --set train.fp8_amax_history_len=1 --set 'train.fp8_amax_compute_algo="most_recent"'
  one 0 te_fp8_fuser_mbs8_exp 100 --mbs 8 --fp8 hybrid --set $F --set train.expandable_segments=true
) > $OUT/g0.log 2>&1 &
P0=$!
(
  one 1 te_mbs4 80
  one 1 te_fuser_mbs4 80 --set $F
  one 1 te_fp8_fuser_mbs4_g1 80 --fp8 hybrid --set $F
  one 1 te_fp8_mbs4_g1 80 --fp8 hybrid
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
timeout 215 python3 $V layouts --gpus 0,1 --only fp8,fp8-fuser,fp8-fuser-dp2 --out /tmp/res --tag fuser --timeout 70 > $OUT/fuser.log 2>&1
tar czf $OUT/res_s7a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
