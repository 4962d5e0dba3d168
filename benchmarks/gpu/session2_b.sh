#!/bin/bash
# Call B: `mcx run` of the one-GPU spec on GPU 0 beside the one-GPU layout references on GPU 1; then two-GPU layouts.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py
(sleep 565; tar czf $OUT/res_b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
timeout 290 python3 $V mcx-run --gpus 0 --out /tmp/res --tag 1gpu --timeout 285 -- experiments/h200_1gpu.toml --yes > $OUT/b0.log 2>&1 &
P0=$!
timeout 290 python3 $V layouts --gpus 1 --only ref,ref-local,ref-moe,ref-long,det-1gpu --out /tmp/res --tag refs --timeout 60 > $OUT/b1.log 2>&1 &
P1=$!
wait $P0 $P1
timeout 230 python3 $V layouts --gpus 0,1 --only dp2,tp2-sp,det-dp2 --out /tmp/res --tag b --timeout 55 > $OUT/b2.log 2>&1
tar czf $OUT/res_b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
