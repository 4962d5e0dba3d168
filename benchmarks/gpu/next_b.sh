#!/bin/bash
# The GPU runs still to make after session 3, call 2 of 2 on nvidia-h200-x2: FP8 LLaMA-3 8B at
# sequence 8192 on tensor parallel 2 + sequence parallel (data parallel 2 does not fit: session 3),
# then EP 2 on Transformer Engine against its one-GPU reference.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py
(sleep 570; tar czf $OUT/res_next_b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
timeout 200 python3 $T --spec experiments/h200_2gpu.toml --gpus 2 --impl te --fp8 hybrid --seq 8192 --mbs 1 --steps 4 --warmup 2 \
  --set parallel.tensor=2 --set parallel.sequence_parallel=true --runners mcx --timeout 190 --work-dir /tmp/w/f88 \
  --out /tmp/res/throughput_2gpu_te_fp8_seq8192_tp2.json > $OUT/n0.log 2>&1
timeout 330 python3 $V layouts --gpus 0,1 --only ref-moe,ep2 --out /tmp/res --tag ep --timeout 160 > $OUT/n1.log 2>&1
tar czf $OUT/res_next_b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
