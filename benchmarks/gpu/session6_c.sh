#!/bin/bash
# Session 6, call C on nvidia-h200-x2, from the `fp8-param-gather` snapshot rebased on main (a38ed1f: FP8
# checkpoints load under TE 2.20, train.expandable_segments, experiments/h200_2gpu_fp8.toml).
# GPU 0: the smoke checks of FP8 (delayed scaling; call A found TE refusing its pickled state at the load)
#   and of FP8 primary weights. GPU 1 at the same time: the checkpoint stall again (a second sample).
# Then both GPUs: FP8 on DP 2, and the shipped FP8 spec at sequence 8192 (expandable segments from the spec).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 545; tar czf $OUT/res_s6c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
rm -f /tmp/res/*.json
timeout 250 python3 $V layouts --gpus 0 --only fp8,fp8pg --out /tmp/res --tag fp8 --timeout 120 --work-dir /tmp/gv0 \
  > $OUT/fp8.log 2>&1 &
P0=$!
timeout 250 python3 $V ckpt-stall --gpus 1 --spec dense --steps 101 --every 20 --out /tmp/res --work-dir /tmp/gv1 --timeout 120 \
  > $OUT/ckpt.log 2>&1 &
P1=$!
wait $P0 $P1
timeout 125 python3 $V layouts --gpus 0,1 --only fp8-dp2 --out /tmp/res --tag fp8dp2 --timeout 120 --work-dir /tmp/gv2 \
  > $OUT/fp8dp2.log 2>&1
timeout 175 python3 $T --spec experiments/h200_2gpu_fp8.toml --gpus 2 --impl te --steps 4 --warmup 2 --runners mcx \
  --timeout 170 --work-dir /tmp/w/fp8spec --out /tmp/res/throughput_2gpu_fp8spec.json > $OUT/fp8spec.log 2>&1
tail -n 2 $OUT/fp8spec.log
tar czf $OUT/res_s6c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
