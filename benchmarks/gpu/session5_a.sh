#!/bin/bash
# Session 5, call A on nvidia-h200-x2, after the five Transformer Engine piece transfers (prepared
# after session 4 as next_a.sh; docs/benchmarks.md, "GPU session 5").
# GPU 0: the checkpoint stall with saves 20 steps (7 s) apart, longer than one synchronous write
#   (2 s), so that no asynchronous save queues behind the previous one (D19).
# GPU 1: bf16 and FP8 side by side at micro-batch 4 and 8 on the one-H200 spec (FP8 against bf16
#   each at its best micro-batch; 8 is planned at about 122 GiB).
# Then both GPUs: EP 2 on Transformer Engine against its one-GPU reference.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 555; tar czf $OUT/res_s5a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(
  timeout 300 python3 $V ckpt-stall --gpus 0 --spec dense --steps 101 --every 20 --out /tmp/res --work-dir /tmp/gv0 --timeout 140
) > $OUT/g0.log 2>&1 &
P0=$!
(
  one 1 te_mbs4 85 --mbs 4
  one 1 te_fp8_mbs4 85 --mbs 4 --fp8 hybrid
  one 1 te_mbs8 100 --mbs 8
  one 1 te_fp8_mbs8 100 --mbs 8 --fp8 hybrid
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
timeout 250 python3 $V layouts --gpus 0,1 --only ref-moe,ep2 --out /tmp/res --tag ep --timeout 120 > $OUT/ep.log 2>&1
tar czf $OUT/res_s5a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
