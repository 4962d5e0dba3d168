#!/bin/bash
# The GPU runs still to make after session 3 (docs/benchmarks.md, "GPU session 3"), call 1 of 2 on
# nvidia-h200-x2, one track per GPU. Timeouts sized from session 3's measurements: the SIGTERM case
# needs about 160 s (its own reference run and the stopped-and-resumed pair); a synchronous save of the
# one-H200 spec's 40 GB checkpoint about 68 s on that disk.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py; S=experiments/h200_1gpu.toml
(sleep 570; tar czf $OUT/res_next_a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(
  timeout 260 python3 $V faults --only sigterm --gpus 0 --out /tmp/res --timeout 200
  timeout 260 python3 $V ckpt-stall --gpus 0 --spec dense --steps 21 --every 5 --out /tmp/res --work-dir /tmp/gv0 --timeout 120
) > $OUT/g0.log 2>&1 &
P0=$!
(
  timeout 450 python3 $V ckpt-stall --gpus 1 --spec $S --steps 11 --every 5 --out /tmp/res/h200 --work-dir /tmp/gv1 --timeout 215
  CUDA_VISIBLE_DEVICES=1 timeout 90 python3 $T --spec $S --steps 5 --warmup 2 --timeout 85 --impl te --fp8 hybrid --mbs 4 \
    --set 'train.fp8_recipe="tensorwise"' --runners mcx --work-dir /tmp/w/ft4 --out /tmp/res/throughput_1gpu_te_fp8_tensorwise_mbs4.json
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_next_a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
