#!/bin/bash
# Session 7, call C on nvidia-h200-x2, from a snapshot of main.
# GPU 0: `mcx tune` of the one-H200 spec on Transformer Engine up to micro-batch 8: micro-batch 8 ran out of memory
#   from fragments in session 5, so the sweep should run it again with train.expandable_segments and write that key
#   into the tuned spec (D27; until now tested on CPU only).
# GPU 1: each precision at its best settings, with the fused MLP (train.te_op_fuser): bf16 and FP8 at micro-batch 4
#   and 8 (expandable segments), for FP8 >= 1.35x bf16 on one GPU's track.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
rm -rf /tmp/res/*; mkdir -p /tmp/res
(sleep 555; tar czf $OUT/res_s7c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
F=train.te_op_fuser=true; X=train.expandable_segments=true
(
  CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m mcx tune $S --set 'model.transformer_impl="transformer_engine"' \
    --max-micro-batch 8 --steps 4 -o /tmp/res/h200_1gpu.tuned.toml --json > $OUT/tune.log 2>&1
  tail -n 1 $OUT/tune.log > /tmp/res/tune.json; cat /tmp/res/h200_1gpu.tuned.toml
) > $OUT/g0.log 2>&1 &
P0=$!
(
  one 1 te_fuser_mbs4 80 --set $F
  one 1 te_fp8_fuser_mbs4 80 --fp8 hybrid --set $F
  one 1 te_fuser_mbs8_exp 100 --mbs 8 --set $F --set $X
  one 1 te_fp8_fuser_mbs8_exp 100 --mbs 8 --fp8 hybrid --set $F --set $X
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_s7c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
