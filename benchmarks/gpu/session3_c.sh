#!/bin/bash
# Session 3, call C on nvidia-h200-x2 (what calls A and B could not finish). Phase 1: the SIGTERM
# fault case on GPU 0; the async-checkpoint stall of the layout runs' small model on GPU 1 (the
# one-H200 spec's 40 GB saves took 68 s each on this disk), then the layout reference with the fusions.
# Phase 2: the two-GPU LLaMA-3 8B spec with the fusions (call B's run met a leftover async-save process).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py
(sleep 440; tar czf $OUT/res_s3c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(timeout 170 python3 $V faults --only sigterm --gpus 0 --out /tmp/res --timeout 150 > $OUT/c0.log 2>&1) &
P0=$!
(
  timeout 110 python3 $V ckpt-stall --gpus 1 --spec dense --steps 21 --every 5 --out /tmp/res --timeout 50
  timeout 55 python3 $V layouts --gpus 1 --only ref --out /tmp/res --tag fused --timeout 50
) > $OUT/c1.log 2>&1 &
P1=$!
wait $P0 $P1
pkill -9 -f "mcx.train" ; sleep 3; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
timeout 170 python3 $T --spec experiments/h200_2gpu.toml --gpus 2 --impl te --mbs 1 --steps 4 --warmup 2 --runners mcx --timeout 160 \
  --work-dir /tmp/w/b16 --out /tmp/res/throughput_2gpu_te_fused.json > $OUT/c2.log 2>&1
tar czf $OUT/res_s3c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 7000
