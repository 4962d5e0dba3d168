#!/bin/bash
# Session 5, call B on nvidia-h200-x2, from a snapshot of the `cuda-graphs` branch (main + train.cuda_graphs
# with Megatron-LM's non-default stream, D20): the two torch-side levers of issue 7 not yet measured.
# GPU 0: the one-H200 spec at micro-batch 4, bf16 and FP8, each without and with CUDA graphs, side by side.
# GPU 1: the bare Megatron-Core loop on the local spec (no Transformer Engine) at micro-batch 4: eager,
#   torch.compile'd RoPE, torch.compile'd layers (benchmarks/bare_mcore.py --compile).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 555; tar czf $OUT/res_s5b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(
  one 0 te_mbs4_b 85
  one 0 te_graphs_mbs4 110 --set train.cuda_graphs=true
  one 0 te_fp8_mbs4_b 85 --fp8 hybrid
  one 0 te_fp8_graphs_mbs4 110 --fp8 hybrid --set train.cuda_graphs=true
) > $OUT/g0.log 2>&1 &
P0=$!
(
  for c in none rope layers; do
    CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/bare_mcore.py --spec $S --impl local --mbs 4 --steps 5 --warmup 3 \
      --compile $c --out /tmp/res/bare_local_mbs4_compile_$c.json > $OUT/bare_compile_$c.log 2>&1
    tail -n 2 $OUT/bare_compile_$c.log | cut -c1-600
  done
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_s5b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
