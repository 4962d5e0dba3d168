#!/bin/bash
# Prepared after session 6, not yet run: one call on nvidia-h200-x2 after the five Transformer Engine piece
# transfers, from a snapshot of main.
# 1. FP8 against bf16 at the 8B point (sequence 8192, DP 2, gradients reduced in bf16, expandable segments):
#    the shipped FP8 recipe (794.7 TFLOP/s/GPU in session 6), then the same in bf16, on the same two GPUs.
# 2. `mcx tune` of the one-H200 spec on Transformer Engine up to micro-batch 8 on GPU 0: micro-batch 8 ran
#    out of memory from fragments in session 5, so the sweep should run it again with
#    train.expandable_segments and write that key into the tuned spec (D27; tested on CPU only).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 560; tar czf $OUT/res_next_a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
timeout 175 python3 $T --spec experiments/h200_2gpu_fp8.toml --gpus 2 --impl te --steps 4 --warmup 2 --runners mcx \
  --timeout 170 --work-dir /tmp/w/fp8spec --out /tmp/res/throughput_2gpu_fp8spec.json > $OUT/fp8spec.log 2>&1
tail -n 2 $OUT/fp8spec.log; rm -rf /tmp/w/fp8spec; pkill -9 -f mcx.train; sleep 2
two te_bf16_seq8192_dp2 170 --fp8 none --seq 8192 --set train.grad_reduce_in_bf16=true --set train.expandable_segments=true
CUDA_VISIBLE_DEVICES=0 timeout 320 python3 -m mcx tune $S --set 'model.transformer_impl="transformer_engine"' \
  --max-micro-batch 8 --steps 4 -o /tmp/res/h200_1gpu.tuned.toml --json > $OUT/tune.log 2>&1
tail -n 1 $OUT/tune.log > /tmp/res/tune.json; cat /tmp/res/h200_1gpu.tuned.toml
tar czf $OUT/res_next_a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
