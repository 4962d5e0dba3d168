#!/bin/bash
# Session 3, call C on nvidia-h200-x2: the SIGTERM fault case (call A ran out of time after SIGKILL)
# on GPU 0; on GPU 1 the layout reference with the fusions on (session 2, fusions off: 5.9572) and
# FP8 with current (tensorwise) scaling at micro-batch 4.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py; S=experiments/h200_1gpu.toml
(sleep 330; tar czf $OUT/res_s3c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(timeout 300 python3 $V faults --only sigterm --gpus 0 --out /tmp/res --timeout 140 > $OUT/c0.log 2>&1) &
P0=$!
(
  timeout 150 python3 $V layouts --gpus 1 --only ref --out /tmp/res --tag fused --timeout 140
  CUDA_VISIBLE_DEVICES=1 timeout 80 python3 $T --spec $S --steps 5 --warmup 2 --timeout 75 --impl te --fp8 hybrid --mbs 4 \
    --set 'train.fp8_recipe="tensorwise"' --runners mcx --work-dir /tmp/w/ft4 --out /tmp/res/throughput_1gpu_te_fp8_tensorwise_mbs4.json 2>&1 | tail -n 2
) > $OUT/c1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_s3c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 7000
