#!/bin/bash
# The GPU runs still to make (see docs/benchmarks.md, "Not run on a GPU this session"), call 1 of 2
# on nvidia-h200-x2: one-GPU work, one track per GPU.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; S=experiments/h200_1gpu.toml
(sleep 560; tar czf $OUT/res_next_a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(
  timeout 330 python3 $V ckpt-stall --gpus 0 --spec $S --steps 21 --every 10 --out /tmp/res --timeout 320
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m mcx tune $S -o /tmp/res/h200_1gpu.tuned.toml --json > /tmp/res/tune.txt 2>&1
) > $OUT/g0.log 2>&1 &
P0=$!
(
  timeout 250 python3 $V layouts --gpus 1 --only det-1gpu,ref-moe --out /tmp/res --tag refs2 --timeout 120
  timeout 280 python3 $V faults --gpus 1 --out /tmp/res --timeout 90
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_next_a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
