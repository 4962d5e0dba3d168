#!/bin/bash
# Issue 7's levers not yet measured, one call on nvidia-h200-x2 (after the five TE piece transfers).
# Two-GPU LLaMA-3 8B (DP 2, distributed optimizer, the fusions on): the spec's overlapped gradient
# reduce and parameter gather against neither, and bf16 gradient reduction; then on one GPU the cost
# of selective and full recomputation on the one-H200 spec.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
T=benchmarks/throughput.py; S=experiments/h200_1gpu.toml; S2=experiments/h200_2gpu.toml
(sleep 570; tar czf $OUT/res_next_c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
t2() {  # t2 NAME ARGS...: one two-GPU run of the 8B spec
  local name=$1; shift
  timeout 140 python3 $T --spec $S2 --gpus 2 --impl te --mbs 1 --steps 4 --warmup 2 --runners mcx --timeout 130 \
    --work-dir /tmp/w/$name --out /tmp/res/throughput_2gpu_$name.json "$@" 2>&1 | tail -n 2
}
t2 no_overlap --set parallel.overlap_grad_reduce=false --set parallel.overlap_param_gather=false > $OUT/c0.log
t2 bf16_reduce --set train.grad_reduce_in_bf16=true > $OUT/c1.log
(
  for r in selective full; do
    CUDA_VISIBLE_DEVICES=0 timeout 90 python3 $T --spec $S --steps 5 --warmup 2 --timeout 85 --impl te --mbs 2 --runners mcx \
      --set "train.recompute_granularity=\"$r\"" --work-dir /tmp/w/r_$r --out /tmp/res/throughput_1gpu_te_recompute_$r.json 2>&1 | tail -n 2
  done
) > $OUT/c2.log 2>&1
tar czf $OUT/res_next_c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
