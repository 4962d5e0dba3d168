#!/bin/bash
# Session 3, call B on nvidia-h200-x2. Phase 1, one track per GPU: `mcx tune` of the one-H200 spec
# then the local spec with the fusions at micro-batch 2 (GPU 0); the async-checkpoint stall (GPU 1).
# Phase 2: the two-GPU LLaMA-3 8B spec (DP 2, distributed optimizer) with the fusions, bf16 at
# seq 4096 and FP8 at seq 8192 (bf16 gradient reduction, so that it fits).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py; S=experiments/h200_1gpu.toml; S2=experiments/h200_2gpu.toml
(sleep 570; tar czf $OUT/res_s3b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(
  CUDA_VISIBLE_DEVICES=0 timeout 160 python3 -m mcx tune $S --max-micro-batch 4 --steps 3 -o /tmp/res/h200_1gpu.tuned.toml --json > /tmp/res/tune.txt 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 75 python3 $T --spec $S --steps 5 --warmup 2 --timeout 70 --impl local --mbs 2 --runners mcx \
    --work-dir /tmp/w/lf2 --out /tmp/res/throughput_1gpu_local_fused.json 2>&1 | tail -n 2
) > $OUT/b0.log 2>&1 &
PT=$!
(timeout 235 python3 $V ckpt-stall --gpus 1 --spec $S --steps 16 --every 5 --out /tmp/res --timeout 110 > $OUT/b1.log 2>&1) &
PC=$!
wait $PT $PC
rm -rf /tmp/mcx-gpu-validation/ckptstall /tmp/w
timeout 150 python3 $T --spec $S2 --gpus 2 --impl te --mbs 1 --steps 4 --warmup 2 --runners mcx --timeout 140 \
  --work-dir /tmp/w/b16 --out /tmp/res/throughput_2gpu_te_fused.json > $OUT/b2.log 2>&1
timeout 170 python3 $T --spec $S2 --gpus 2 --impl te --fp8 hybrid --seq 8192 --mbs 1 --steps 4 --warmup 2 --runners mcx \
  --set train.grad_reduce_in_bf16=true --timeout 160 --work-dir /tmp/w/f88 --out /tmp/res/throughput_2gpu_te_fp8_seq8192.json > $OUT/b3.log 2>&1
tar czf $OUT/res_s3b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 7000; tail -c 1500 /tmp/res/tune.txt
