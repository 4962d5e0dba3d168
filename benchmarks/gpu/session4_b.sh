#!/bin/bash
# Session 4, call B on nvidia-h200-x2: the full LLaMA-3 8B on both GPUs.
# FP8 (hybrid, delayed) at sequence length 8192 (NVIDIA's 744 TFLOP/s/GPU point) on context parallel 2
# (NVIDIA's own layout for it) and on tensor parallel 2 + sequence parallel; then the two-GPU spec's
# levers: overlapped gradient reduce and parameter gather against neither, bf16 gradient reduction;
# last, FP8 attention at 8192 on context parallel 2.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 555; tar czf $OUT/res_s4b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
two te_fp8_seq8192_cp2 150 --fp8 hybrid --seq 8192 --set parallel.context=2
two te_fp8_seq8192_tp2sp 150 --fp8 hybrid --seq 8192 --set parallel.tensor=2 --set parallel.sequence_parallel=true
two te_no_overlap 120 --set parallel.overlap_grad_reduce=false --set parallel.overlap_param_gather=false
two te_bf16_reduce 120 --set train.grad_reduce_in_bf16=true
two te_fp8attn_seq8192_cp2 150 --fp8 hybrid --seq 8192 --set parallel.context=2 --set train.fp8_attention=true
tar czf $OUT/res_s4b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
