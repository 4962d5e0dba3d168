#!/bin/bash
# Call C: `mcx run` of the full LLaMA-3 8B on two GPUs (torchrun, DP 2); then the other two-GPU layouts.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py
(sleep 520; tar czf $OUT/res_c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
timeout 320 python3 $V mcx-run --gpus 0,1 --out /tmp/res --tag 2gpu --timeout 315 -- experiments/h200_2gpu.toml --yes > $OUT/c0.log 2>&1
timeout 190 python3 $V layouts --gpus 0,1 --only cp2-16k,pp2-vpp2,ep2,pp2 --out /tmp/res --tag c --timeout 55 > $OUT/c1.log 2>&1
tar czf $OUT/res_c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
