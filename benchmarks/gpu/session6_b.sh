#!/bin/bash
# Session 6, call B on nvidia-h200-x2, from the `fp8-param-gather` snapshot: NVIDIA's 744 TFLOP/s/GPU point
# (LLaMA-3 8B, FP8, sequence 8192) on the shipped two-GPU layout, data parallel 2 with the distributed
# optimizer. Session 3 ran it out of memory (planner: 134.7 GiB). FP8 primary weights plan 119.7 GiB;
# expandable segments keep the allocator's fragments from eating the rest. Gradients reduced in bf16.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 400; tar czf $OUT/res_s6b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
rm -f /tmp/res/*.json
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
two te_fp8pg_seq8192_dp2 170 --fp8 hybrid --seq 8192 --set train.grad_reduce_in_bf16=true --set train.fp8_param_gather=true
two te_fp8_seq8192_dp2 170 --fp8 hybrid --seq 8192 --set train.grad_reduce_in_bf16=true
tar czf $OUT/res_s6b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
